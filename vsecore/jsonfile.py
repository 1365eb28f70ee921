"""The one reader of JSON files a user or a peer hands over: bounded, and wrong in one line.

Every JSON file the toolkit reads from outside the process (annotation files, a prepared ``dataset.json``,
a run's ``config.json`` and ``model.json``, a store's records, evaluation results) goes through
:func:`read_json`: a regular file of bounded size (:func:`vsecore.io.read_text`: a FIFO, a device or a folder
is refused unread), UTF-8, parsed with Python's nesting limit, integers of at most :data:`MAX_DIGITS`
digits, and, where asked, of an expected top-level type. Each failure is one :class:`UserError` naming the
file (and the line, or the key holding a huge integer).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from vsecore.errors import UserError
from vsecore.io import MAX_TEXT_BYTES, read_text

#: Python's own limit on the digits of an integer it converts from text (``sys.get_int_max_str_digits``)
MAX_DIGITS = 4300
#: a lone surrogate written as a JSON escape (``"\ud800"``), or the first half of a pair: looked at closer
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_KINDS = {dict: "a JSON object", list: "a JSON list"}


def parse_json(text: str, path: str | os.PathLike) -> Any:
    """The JSON ``text`` read from ``path``, or a one-line :class:`UserError` naming ``path``: malformed
    (with the line and column), nested too deeply, or an integer of more than :data:`MAX_DIGITS` digits
    (naming the key that holds it)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply to read") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: line {exc.lineno}, column {exc.colno}: malformed JSON: {exc.msg}") from None
    except ValueError:  # int() of a number past MAX_DIGITS digits
        found = re.search(r'"([^"\\]{1,100})"\s*:[^"{}]*?\d{' + str(MAX_DIGITS + 1) + "}", text)
        where = f"'{found[1]}': " if found else ""
        raise UserError(f"{path}: {where}an integer of more than {MAX_DIGITS:,} digits") from None


def check_no_lone_surrogate(data: Any, path: str | os.PathLike) -> None:
    """A one-line :class:`UserError` naming the first string of ``data`` (a key or a value) that holds a
    lone surrogate (JSON ``"\\ud800"``): not Unicode text, it cannot be tokenized, written as UTF-8 or used
    in a file name."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if _SURROGATE.search(key):
                    raise UserError(f"{path}: {where or 'top level'}: key {key!r} holds a lone surrogate, "
                                    "which is not Unicode text; fix the file")
                stack.append((f"{where}.{key}" if where else key, value))
        elif isinstance(item, list):
            stack.extend((f"{where}[{k}]", value) for k, value in reversed(list(enumerate(item))))
        elif isinstance(item, str) and _SURROGATE.search(item):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise UserError(f"{path}: {where or 'top level'}: {item[:40]!r} holds a lone surrogate, "
                                "which is not Unicode text; fix the file") from None


def read_json(path: str | os.PathLike, expected: str = "a JSON file", *, missing: str | None = None,
              most: int = MAX_TEXT_BYTES, kind: type | None = None, text_only: bool = False) -> Any:
    """The JSON content of the file ``path``, or a one-line :class:`UserError` naming it.

    Args:
        expected: what the file should be, for the messages (``"a run's config.json"``).
        missing: the message when it does not exist (default ``PATH: no such file``).
        most: its largest size in bytes (default :data:`vsecore.io.MAX_TEXT_BYTES`, 1 GiB).
        kind: ``dict`` or ``list``: the top-level value must be one.
        text_only: refuse a string holding a lone surrogate (files whose strings become captions, paths).
    """
    text = read_text(path, expected, missing=missing, most=most)
    data = parse_json(text, path)
    if kind is not None and not isinstance(data, kind):
        raise UserError(f"{path}: expected {_KINDS.get(kind, kind.__name__)} at the top level, got "
                        f"{type(data).__name__} ({expected})")
    if text_only and "\\" in text and _SURROGATE_ESCAPE.search(text):  # a pair (an emoji) or a lone one
        check_no_lone_surrogate(data, path)
    return data
