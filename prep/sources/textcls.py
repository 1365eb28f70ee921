r"""Readers of text classification files: the Zhang et al. CSV family and a generic CSV/TSV.

Zhang et al. ("Character-level Convolutional Networks for Text Classification", NIPS 2015) ship
AG News, DBPedia, Yelp and Amazon as ``train.csv`` / ``test.csv`` without a header: the first
column is the class index (1-based, the line of ``classes.txt`` naming it), the others are text
fields (AG News: title, description; DBPedia: title, content; Yelp polarity: the review). Fields
are quoted with ``"``, an inner quote is doubled (``""``). The text of a row is its text fields joined
by :data:`FIELD_SEPARATOR` (`` ¶ ``), so a model sees where the title ends.

The fields keep the escapes of the crawl they came from (measured on AG News's 7,600 test rows: 2,789
``#39;``, 753 ``&lt;``, 656 ``\$``, 595 ``quot;``); :func:`repair_escapes` decodes them (``prep textcls``
applies it to every Zhang row through :func:`prep.textcls.encoder_text` and counts the repairs in
``prep.json``; ``datasets/ag_news.md``). The readme's "new lines are a backslash followed by ``n``" is
not what the files hold: a line break is a lone backslash before the next line's first word
(``social\network``, ``gave\no``), so every backslash is read as a line break, except the escaped
``\$`` and ``\"``, and a ``\n`` not followed by a lowercase letter (the readme's escape) is one break.

A generic file has a header row; ``label_col`` names the column holding the class *name* (any
string), ``text_cols`` the text columns, and ``lang_col`` optionally a column giving each row's
language. Columns are named as in the header, or by 0-based index.

Every error names the file and the line where the bad row starts, in one line.
"""

from __future__ import annotations

import csv
import html
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vsecore.errors import UserError
from vsecore.lines import MAX_STREAMED_BYTES, open_lines

#: the longest field read, in characters: a classification text is a title, a description, a review
#: (AG News and DBPedia fields are under 10 KB); a longer one is an error naming its line, before the
#: reader holds it (a 51 MB field cost 4.5 GB). Set only while a file is read: the csv module's limit is
#: process-wide state other readers rely on.
FIELD_SIZE_LIMIT = 1 << 20
#: the longest line of a classification file, in bytes: a field at :data:`FIELD_SIZE_LIMIT` in UTF-8 (at most
#: 4 bytes a character). The line reader refuses a longer one after these bytes, before the csv module, which
#: reads a whole line before it counts a field, holds it (a 3 GB line without a new line was a MemoryError)
MAX_LINE_BYTES = 4 * FIELD_SIZE_LIMIT
#: the most characters one row may take, all its lines together (a quoted field may span lines): rows of
#: many short quoted fields, each within the field limit, would otherwise grow without bound
MAX_ROW_CHARS = 2 * MAX_LINE_BYTES


@dataclass(frozen=True)
class RawText:
    """One row of a classification file: its text, its label (a class index or a class name)."""

    text: str
    label: int | str
    lang: str | None
    where: str  # "FILE:LINE", for error messages and prep.json


#: what joins the text fields of a row (title, description): a symbol AG News and DBPedia never use, kept
#: by NFKC, so the boundary is one character the encoder learns (``train predict`` reads it the same way)
FIELD_SEPARATOR = "\u00b6"

#: a backslash escape: ``\$`` and ``\"`` are the character, ``\n`` before anything but a lowercase letter
#: is the readme's new line, any other backslash (doubled or before a word) a line break
_BACKSLASH = re.compile(r'\\([$"])|\\n(?![a-z])|\\+')
#: a complete HTML entity (named, decimal or hexadecimal)
_ENTITY = re.compile(r"&(#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[a-zA-Z][a-zA-Z0-9]{1,31});")
#: the crawl's broken entity: its ``&`` became a space (``doesn #39;t``, ``Johnson  amp; Johnson``)
_BROKEN_ENTITY = re.compile(r"(?: |^)(#[0-9]{1,7}|quot|amp|lt|gt|apos|nbsp|hellip);")


