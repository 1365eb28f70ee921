"""User-facing errors and the wrapper every command-line entry point uses.

A :class:`UserError` is bad input or a bad option: the command prints one line naming the file
and the place, and exits with status 2. Everything else is a bug and keeps its traceback.
``--traceback`` (or ``VSE_TRACEBACK=1``) shows the traceback of user errors too.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence


class UserError(Exception):
    """Bad input, configuration or option; reported in one line, exit status 2."""

    exit_code = 2


#: the one meaning of --device in every command
DEVICE_HELP = "where to compute: auto (cuda when available, else cpu), cpu, cuda or cuda:N (default auto)"

#: options every command takes anywhere on its command line (see :func:`add_common_options`)
COMMON_FLAGS = {"--traceback": "traceback", "--quiet": "quiet", "-q": "quiet", "--verbose": "verbose",
                "-v": "verbose"}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default in its help, except when there is none to show (``None``, ``False``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, argparse.SUPPRESS) or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Show ``--quiet``, ``--verbose`` and ``--traceback`` in the help of ``parser`` and every subcommand.

    :func:`run_cli` takes them out of the command line wherever they are, before parsing.
    """
    group = parser.add_argument_group("common options (any command)")
    group.add_argument("-q", "--quiet", action="store_true", help="print only results and warnings")
    group.add_argument("-v", "--verbose", action="store_true", help="print more details")
    group.add_argument("--traceback", action="store_true",
                       help="show the full traceback of an error (also VSE_TRACEBACK=1)")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                add_common_options(sub)


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None, prog: str) -> int:
    """Run ``main(argv)``; turn a :class:`UserError` into ``prog: error: ...`` and status 2.

    The common options (``--quiet``/``-q``, ``--verbose``/``-v``, ``--traceback``) are taken out of
    the command line first, wherever they are, and set :mod:`prep.console`'s verbosity.
    """
    from prep import console

    args = list(sys.argv[1:] if argv is None else argv)
    flags = {COMMON_FLAGS[a] for a in args if a in COMMON_FLAGS}
    args = [a for a in args if a not in COMMON_FLAGS]
    show_tb = "traceback" in flags or os.environ.get("VSE_TRACEBACK") == "1"
    console.set_verbosity(console.QUIET if "quiet" in flags else
                          console.VERBOSE if "verbose" in flags else console.NORMAL)
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
