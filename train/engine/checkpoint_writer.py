"""Checkpoints written off the training step's critical path: background threads write them, in order.

The trainer hands :meth:`CheckpointWriter.submit` its whole state; the tensors are first copied to host
memory (:func:`host_copy`: on a GPU an asynchronous copy into pinned memory, queued before the next step's
kernels, which therefore cannot change them first; on the CPU a copy), and the containers rebuilt, so
nothing the training loop changes afterwards reaches the file. A thread then writes the file, once the
device's copies are done, with the atomic, fsynced write of :func:`train.run.checkpoint.save_checkpoint`
(a temporary sibling renamed over the final name), while the loop takes its next steps. Writes land in the
order they were submitted (each waits for the one before it), and at most one waits behind the one being
written: a further checkpoint first waits for the older. The end of an epoch and of training wait for all
of them (:meth:`CheckpointWriter.wait`). An error of a write (a full disk, an interruption) is raised in the
training loop, at the next checkpoint or that wait, and no later write is made. A run killed at any instant
leaves the previous complete checkpoint or the new one.

:attr:`CheckpointWriter.seconds` is the writing time, off the loop; :attr:`CheckpointWriter.waited` the
time the loop spent on checkpoints (copying the state, waiting for an earlier write, and at the end of an
epoch for its own): each epoch line reports both beside captions/s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def host_copy(state: Any) -> tuple[Any, torch.cuda.Event | None]:
    """``state`` (dicts, lists and tuples of tensors and plain values) rebuilt with every tensor copied to
    host memory, and the CUDA event that marks the end of the device's copies (None when nothing came from a
    GPU). Wait for the event before reading the copies."""
    device_copies = False

    def copy(value: Any) -> Any:
        nonlocal device_copies
        if isinstance(value, torch.Tensor):
            if value.device.type == "cpu":
                return value.detach().clone()
            device_copies = True
            # into pinned memory, without waiting: the copy is queued before the next step's kernels
            return value.detach().to("cpu", non_blocking=True)
        if isinstance(value, dict):
            return {k: copy(v) for k, v in value.items()}
        if isinstance(value, list):
            return [copy(v) for v in value]
        if isinstance(value, tuple):
            return tuple(copy(v) for v in value)
        return value

    copied = copy(state)
    event = None
    if device_copies:
        event = torch.cuda.Event()
        event.record()
    return copied, event


class CheckpointWriter:
    """Writes checkpoints in background threads, in the order they were submitted, with at most one waiting
    behind the one being written (an epoch's ``best.pt`` and ``last.pt``)."""

    def __init__(self) -> None:
        #: the writes in progress, in submission order: each waits for the one before it; the loop waits
        #: on their events, never on ``Thread.join``: a Ctrl-C inside ``join`` makes Python 3.11 take the
        #: thread for ended (``_wait_for_tstate_lock``), and the interpreter then exits in the middle of its
        #: write, leaving its temporary file
        self._threads: list[tuple[threading.Thread, threading.Event]] = []
        self._error: BaseException | None = None
        #: seconds the writes took (in the background), and seconds the loop spent on checkpoints
        self.seconds = 0.0
        self.waited = 0.0
        self._reported = (0.0, 0.0)

    def submit(self, write: Callable[[Path, dict[str, Any]], None], path: Path, state: dict[str, Any]
               ) -> None:
        """Write ``state`` to ``path`` with ``write(path, state)`` in the background once the writes
        submitted before have ended. Raises the error of an earlier write; waits for all but the newest of
        the writes still in progress."""
        t0 = time.perf_counter()
        try:
            for _, done in self._threads[:-1]:
                done.wait()
            self._threads = self._threads[-1:]
            self._raise()
            copied, ready = host_copy(state)
        finally:
            self.waited += time.perf_counter() - t0

        def job() -> None:
            if ready is not None:
                ready.synchronize()
            write(path, copied)

        self._start(job, f"checkpoint {path.name}")

    def _start(self, job: Callable[[], None], name: str) -> None:
        previous = self._threads[-1][1] if self._threads else None
        done = threading.Event()
        thread = threading.Thread(target=self._run, args=(previous, job, done), name=name)
        self._threads.append((thread, done))
        thread.start()

    def _run(self, previous: threading.Event | None, job: Callable[[], None], done: threading.Event) -> None:
        try:
            if previous is not None:
                previous.wait()
            if self._error is not None:  # a write before failed: the run ends there, as it would have
                return
            t0 = time.perf_counter()
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - raised again in the training loop (wait, submit)
                self._error = exc
            finally:
                self.seconds += time.perf_counter() - t0
        finally:
            done.set()

    def _raise(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def wait(self, raise_error: bool = True) -> None:
        """Wait for every write in progress; then raise the first error of one (``raise_error``; else drop
        it). The seconds it waits count in :attr:`waited`."""
        t0 = time.perf_counter()
        for _, done in self._threads:
            done.wait()
        self._threads = []
        self.waited += time.perf_counter() - t0
        if raise_error:
            self._raise()
        else:
            self._error = None

    def since_last_report(self) -> str:
        """The checkpoints since the last call (an epoch line's part): seconds written in the background,
        and seconds the loop spent on them (copying the state, waiting for a write before)."""
        done = (self.seconds - self._reported[0], self.waited - self._reported[1])
        self._reported = (self.seconds, self.waited)
        return f"checkpoints {done[0]:.1f}s in the background ({done[1]:.2f}s waited)"
