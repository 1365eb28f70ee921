"""The ``features`` entry point: signal handling first, then the (heavy) command line module.

``features.cli`` imports NumPy, Zarr, PIL and pydantic (about 0.2 s or more); a Ctrl-C or a batch
scheduler's ``SIGTERM`` arriving meanwhile must end the command with one line, not a traceback of an
import or a silent status 143. Both signals become :class:`KeyboardInterrupt` (``SIGTERM`` as its
subclass :class:`Terminated`), which ``features`` reports as "interrupted: N blocks kept, re-run to
resume" during an extraction, and exits 130 (``SIGINT``) or 143 (``SIGTERM``).
"""

from __future__ import annotations

from collections.abc import Sequence

from features.signals import signal_handlers
from vsecore.errors import interrupted_while_loading


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``features`` command and of ``python -m features``."""
    with signal_handlers():
        with interrupted_while_loading("features"):
            # start-up: the signal handlers first, then the heavy imports of the command
            from features.cli import main as cli_main
        return cli_main(argv)
