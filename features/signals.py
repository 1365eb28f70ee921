"""How ``features`` ends on a signal: ``SIGTERM`` raises :class:`Terminated` while a command runs, and the
exit status says which signal (130, 143). Imported by :mod:`features.entry` before anything heavy, and by
:mod:`features.cli`."""

from __future__ import annotations

import contextlib
import signal
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
    keeps its own. ``SIGINT`` keeps Python's own handler, which raises :class:`KeyboardInterrupt`.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def exit_status(exc: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 143 for SIGTERM."""
    return EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT
