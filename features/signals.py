"""How ``features`` ends on a signal: ``SIGTERM`` raises :class:`Terminated` while a command runs, and the
exit status says which signal (130, 143); the Zarr I/O an interrupt left running is stopped before the
command returns (:func:`settle_zarr_io`). Imported by :mod:`features.entry` before anything heavy, and by
:mod:`features.cli`."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from vsecore.errors import Terminated  # the one SIGTERM exception of every command (run_cli's too)

#: exit status of a command ended by SIGINT / SIGTERM (128 + the signal number, as a shell reports it)
EXIT_SIGINT, EXIT_SIGTERM = 130, 143


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextlib.contextmanager
def signal_handlers() -> Iterator[None]:
    """While the body runs, ``SIGTERM`` raises :class:`Terminated` (main thread only: other threads
    cannot set handlers); the previous handler is restored after, so a caller such as a test runner
    keeps its own. ``SIGINT`` keeps Python's own handler, which raises :class:`KeyboardInterrupt`. When the
    body ends, the Zarr I/O an interrupt left running is settled (:func:`settle_zarr_io`), before Python's
    shutdown could meet it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
        settle_zarr_io()


#: seconds :func:`settle_zarr_io` lets the interrupted Zarr operation finish before cancelling what is left
GRACE_SECONDS = 1.0
#: seconds it then waits for the cancelled tasks (they stop at their next ``await``)
SETTLE_SECONDS = 10.0


def settle_zarr_io(grace: float = GRACE_SECONDS, timeout: float = SETTLE_SECONDS) -> None:
    """Let the Zarr operation a Ctrl-C or ``SIGTERM`` interrupted finish (at most ``grace`` seconds), cancel
    what is left of it, and wait until its tasks have stopped.

    Zarr runs every read and write as a coroutine in its own event-loop thread while the calling thread
    waits; a signal raised in that wait ends the wait, not the coroutine. It went on while the command
    printed its one line and Python shut down: its next file write found the thread pools closed ("cannot
    schedule new futures after shutdown"), Zarr's exit hook closed the loop under it, and each task left
    printed "Task was destroyed but it is pending!" (30 to 76 lines after "features: interrupted" in 3 of 14
    interrupted ``features recompress`` runs); a chunk write still running when a new store's temporary
    folder was removed made the folder again. A write ends within the grace, whole; a long read is
    cancelled (a file read or write already running in a worker thread completes, and Python joins that
    thread before Zarr closes its loop). The loop stays usable (a test may run another command in the same
    process). Nothing to do when Zarr was never imported or is idle.
    """
    sync = sys.modules.get("zarr.core.sync")
    loop = sync.loop[0] if sync is not None else None
    if loop is None or loop.is_closed() or not loop.is_running():
        return
    import asyncio

    def others() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    async def finish() -> None:
        if tasks := others():
            await asyncio.wait(tasks, timeout=grace)
        while tasks := others():
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)

    with contextlib.suppress(Exception, KeyboardInterrupt):  # a second Ctrl-C, or I/O that never ends
        asyncio.run_coroutine_threadsafe(finish(), loop).result(grace + timeout)


@contextlib.contextmanager
def zarr_settled() -> Iterator[None]:
    """Around Zarr writes whose clean-up must not race them (a new store's temporary folder, removed on an
    exception): a Ctrl-C or ``SIGTERM`` in the body settles Zarr's I/O (:func:`settle_zarr_io`) before the
    clean-up outside runs."""
    try:
        yield
    except KeyboardInterrupt:
        settle_zarr_io()
        raise


def exit_status(exc: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM."""
    return EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT
