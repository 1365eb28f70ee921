"""The ``features`` entry point: signal handling first, then the (heavy) command line module.

``features.cli`` imports NumPy, Zarr, PIL and pydantic (about 0.2 s or more); a Ctrl-C or a batch
scheduler's ``SIGTERM`` arriving meanwhile must end the command with one line, not a traceback of an
import or a silent status 143. Both signals become :class:`KeyboardInterrupt` (``SIGTERM`` as its
subclass :class:`Terminated`), which ``features`` reports as "interrupted: N blocks kept, re-run to
resume" during an extraction, and exits 130 (``SIGINT``) or 143 (``SIGTERM``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``features`` command and of ``python -m features``."""
    from vsecore.errors import interrupted_while_loading

    with signal_handlers():
        with interrupted_while_loading("features"):
            from features.cli import main as cli_main
        return cli_main(argv)
