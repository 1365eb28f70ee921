"""The one bounded JSON reader (vsecore.jsonfile.read_json): every way a handed-over JSON file can be wrong
is one line naming the file."""

from __future__ import annotations

import os

import pytest

from vsecore.errors import UserError
from vsecore.jsonfile import MAX_DIGITS, read_json

CASES = [
    ("malformed", b'{"a": 1,}', "line 1, column 9: malformed JSON"),
    ("nested", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ("huge integer", b'{"size": ' + b"9" * (MAX_DIGITS + 1) + b"}", "'size': an integer of more than"),
    ("not UTF-8", b'{"a": "\xff"}', "not UTF-8 text"),
    ("too big", b'{"a": "' + b"x" * 200 + b'"}', "209 bytes, more than the 100"),
    ("wrong kind", b"[1, 2]", "expected a JSON object at the top level, got list"),
    ("lone surrogate", b'{"caption": "a \\ud800 b"}', "caption: 'a \\ud800 b' holds a lone surrogate"),
]


@pytest.mark.parametrize("content, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_file_is_one_line_naming_it(tmp_path, content, words) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(content)
    with pytest.raises(UserError) as err:
        read_json(path, most=100 if "bytes" in words else 1 << 30, kind=dict, text_only=True)
    assert words in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_fifo_folder_and_missing_file_are_refused_unread(tmp_path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, words in ((fifo, "not a regular file"), (tmp_path, "is a folder"),
                        (tmp_path / "none.json", "no such file")):
        with pytest.raises(UserError, match=words):
            read_json(path)
    with pytest.raises(UserError, match="^gone$"):
        read_json(tmp_path / "none.json", missing="gone")


def test_a_good_file_and_an_emoji_pair_are_read(tmp_path) -> None:
    path = tmp_path / "f.json"
    path.write_text('{"caption": "a \\ud83d\\ude00 b", "n": [1, 2]}')
    assert read_json(path, kind=dict, text_only=True) == {"caption": "a \U0001f600 b", "n": [1, 2]}
