"""The one reader of line-oriented files a user gives (docs/safety.md, "Line-oriented inputs"), and the one
way a user's text is echoed to the terminal.

:func:`open_lines` opens only a regular file of bounded size (the checks of :func:`vsecore.io.read_text`),
then streams it a line at a time: a line longer than its bound is refused after that many bytes, so memory
stays within the bound whatever the file holds (``/dev/zero``, a sparse file, a 3 GB line without a new
line). Every refusal is one :class:`vsecore.errors.UserError` naming the file and the line.
:func:`bounded_lines` is the same reader over a stream already open (standard input).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import IO

from vsecore.errors import UserError
from vsecore.io import open_regular

#: the longest line of a line-oriented input, in bytes, where its reader names no bound of its own (a text to
#: classify, a caption, a file name; a CSV row of long fields names its own)
MAX_LINE_BYTES = 1 << 20
#: the largest line-oriented file read: streamed, never held whole (Amazon reviews' train.csv is 1.6 GB)
MAX_STREAMED_BYTES = 1 << 40


def bounded_lines(fh: IO[bytes], name: str, expected: str = "a text file", *, most: int = MAX_STREAMED_BYTES,
                  line_most: int = MAX_LINE_BYTES, keep_ends: bool = False) -> Iterator[str]:
    """The UTF-8 lines of the byte stream ``fh`` (a file, standard input), one at a time.

    Lines end at ``\\n`` only (a form feed or U+2028 is part of a line, as an editor counts lines). With
    ``keep_ends`` each keeps its ending (what :mod:`csv` reads); without, the ``\\n`` and a ``\\r`` before it
    are removed. At most ``line_most + 2`` bytes are held while a line is read: a line longer than
    ``line_most`` (its ending aside) is refused after those bytes, never read to its end. Each refusal is
    one :class:`UserError` naming ``name`` and the line: ``NAME: line N is longer than ...``, ``NAME: line
    N: not UTF-8 text (...)``, or the stream past ``most`` bytes in all.
    """
    total = number = 0
    while True:
        try:
            raw = fh.readline(line_most + 2)  # room for the line and its \r\n: one byte more is too long
        except OSError as exc:  # an I/O error of the disk or the network file system read from
            raise UserError(f"{name}: not readable ({exc.strerror or type(exc).__name__})") from None
        if not raw:
            return
        number, total = number + 1, total + len(raw)
        if total > most:  # standard input, or a file that grew since it was opened
            raise UserError(f"{name}: {expected} is more than the {most:,} bytes it may have")
        if len(raw) - (2 if raw.endswith(b"\r\n") else raw.endswith(b"\n")) > line_most:
            raise UserError(f"{name}: line {number} is longer than {line_most:,} bytes, the most a line of "
                            f"{expected} may have")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{name}: line {number}: not UTF-8 text ({exc.reason} at byte {exc.start} of "
                            "the line)") from None
        yield line if keep_ends else line.removesuffix("\n").removesuffix("\r")


@contextlib.contextmanager
def open_lines(path: str | os.PathLike, expected: str = "a text file", *, missing: str | None = None,
               most: int = MAX_STREAMED_BYTES, line_most: int = MAX_LINE_BYTES,
               keep_ends: bool = False) -> Iterator[Iterator[str]]:
    """The lines of the file ``path``: ``with open_lines(path, "a list of texts") as lines: for line in
    lines: ...``.

    Entering refuses in one line, before anything is read, what :func:`vsecore.io.read_text` refuses: a
    missing file (``missing``, default ``PATH: no such file``), a folder, a FIFO, device or socket, a file of
    more than ``most`` bytes. The lines then come from :func:`bounded_lines` (``line_most``, ``keep_ends``).
    """
    with open_regular(path, expected, missing, most) as fh:
        yield bounded_lines(fh, str(path), expected, most=most, line_most=line_most, keep_ends=keep_ends)


def printable(text: str) -> str:
    """``text`` with the characters a terminal does not show as themselves (ANSI escapes, carriage returns,
    new lines, NUL, bidirectional overrides such as U+202E, zero-width spaces) written as Python escapes
    (``\\x1b``, ``\\u202e``), so a text from a file cannot move the cursor, recolour, reorder or rewrite the
    terminal. Every command that echoes a user's text prints it so (``train query``, ``train predict``)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