def _entity(match: re.Match[str], counts: Counter, kind: str) -> str:
    entity = f"&{match.group(1)};"
    decoded = html.unescape(entity)
    if decoded == entity:  # not an entity html knows: left as it was
        return match.group(0)
    counts[kind] += 1
    return decoded


def repair_escapes(text: str) -> tuple[str, Counter]:
    r"""Decode the escapes of a Zhang et al. field: ``(text, counts)``.

    Backslashes first (``\$`` -> ``$``, ``\"`` -> ``"``, any other one a line break), then the broken
    entities whose ``&`` became a space (``it #39;s`` -> ``it's``, `` quot;``), then HTML entities
    (``&lt;``, ``&#39;``, ``&#151;``: HTML5's reading, so the Windows-1252 ``&#146;`` is a right quote).
    The counts name the kinds repaired (``backslash_escapes``, ``broken_html_entities``,
    ``html_entities``), occurrences each. An unknown entity name is left as it is.
    """
    counts: Counter = Counter()
    if "\\" in text:
        def backslash(m: re.Match[str]) -> str:
            counts["backslash_escapes"] += 1
            return m.group(1) or "\n"

        text = _BACKSLASH.sub(backslash, text)
    if ";" in text:
        text = _BROKEN_ENTITY.sub(lambda m: _entity(m, counts, "broken_html_entities"), text)
        text = _ENTITY.sub(lambda m: _entity(m, counts, "html_entities"), text)
    return text, counts


def read_classes(path: str | Path) -> list[str]:
    """The class names of ``classes.txt``, one per line (line k names class index k, 1-based)."""
    path = Path(path)
    with open_lines(path, "a classes file", missing=f"{path}: no such classes file", most=1 << 20) as lines:
        names = [line.strip() for line in lines]
    while names and not names[-1]:
        names.pop()
    if not names:
        raise UserError(f"{path}: no class names")
    for k, name in enumerate(names, start=1):
        if not name:
            raise UserError(f"{path}: line {k}: empty class name")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise UserError(f"{path}: class name '{dup}' appears twice")
    return names


def _next_row(reader) -> list[str]:
    """The reader's next row with the field limit raised for just that read."""
    before = csv.field_size_limit(FIELD_SIZE_LIMIT)
    try:
        return next(reader)
    finally:
        csv.field_size_limit(before)


class _RowLines:
    """The lines of a CSV file as :func:`csv.reader` takes them: a lone carriage return ends a line, as
    ``open(newline="")`` reads it; at most :data:`MAX_ROW_CHARS` characters from one :meth:`row_done` to the
    next (a one-line error naming the row's first line)."""

    def __init__(self, lines: Iterator[str], path: Path) -> None:
        self.lines, self.path = lines, path
        self.pending: list[str] = []
        self.row_chars, self.first_line = 0, 1

    def __iter__(self) -> _RowLines:
        return self

    def __next__(self) -> str:
        if not self.pending:
            line = next(self.lines)
            cr = line.find("\r")
            # a lone \r (an old Mac file) ends a line, as in Python's universal new lines; a \r\n is one end
            lone = cr >= 0 and line[cr + 1:cr + 2] not in ("\n", "")
            self.pending = [p for p in _LONE_CR.split(line) if p][::-1] if lone else [line]
        line = self.pending.pop()
        self.row_chars += len(line)
        if self.row_chars > MAX_ROW_CHARS:
            raise UserError(f"{self.path}: line {self.first_line}: a row longer than {MAX_ROW_CHARS:,} "
                            "characters (a classification dataset's row is short)")
        return line

    def row_done(self, next_line: int) -> None:
        """A row was read; the next one starts at line ``next_line``."""
        self.row_chars, self.first_line = 0, next_line


#: where a carriage return not followed by a new line ends a line (a zero-width split after it)
_LONE_CR = re.compile(r"(?<=\r)(?!\n)")


