"""The bounded line reader every line-oriented user file goes through (:mod:`vsecore.lines`, issue 41
items 6 and 7): a regular file only, a size bound, a line bound enforced while the line is read, one-line
errors naming the file and the line; and :func:`vsecore.lines.printable`, the one escape of a user's text
for the terminal."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from vsecore.errors import UserError
from vsecore.lines import bounded_lines, open_lines, printable


def lines_of(path: Path, **bounds) -> list[str]:
    with open_lines(path, "a list of texts", **bounds) as lines:
        return list(lines)


def test_lines_end_at_new_lines_only_with_or_without_their_endings(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes("one\r\ntwo\x0cstill\u2028two\n\nthree \u202e\rlast".encode())
    assert lines_of(path) == ["one", "two\x0cstill\u2028two", "", "three \u202e\rlast"]
    with open_lines(path, keep_ends=True) as lines:
        assert list(lines) == ["one\r\n", "two\x0cstill\u2028two\n", "\n", "three \u202e\rlast"]
    path.write_bytes(b"")
    assert lines_of(path) == []
    path.write_bytes(b"final\n")
    assert lines_of(path) == ["final"]  # a final new line ends the last line; it starts none


def test_the_line_bound_is_the_line_without_its_ending(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"x" * 8 + b"\r\n" + b"y" * 9 + b"\n")
    with pytest.raises(UserError, match=r"t.txt: line 2 is longer than 8 bytes, the most a line of a list of "
                                        r"texts may have"):
        lines_of(path, line_most=8)
    path.write_bytes(b"x" * 7 + b"\n" + b"y" * 8)
    assert lines_of(path, line_most=8) == ["x" * 7, "y" * 8]


def test_a_line_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"fine\nalso fine\nbad \xff here\n")
    with pytest.raises(UserError, match=r"t.txt: line 3: not UTF-8 text \(invalid start byte at byte 4 of "
                                        r"the line\)"):
        lines_of(path)


def test_a_huge_sparse_line_is_refused_after_the_bound_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "sparse.txt"
    with open(path, "wb") as fh:
        fh.truncate(3 << 30)  # 3 GiB of holes: no disk used, no new line
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"sparse.txt: line 1 is longer than 1,048,576 bytes"):
        lines_of(path)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("kind, message", [
    ("fifo", "a list of texts is not a regular file"), ("dev_zero", "a list of texts is not a regular file"),
    ("folder", "is a folder, expected a list of texts"), ("missing", "no such file"),
])
def test_special_files_are_refused_before_reading(tmp_path: Path, kind: str, message: str) -> None:
    path = tmp_path / "texts.txt"
    if kind == "fifo":
        os.mkfifo(path)  # no writer: opening it must not wait for one
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    with pytest.raises(UserError, match=message) as caught:
        with open_lines(path, "a list of texts"):
            pass
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


def test_the_size_bound_holds_for_a_file_and_for_a_stream(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"a\nb\nc\n")
    with pytest.raises(UserError, match=r"t.txt: a list of texts is 6 bytes, more than the 5 it may have"):
        lines_of(path, most=5)
    stream = bounded_lines(io.BytesIO(b"a\nb\nc\n"), "<stdin>", "a list of texts", most=5)
    assert next(stream) == "a" and next(stream) == "b"
    with pytest.raises(UserError, match=r"<stdin>: a list of texts is more than the 5 bytes it may have"):
        next(stream)


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    plain = "plain text, \u00e9t\u00e9 \u00b6 \u65e5\u672c"
    assert printable(plain) == plain
    assert printable("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert printable("a\x00b\tc\rd\ne") == "a\\x00b\\tc\\rd\\ne"
    assert printable("abc \u202edcba\u202c \u200b") == "abc \\u202edcba\\u202c \\u200b"
