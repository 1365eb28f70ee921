"""User-facing errors and the wrapper every command-line entry point uses.

A :class:`UserError` is bad input or a bad option: the command prints one line naming the file
and the place, and exits with status 2. Everything else is a bug and keeps its traceback.
``--traceback`` (or ``VSE_TRACEBACK=1``) shows the traceback of user errors too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence


class UserError(Exception):
    """Bad input, configuration or option; reported in one line, exit status 2."""

    exit_code = 2


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None, prog: str) -> int:
    """Run ``main(argv)``; turn a :class:`UserError` into ``prog: error: ...`` and status 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    show_tb = "--traceback" in args or os.environ.get("VSE_TRACEBACK") == "1"
    if "--traceback" in args:
        args.remove("--traceback")
    try:
        return int(main(args) or 0)
    except UserError as exc:
        if show_tb:
            raise
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
