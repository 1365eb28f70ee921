"""What the commands print: results, information, details, warnings, progress, and a log file.

Every command shares one verbosity, set from the command line by :func:`vsecore.errors.run_cli`
(``--quiet``/``-q``: results and warnings only; ``-v``/``--verbose``: also details):

* :func:`result` (stdout, always): what the command computed (tables, summaries);
* :func:`info` (stdout, unless quiet): what it is doing;
* :func:`detail` (stdout, with ``-v``): more of it;
* :func:`warning` (stderr, always);
* :func:`error` (stderr, always): the one line a failed or stopped command ends with.

:func:`progress` is a progress bar with rate and ETA on a terminal, and plain periodic lines
(every ``$VSE_PROGRESS_SECONDS`` seconds, default 30, plus the last) when the output is not a
terminal (a batch job's log), so logs show progress without ``\\r`` noise; quiet shows none.
:func:`log_file` copies every line of the four kinds, time-stamped, into a file (a run's
``train.log``) while it is open.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

QUIET, NORMAL, VERBOSE = 0, 1, 2
_verbosity = NORMAL
_files: list[IO[str]] = []


def set_verbosity(level: int) -> None:
    """``QUIET`` (0), ``NORMAL`` (1) or ``VERBOSE`` (2) for every later message."""
    global _verbosity
    _verbosity = max(QUIET, min(VERBOSE, int(level)))


def verbosity() -> int:
    """The current verbosity level."""
    return _verbosity


def _to_files(text: str) -> None:
    if _files:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        for fh in _files:
            for line in str(text).splitlines() or [""]:
                fh.write(f"{stamp} {line}\n")
            fh.flush()


def result(text: str) -> None:
    """Print what the command computed (always)."""
    print(text, flush=True)
    _to_files(text)


def info(text: str) -> None:
    """Print what the command is doing (not with ``--quiet``)."""
    if _verbosity >= NORMAL:
        print(text, flush=True)
    _to_files(text)


def detail(text: str) -> None:
    """Print a detail (only with ``-v``; always into an open log file)."""
    if _verbosity >= VERBOSE:
        print(text, flush=True)
    _to_files(text)


def warning(text: str) -> None:
    """Print a warning on stderr (always)."""
    print(text, file=sys.stderr, flush=True)
    _to_files(text)


def error(text: str) -> None:
    """Print the line a command ends with when it fails or is stopped, on stderr (always)."""
    print(text, file=sys.stderr, flush=True)
    _to_files(text)


@contextlib.contextmanager
def log_file(path: str | os.PathLike) -> Iterator[Path]:
    """Append every message to ``path`` (time-stamped) while the context is open."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        _files.append(fh)
        try:
            yield path
        finally:
            _files.remove(fh)


class PlainProgress:
    """A tqdm look-alike that prints a plain line every ``interval`` seconds and at the end."""

    def __init__(self, total: int | None = None, initial: int = 0, desc: str = "", unit: str = "it",
                 interval: float = 30.0, unit_scale: bool = False, iterable: Iterable[Any] | None = None,
                 **_: Any) -> None:
        self.iterable = iterable
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.n = self.start_n = initial
        self.desc, self.unit, self.interval, self.unit_scale = desc, unit, interval, unit_scale
        self.postfix = ""
        self.t0 = self.last = time.monotonic()
        self.closed = False
        #: ``(count, postfix)`` of the last line printed (None: none yet)
        self.printed: tuple[int, str] | None = None

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        """Values shown after the counts (``loss=0.41``)."""
        self.postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        """Text shown after the counts."""
        self.postfix = text

    def update(self, n: int = 1) -> None:
        """Advance by ``n``; print a line when ``interval`` seconds passed since the last one.

        Reaching the total prints nothing: the final line is :meth:`close`'s, so a caller that sets its last
        postfix after the last update (the trainer adds a step's loss one step late) gets one 100% line, with
        that postfix, instead of two.
        """
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.interval and not (self.total and self.n >= self.total):
            self.last = now
            self._print(now)

    def _print(self, now: float) -> None:
        self.printed = (self.n, self.postfix)
        info(self._line(now))

    def _count(self, n: float) -> str:
        if self.unit_scale and n >= 1e4:
            for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
                if n >= scale:
                    return f"{n / scale:.1f}{suffix}"
        return f"{int(n):,}"

    def _rate(self, rate: float) -> str:
        """A rate in the unit that reads: ``12.5 batch/s`` (one decimal below 10), or below one per second
        the seconds each takes, ``2.50 s/batch``, as tqdm shows them (``0.0 batch/s`` said nothing);
        ``? batch/s`` before anything is done."""
        if rate <= 0:
            return f"? {self.unit}/s"
        if rate >= 1:
            return f"{rate:.1f} {self.unit}/s" if rate < 10 else f"{self._count(rate)} {self.unit}/s"
        seconds = 1 / rate
        digits = 2 if seconds < 10 else 1 if seconds < 100 else 0
        return f"{seconds:,.{digits}f} s/{self.unit}"

    def _line(self, now: float) -> str:
        elapsed = now - self.t0
        done = self.n - self.start_n
        rate = done / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.desc}: {self._count(self.n)}"]
        if self.total:
            parts[0] += f"/{self._count(self.total)} {self.unit} ({100 * self.n // self.total}%)"
            eta = (self.total - self.n) / rate if rate > 0 else float("nan")
            eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta == eta else "?"
            parts.append(f"{self._rate(rate)}, elapsed "
                         f"{time.strftime('%H:%M:%S', time.gmtime(elapsed))}, ETA {eta_text}")
        else:
            parts[0] += f" {self.unit}"
            parts.append(self._rate(rate))
        if self.postfix:
            parts.append(self.postfix)
        return ", ".join(parts)

    def close(self) -> None:
        """Print the final line once, when anything happened and it took a second or a line was printed
        already (a log that showed 2/3 ends with 3/3); never the line just printed again."""
        if not self.closed:
            self.closed = True
            now = time.monotonic()
            if (self.n > self.start_n and (now - self.t0 >= 1.0 or self.printed is not None)
                    and self.printed != (self.n, self.postfix)):
                self._print(now)


def progress(iterable: Iterable[Any] | None = None, total: int | None = None, desc: str = "",
             unit: str = "it", initial: int = 0, leave: bool = False, unit_scale: bool = False,
             **kwargs: Any) -> Any:
    """A progress bar (terminal), plain periodic lines (no terminal), or nothing (``--quiet``).

    Takes tqdm's common arguments and returns an object with tqdm's ``update``, ``set_postfix``,
    ``close``, iteration and context-manager protocol.
    """
    from tqdm import tqdm

    if _verbosity == QUIET:
        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, disable=True)
    if sys.stderr.isatty():
        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, leave=leave,
                    unit_scale=unit_scale, dynamic_ncols=True, **kwargs)
    interval = float(os.environ.get("VSE_PROGRESS_SECONDS", "30"))
    return PlainProgress(total=total, initial=initial, desc=desc, unit=unit, interval=interval,
                         unit_scale=unit_scale, iterable=iterable)
