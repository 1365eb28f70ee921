"""The Dask executor: one task per block on a ``distributed`` cluster, a ``LocalCluster`` of ``--workers``
processes or a running ``dask scheduler`` (``tcp://HOST:PORT``) whose workers share the store's filesystem.
On a machine with GPUs, the local workers are pinned one per device (several share a device when there are
more workers than devices): ``CUDA_VISIBLE_DEVICES`` and a ``GPU`` resource each.

A worker loads the mapper once (:func:`features.executors.extract.cached_mapper`) and reuses it for every
block it is given. A worker that dies mid-task is handled by the scheduler, which reschedules the task on
another worker; a block whose flag is already set is skipped, so rows are neither lost nor duplicated.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from features.executors.extract import BlockResult, BlockTask, MapperFactory, compute_block
from vsecore.errors import UserError


class DaskExecutor:
    """One Dask task per block on a ``distributed`` client (a local or a remote cluster).

    When the cluster's workers hold a ``GPU`` resource (one worker per device: :func:`open_dask`'s
    ``devices``, or ``dask worker --resources GPU=1`` pinned with ``CUDA_VISIBLE_DEVICES``), every task asks
    for one, so a worker runs one block at a time on its own device.
    """

    def __init__(self, client: Any) -> None:
        self.client = client

    def resources(self) -> dict[str, int] | None:
        """``{"GPU": 1}`` when a worker of the cluster holds a ``GPU`` resource, else None."""
        workers = self.client.scheduler_info().get("workers", {})
        return {GPU: 1} if any(GPU in (w.get("resources") or {}) for w in workers.values()) else None

    def run(self, tasks: Sequence[BlockTask], factory: MapperFactory,
            progress: Callable[[int], Any] | None = None) -> Iterator[BlockResult]:
        """Submit every block, yield results as they complete (each block's images to ``progress``); the
        first error cancels the rest."""
        from distributed import as_completed

        run_id = uuid.uuid4().hex[:8]
        resources = self.resources()
        futures = [self.client.submit(compute_block, task, factory, pure=False, resources=resources,
                                      key=f"features-block-{task.block}-{run_id}")
                   for task in tasks]
        try:
            for future in as_completed(futures):
                result = future.result()
                if progress is not None:
                    progress(result.rows)
                yield result
        finally:
            # On an error (or Ctrl-C) stop the blocks still queued; finished blocks stay flagged.
            self.client.cancel([f for f in futures if not f.done()])


#: the resource a worker pinned to one device holds (one per worker), and every task then asks for
GPU = "GPU"


def pinned_workers(workers: int, devices: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The worker specs of a local cluster with devices: worker ``i`` sees only device ``devices[i mod
    len(devices)]`` (``CUDA_VISIBLE_DEVICES``; several workers may share one) and holds one ``GPU``
    resource. One worker process each, one thread."""
    from distributed import Nanny

    return {f"features-{i}-device-{devices[i % len(devices)]}": {
        "cls": Nanny, "options": {"nthreads": 1, "resources": {GPU: 1},
                                  "env": {"CUDA_VISIBLE_DEVICES": str(devices[i % len(devices)])}}}
        for i in range(workers)}


def _local_cluster(workers: int, devices: Sequence[str] | None) -> Any:
    """A ``LocalCluster`` of ``workers`` processes (one thread each), or with ``devices`` a cluster of
    workers pinned to them (:func:`pinned_workers`)."""
    from distributed import LocalCluster, Scheduler, SpecCluster

    if not devices:
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    return SpecCluster(workers=pinned_workers(workers, devices), scheduler=scheduler)


@contextlib.contextmanager
def _quiet_children() -> Iterator[None]:
    """Start local worker processes that leave Ctrl-C to this process and log only errors.

    A terminal's Ctrl-C reaches every process of the group: workers would print a KeyboardInterrupt
    traceback and their nannies wait 4 s before killing them, while the driver already stops the
    run and closes the cluster. Children inherit an ignored SIGINT (Python and asyncio then leave it
    ignored) and ``DASK_LOGGING__DISTRIBUTED=error`` (the cancellation warnings of an interrupted run).
    """
    import os
    import signal

    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    env_before = os.environ.get("DASK_LOGGING__DISTRIBUTED")
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, before)
        if env_before is None:
            os.environ.pop("DASK_LOGGING__DISTRIBUTED", None)


