"""docs/ARCHITECTURE.md's "To add X, open Y" table names files that exist and names that they define."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def _table_rows() -> list[str]:
    """The body rows of the table under the "To add X, open Y" heading."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## To add X, open Y", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    return rows[1:]


def test_the_table_covers_what_the_issue_asks() -> None:
    firsts = [row.split("|")[1].strip() for row in _table_rows()]
    for thing in ("a dataset", "an extractor", "a model family", "a classifier encoder", "an export format"):
        assert any(first.startswith(thing) for first in firsts), thing


def test_every_file_the_table_names_exists_and_defines_what_it_says() -> None:
    paths = 0
    for row in _table_rows():
        for cell in row.split("|")[2:]:
            names = re.findall(r"`([^`]+)`", cell)
            files = [name for name in names if re.fullmatch(r"[\w./]+\.py|[\w/]+/", name)]
            for name in files:
                assert (ROOT / name).exists(), f"{name} in docs/ARCHITECTURE.md does not exist"
                paths += 1
            # a code name written "(`NAME`)" right after a file is defined in that file
            for file, symbol in re.findall(r"`([\w./]+\.py)` \(`(\w+)`\)", cell):
                assert re.search(rf"^\s*(def |class )?{symbol}\b", (ROOT / file).read_text(encoding="utf-8"),
                                 re.M), f"{symbol} not in {file}"
    assert paths >= 10
