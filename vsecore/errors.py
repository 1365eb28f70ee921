"""User-facing errors and the wrapper every command-line entry point uses.

A :class:`UserError` is bad input or a bad option: the command prints one line naming the file
and the place, and exits with status 2. Everything else is a bug and keeps its traceback.
``--traceback`` (or ``VSE_TRACEBACK=1``) shows the traceback of user errors too.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence

from vsecore import console


class UserError(Exception):
    """Bad input, configuration or option; reported in one line, exit status 2."""

    exit_code = 2


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


class Terminated(KeyboardInterrupt):
    """SIGTERM (what a batch scheduler sends before killing a job), raised like Ctrl-C.

    A subclass of :class:`KeyboardInterrupt`, so every ``finally`` and every handler written for
    Ctrl-C also runs on SIGTERM: temporary files are removed and completed work is kept.
    """


#: errno values of a disk that cannot take the write, with what the user can do about each
_DISK_ERRORS = {
    errno.ENOSPC: "no space left on the device: free space there (or write elsewhere) and run again",
    errno.EDQUOT: "disk quota exceeded: free space there (or write elsewhere) and run again",
    errno.EFBIG: "file too large for that file system: write elsewhere",
    errno.EROFS: "read-only file system: write elsewhere (or remount it read-write)",
    errno.EACCES: "permission denied: fix the permissions or write elsewhere",
    errno.EPERM: "operation not permitted: fix the permissions or write elsewhere",
    errno.EIO: "input/output error: check the disk (or the network file system) and run again",
}


@contextlib.contextmanager
def resume_hint(describe: Callable[[], str | None]) -> Iterator[None]:
    """While the block runs, a fault or an interruption ends with ``describe()`` (e.g. "3 blocks kept:
    re-run to resume") appended to the one-line message :func:`run_cli` prints.

    The text is computed when the exception leaves the block (so it counts what was kept by then) and
    travels on the exception; the innermost hint wins.
    """
    try:
        yield
    except BaseException as exc:
        if getattr(exc, "vse_hint", None) is None:
            with contextlib.suppress(Exception):
                exc.vse_hint = describe()  # type: ignore[attr-defined]
        raise


def _hint(exc: BaseException) -> str:
    text = getattr(exc, "vse_hint", None)
    return f" ({text})" if text else ""


def disk_error_reason(exc: BaseException) -> str | None:
    """What a user can do about an :class:`OSError` of a full, read-only or forbidden disk (the one mapping
    of disk errors to words, :data:`_DISK_ERRORS`), else None (another error, or no ``OSError``)."""
    return _DISK_ERRORS.get(exc.errno or 0) if isinstance(exc, OSError) else None


def disk_error_message(exc: OSError) -> str | None:
    """One line for an :class:`OSError` a user can fix (full, read-only or forbidden disk), naming the file,
    else None."""
    reason = disk_error_reason(exc)
    if reason is None:
        return None
    where = exc.filename if exc.filename is not None else "a file being written"
    return f"{where}: {reason}"


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None, prog: str) -> int:
    """Run ``main(argv)``; turn a :class:`UserError` into ``prog: error: ...`` and status 2.

    The common options (``--quiet``/``-q``, ``--verbose``/``-v``, ``--traceback``) are taken out of
    the command line first, wherever they are, and set :mod:`vsecore.console`'s verbosity. A full,
    read-only or forbidden disk (:func:`disk_error_message`) is one line and status 2 as well;
    Ctrl-C and SIGTERM (:class:`Terminated`) are one line and status 130 / 143. Both name what the
    command kept when it registered a :func:`resume_hint`.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    flags = {COMMON_FLAGS[a] for a in args if a in COMMON_FLAGS}
    args = [a for a in args if a not in COMMON_FLAGS]
    show_tb = "traceback" in flags or os.environ.get("VSE_TRACEBACK") == "1"
    console.set_verbosity(console.QUIET if "quiet" in flags else
                          console.VERBOSE if "verbose" in flags else console.NORMAL)
    previous = None
    with contextlib.suppress(ValueError):  # not the main thread: leave SIGTERM alone
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return int(main(args) or 0)
    except UserError as exc:
        if show_tb:
            raise
        console.error(f"{prog}: error: {exc}{_hint(exc)}")
        return exc.exit_code
    except OSError as exc:
        message = disk_error_message(exc)
        if message is None or show_tb:
            raise
        console.error(f"{prog}: error: {message}{_hint(exc)}")
        return 2
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        console.error(f"{prog}: {'terminated' if terminated else 'interrupted'}{_hint(exc)}")
        return 143 if terminated else 130
    finally:
        if previous is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def interrupted_while_loading(prog: str) -> Iterator[None]:
    """Around a command's imports: Ctrl-C (or SIGTERM, once a handler raises
    :class:`vsecore.errors.Terminated` for it) while they load ends with one line, ``prog: interrupted
    (while starting; nothing was written)``, and status 130 (143 for SIGTERM), not a traceback through
    the libraries being imported. Python 3.11 wraps an exception raised while a class body's
    ``__set_name__`` runs (pydantic has such classes) in a ``RuntimeError``: that one counts too.
    """
    try:
        yield
    except (KeyboardInterrupt, RuntimeError) as exc:
        interrupt = exc if isinstance(exc, KeyboardInterrupt) else exc.__cause__
        if not isinstance(interrupt, KeyboardInterrupt):
            raise
        word, status = ("terminated", 143) if isinstance(interrupt, Terminated) else ("interrupted", 130)
        console.error(f"{prog}: {word} (while starting; nothing was written)")
        raise SystemExit(status) from None
