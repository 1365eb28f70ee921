"""Where blocks run: in this process, in order, or as one task per block on a Dask cluster.

The executor knows nothing of images or models: it runs :func:`features.executors.extract.run_block` for
each :class:`~features.executors.extract.BlockTask` with a mapper taken from a per-process cache, so a
Dask worker loads the model once and reuses it for every block it is given.

``--scheduler none``: in-process (:mod:`features.executors.in_process`: a reader, the network and a writer
thread). ``local``: a ``LocalCluster`` of ``--workers`` processes, one task at a time each (the mapper's torch
threads are ``--threads``, set by the mapper itself; with GPUs, each worker pinned to one). ``tcp://HOST:PORT``:
a running ``dask scheduler`` whose workers see the store's path on a shared filesystem (both
:mod:`features.executors.dask_cluster`). Inside a block the mapper runs a few images at a time and the rows
are committed in pieces (:mod:`features.executors.mapping`, :mod:`features.executors.pieces`).

A worker that dies mid-task is handled by the scheduler: it reschedules the task on another
worker (up to ``distributed.scheduler.allowed-failures`` times). A rerun block is written again
in full before its flag is set, and a block whose flag is already set is skipped, so rows are
neither lost nor duplicated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from features.executors.dask_cluster import DaskExecutor, open_dask
from features.executors.in_process import InProcessExecutor
from vsecore.errors import UserError


def check_scheduler(scheduler: str, workers: int = 2) -> None:
    """A :class:`UserError` for a ``--scheduler`` / ``--workers`` value that cannot work."""
    if scheduler in ("none", "local") or scheduler.startswith(("tcp://", "tls://", "inproc://")):
        if scheduler == "local" and workers < 1:
            raise UserError(f"--workers must be at least 1, got {workers}")
        return
    raise UserError(f"--scheduler must be none, local or a scheduler address tcp://HOST:PORT, "
                    f"got '{scheduler}'")


@contextlib.contextmanager
def open_executor(scheduler: str = "none", workers: int = 2, devices: Sequence[str] | None = None,
                  decode_threads: int | None = None, read_ahead: int = 1
                  ) -> Iterator[InProcessExecutor | DaskExecutor]:
    """The executor for ``--scheduler none|local|tcp://HOST:PORT``; closes what it started.

    ``devices``: the GPUs the workers of ``local`` are pinned to (one each, round robin; see
    :func:`features.executors.dask_cluster.pinned_workers`); ``decode_threads`` and ``read_ahead``: the
    in-process reader's (:class:`InProcessExecutor`).
    """
    check_scheduler(scheduler, workers)
    if scheduler == "none":
        yield InProcessExecutor(decode_threads, read_ahead)
        return
    with open_dask(scheduler, workers, devices if scheduler == "local" else None) as executor:
        yield executor