def _rows(path: Path, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """``(first line number, row)`` of each record of a CSV file (a quoted field may span lines), read by the
    bounded line reader (:func:`vsecore.lines.open_lines`): a regular file, lines of at most
    :data:`MAX_LINE_BYTES`, fields of at most :data:`FIELD_SIZE_LIMIT` characters."""
    with open_lines(path, "a text classification file", most=MAX_STREAMED_BYTES, line_most=MAX_LINE_BYTES,
                    keep_ends=True) as lines:
        feed = _RowLines(lines, path)
        reader = csv.reader(feed, delimiter=delimiter, quotechar='"', doublequote=True, strict=True)
        line = 1
        while True:
            try:
                row = _next_row(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                if "field limit" in str(exc):
                    raise UserError(f"{path}: line {line}: a field longer than {FIELD_SIZE_LIMIT:,} "
                                    "characters (a classification dataset's text is short)") from None
                raise UserError(f"{path}: line {line}: malformed CSV ({exc})") from None
            yield line, row
            line = reader.line_num + 1
            feed.row_done(line)


def read_zhang_csv(path: str | Path, num_classes: int) -> list[RawText]:
    """Rows of a Zhang et al. CSV: ``"class","field",...``; labels become 0-based class indices.

    Args:
        path: ``train.csv`` or ``test.csv``.
        num_classes: lines of ``classes.txt``; a class index outside ``1..num_classes`` is an error.
    """
    path = Path(path)
    out: list[RawText] = []
    width = None
    for line, row in _rows(path, ","):
        if not row:  # a blank line
            continue
        where = f"{path}: line {line}"
        if len(row) < 2:
            raise UserError(f"{where}: expected a class index and at least one text field, got {len(row)} "
                            f"field(s)")
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise UserError(f"{where}: {len(row)} fields, but the first row has {width}")
        try:
            index = int(row[0].strip())
        except ValueError:
            raise UserError(f"{where}: class index {row[0]!r} is not an integer") from None
        if not 1 <= index <= num_classes:
            raise UserError(f"{where}: class index {index} is outside 1..{num_classes} (classes.txt has "
                            f"{num_classes} classes; the index is 1-based)")
        text = f" {FIELD_SEPARATOR} ".join(row[1:]) if any(f.strip() for f in row[1:]) else ""
        out.append(RawText(text=text, label=index - 1, lang=None, where=f"{path.name}:{line}"))
    if not out:
        raise UserError(f"{path}: no rows")
    return out


def _column(header: list[str], name: str, path: Path, option: str) -> int:
    if name in header:
        return header.index(name)
    if name.isdigit() and int(name) < len(header):
        return int(name)
    raise UserError(f"{path}: {option} '{name}' is not a column of the header ({', '.join(header)})")


def read_generic(path: str | Path, delimiter: str, label_col: str, text_cols: list[str],
                 lang_col: str | None = None) -> list[RawText]:
    """Rows of a CSV/TSV file with a header; labels are the class names found in ``label_col``."""
    path = Path(path)
    rows = _rows(path, delimiter)
    try:
        _, header = next(rows)
    except StopIteration:
        raise UserError(f"{path}: empty file (a header row is expected)") from None
    header = [h.strip() for h in header]
    label_k = _column(header, label_col, path, "--label-col")
    text_k = [_column(header, c, path, "--text-cols") for c in text_cols]
    lang_k = _column(header, lang_col, path, "--lang-col") if lang_col else None
    out: list[RawText] = []
    for line, row in rows:
        if not row:
            continue
        where = f"{path}: line {line}"
        if len(row) != len(header):
            raise UserError(f"{where}: {len(row)} fields, but the header has {len(header)}")
        label = row[label_k].strip()
        if not label:
            raise UserError(f"{where}: empty label in column '{header[label_k]}'")
        lang = row[lang_k].strip().lower() if lang_k is not None else None
        if lang_k is not None and not lang:
            raise UserError(f"{where}: empty language in column '{header[lang_k]}'")
        text = " ".join(row[k] for k in text_k)
        out.append(RawText(text=text, label=label, lang=lang, where=f"{path.name}:{line}"))
    if not out:
        raise UserError(f"{path}: no rows after the header")
    return out
