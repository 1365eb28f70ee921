"""``prep textcls`` on files received from someone else (issue 30.6): texts cleaned as captions are,
oversized fields and special files refused in one line under a memory cap."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

MEMORY_CAP = 3 << 30
ROWS = [f'"{1 + k % 2}","title {k}","a plain text about topic {k}"' for k in range(12)]


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def prep_textcls(train: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prep", "textcls", "--train", str(train), "--test-fraction",
                           "0.25", "--out", str(out), "-q"], capture_output=True, text=True, timeout=120,
                          preexec_fn=_limits)


def write(folder: Path, rows: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "classes.txt").write_text("World\nSports\n", encoding="utf-8")
    path = folder / "train.csv"
    path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return path


SEP = "\u00b6"  # prep.sources.textcls.FIELD_SEPARATOR: title and description joined


def test_controls_escapes_and_invisible_characters_are_removed_and_counted(tmp_path: Path) -> None:
    hostile = ['"1","nul","a\x00b"', '"2","ansi","\x1b[31mred\x1b[0m text"',
               '"1","rtl","abc \u202edcba\u202c end"', '"2","zero","\u200b\u200b\u200b"',
               '"1","soft","hy\u00adphen \ufeffbom"']
    done = prep_textcls(write(tmp_path / "in", ROWS + hostile), tmp_path / "out")
    assert done.returncode == 0, done.stderr
    items = json.loads((tmp_path / "out" / "dataset.json").read_text())["items"]
    texts = {it["text"] for it in items}
    expected = {f"nul {SEP} ab", f"ansi {SEP} red text", f"rtl {SEP} abc dcba end", f"soft {SEP} hyphen bom"}
    assert expected <= texts
    assert not any(c in t for t in texts for c in "\x00\x1b\u202e\u202c\u200b\u00ad\ufeff")
    symbols = json.loads((tmp_path / "out" / "chars.json").read_text())["symbols"]
    assert not any(c in symbols for c in "\x00\x1b\u202e\u200b")
    record = json.loads((tmp_path / "out" / "prep.json").read_text())
    # occurrences removed, and the texts they were in
    assert record["repaired"] == {"control_characters": 10} and record["repaired_texts"] == 5
    assert f"zero {SEP}" in texts
    assert record["repaired_first"] == [f"train.csv:{line}" for line in range(13, 18)]
    # a row of nothing but zero-width spaces is empty: dropped and counted
    done = prep_textcls(write(tmp_path / "in2", ROWS + ['"1","\u200b","\u200b\u200b"']), tmp_path / "out2")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out2" / "prep.json").read_text())["dropped"] == {"empty_texts": 1}


def test_a_51_mb_field_is_one_line_within_the_memory_cap(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    path = write(folder, ROWS)
    with open(path, "a", encoding="utf-8") as f:
        f.write('"1","huge","' + "x" * (51 << 20) + '"\n')
    done = prep_textcls(path, tmp_path / "out")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "line 13: a field longer than 1,048,576 characters" in lines[0]


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_special_file_is_one_line(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "classes.txt").write_text("World\nSports\n", encoding="utf-8")
    path = folder / "train.csv"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    done = prep_textcls(path, tmp_path / "out")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "is not a regular file" in lines[0]


def test_a_classification_run_refuses_a_dataset_prepared_again_otherwise(tmp_path: Path, capsys) -> None:
    """Issue 30.6: re-preparing the run's dataset with other options (another seed: other texts in each
    split; another alphabet) makes `train evaluate` and `train predict` say so in one line, instead of
    silently scoring another test split or encoding texts with another alphabet."""
    from helpers import CLASSIFY_TINY, prepare_tiny_textcls

    from prep.cli import main as prep_main
    from train.cli import main as train_main

    data = prepare_tiny_textcls(tmp_path)
    run = tmp_path / "run"
    assert train_main(["classify", "--data", str(data), *CLASSIFY_TINY, "--epochs", "1", "-q",
                       "--out", str(run)]) == 0
    assert train_main(["predict", "--run", str(run), "--text", "paris summit"]) == 0
    capsys.readouterr()
    raw = tmp_path / "raw"
    assert prep_main(["textcls", "--train", str(raw / "train.csv"), "--test", str(raw / "test.csv"),
                      "--val-fraction", "0.25", "--seed", "5", "-q", "--out", str(data), "--overwrite"]) == 0
    for argv in (["evaluate", "--run", str(run)], ["predict", "--run", str(run), "--text", "paris summit"]):
        assert train_main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "prepared dataset changed since it was trained" in err, err
        assert "dataset.json" in err, err