def _kill_local_workers(cluster: Any) -> None:
    """SIGKILL the worker processes of a local cluster (after the run, or after Ctrl-C: blocks not yet
    flagged are discarded anyway, and a graceful stop waits for the running block, then 4 s more)."""
    import os
    import signal

    for nanny in list(getattr(cluster, "workers", {}).values()):
        process = getattr(getattr(nanny, "process", None), "process", None)
        pid = getattr(process, "pid", None) if process is not None else None
        if isinstance(pid, int):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """Only errors from the ``distributed`` loggers of this process while the body runs."""
    import logging

    logger = logging.getLogger("distributed")
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)


class _InterruptedSyncFilter:
    """Drops tornado's report of distributed's own error when Ctrl-C lands inside ``Client.sync``.

    distributed (2025-2026 releases) schedules a ``cancel`` callback on its event loop when the main
    thread is interrupted inside ``sync``; that callback can read a variable before it is set and tornado
    logs the ``NameError`` with its traceback on ``tornado.application``: ten lines after the command's
    one "interrupted" line (seen under load in ``test_ctrl_c_of_a_local_dask_run_is_one_line``). Only that
    record is dropped; every other error of the logger is still shown.
    """

    def filter(self, record: object) -> bool:
        message = getattr(record, "msg", "")
        return not (isinstance(message, str) and "sync.<locals>.cancel" in str(getattr(record, "args", ""))
                    + message)


class _CancelledGatherFilter:
    """Drops the scheduler's ``Couldn't gather keys: {KEY: 'forgotten'}`` when every key it names was
    forgotten: a result being fetched when Ctrl-C (or a block's error) cancelled the run's blocks. A run
    never forgets a block it still waits for, so only a cancelled one is dropped (seen under load in
    ``test_ctrl_c_of_a_local_dask_run_is_one_line``: a second line after "interrupted"); a key in any other
    state is still reported."""

    def filter(self, record: object) -> bool:
        args = getattr(record, "args", None)  # logging keeps a lone mapping argument as the args themselves
        states = args if isinstance(args, dict) else (args[0] if isinstance(args, tuple) and len(args) == 1
                                                      else None)
        cancelled = (getattr(record, "msg", None) == "Couldn't gather keys: %s" and isinstance(states, dict)
                     and bool(states) and all(state == "forgotten" for state in states.values()))
        return not cancelled


@contextlib.contextmanager
def _without_interrupted_sync_noise() -> Iterator[None]:
    import logging

    filters = ((logging.getLogger("tornado.application"), _InterruptedSyncFilter()),
               (logging.getLogger("distributed.scheduler"), _CancelledGatherFilter()))
    for logger, noise in filters:
        logger.addFilter(noise)
    try:
        yield
    finally:
        for logger, noise in filters:
            logger.removeFilter(noise)


@contextlib.contextmanager
def open_dask(scheduler: str, workers: int, devices: Sequence[str] | None = None) -> Iterator[DaskExecutor]:
    """A :class:`DaskExecutor` on a ``LocalCluster`` (``local``; with ``devices``, each worker pinned to one
    of them, :func:`pinned_workers`) or on the scheduler at ``scheduler``; closes what it started."""
    try:
        from distributed import Client
    except ImportError:
        raise UserError(f"--scheduler {scheduler} runs blocks on a Dask cluster, and Dask is not installed "
                        "(install the extra: pip install 'vse-toolkit[dask]')") from None
    if scheduler == "local":
        # Processes, not threads: each worker holds its own model and the GIL is not shared. One
        # task at a time per worker: torch's thread count is per process, set by the mapper.
        with _quiet_children():
            cluster = _local_cluster(workers, devices)
        with _without_interrupted_sync_noise():
            try:
                with Client(cluster) as client:
                    yield DaskExecutor(client)
            finally:
                # Every result is in (or the run was interrupted): the workers hold nothing to keep, and a
                # graceful stop waits for a running block and then 4 s more before killing them anyway.
                with _quiet_logs():
                    _kill_local_workers(cluster)
                    cluster.close()
        return
    try:
        client = Client(scheduler, timeout="30s")
    except OSError as exc:
        raise UserError(f"cannot reach the Dask scheduler at {scheduler}: {exc} (start it with "
                        "`dask scheduler` and workers with `dask worker {scheduler}`)") from None
    with client:
        if not client.scheduler_info().get("workers"):
            try:
                client.wait_for_workers(1, timeout=120)
            except TimeoutError:
                raise UserError(f"the Dask scheduler at {scheduler} has no workers after 120 s (start them "
                                f"with `dask worker {scheduler}`)") from None
        yield DaskExecutor(client)
