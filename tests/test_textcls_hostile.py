"""``prep textcls`` on files received from someone else (issue 30.6): texts cleaned as captions are,
oversized fields and special files refused in one line under a memory cap."""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

MEMORY_CAP = 3 << 30
ROWS = [f'"{1 + k % 2}","title {k}","a plain text about topic {k}"' for k in range(12)]


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def prep_textcls(train: Path, out: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prep", "textcls", "--train", str(train), "--test-fraction",
                           "0.25", "--out", str(out), "-q"], capture_output=True, text=True, timeout=timeout,
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
    # on one line, the line reader refuses it at the line bound (a field of the limit in UTF-8)
    assert "line 13 is longer than 4,194,304 bytes" in lines[0]
    # spread over short lines of a quoted field, the csv module's field limit refuses it
    path = write(tmp_path / "in2", ROWS)
    with open(path, "a", encoding="utf-8") as f:
        f.write('"1","huge","' + ("x" * 1000 + "\n") * 2000 + '"\n')
    done = prep_textcls(path, tmp_path / "out2")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "line 13: a field longer than 1,048,576 characters" in lines[0]


def test_a_3_gb_line_without_a_new_line_is_refused_at_the_line_bound(tmp_path: Path) -> None:
    """Issue 41.7: the csv module reads a whole line before it counts a field; a 3 GB line was a MemoryError
    traceback after 85 s at 3.2 GB. The line reader refuses it after 4 MiB: in seconds, within the cap."""
    path = write(tmp_path / "in", ROWS[:2])
    with open(path, "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(b'"1","title","a description that never ends ')
        f.truncate(3 << 30)  # 3 GiB: the rest a hole, no disk used, no new line
    t0 = time.monotonic()
    done = prep_textcls(path, tmp_path / "out", timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0] == (f"prep: error: {path}: line 3 is longer than 4,194,304 bytes, the most a line of a "
                        "text classification file may have")
    assert time.monotonic() - t0 < 60 and not (tmp_path / "out").exists()



def test_a_row_of_many_short_quoted_fields_is_bounded(tmp_path: Path) -> None:
    """Each field within the field limit and each line short, a row of quoted fields spanning lines could grow
    without bound (a 3 GB one held it all): a row is refused past 8,388,608 characters, naming its line."""
    from prep.sources.textcls import read_zhang_csv
    from vsecore.errors import UserError

    path = write(tmp_path / "in", ROWS[:2])
    with open(path, "a", encoding="utf-8") as f:
        f.write('"1",' + '"x\ny",' * (3 << 19) + '"end"\n')  # 9.4 M characters
    with pytest.raises(UserError, match=r"train.csv: line 3: a row longer than 8,388,608 characters"):
        read_zhang_csv(path, 2)

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


# -- train predict --file: the bounded line reader, the terminal escape, the blank-line rule (issue 41.6) --

#: `train predict` runs torch, whose CUDA build maps about 3 GiB of address space at start
PREDICT_MEMORY_CAP = 6 << 30


def _predict_limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (PREDICT_MEMORY_CAP, PREDICT_MEMORY_CAP))


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory) -> Path:
    """A one-epoch `train classify` run on the tiny two-class dataset."""
    from helpers import CLASSIFY_TINY, prepare_tiny_textcls

    from train.cli import main as train_main

    root = tmp_path_factory.mktemp("predict-hostile")
    run = root / "run"
    assert train_main(["classify", "--data", str(prepare_tiny_textcls(root)), *CLASSIFY_TINY, "--epochs", "1",
                       "-q", "--out", str(run)]) == 0
    return run


def _hostile_texts(path: Path, kind: str) -> bytes | None:
    """Make the ``--file`` of one hostile case at ``path``; the bytes to send on standard input, if any."""
    if kind == "fifo":
        os.mkfifo(path)  # no writer ever: the reader must not wait for one
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "sparse_1g":
        with open(path, "wb") as f:
            f.truncate(1 << 30)  # 1 GiB of holes: NUL bytes and no new line
    elif kind == "folder":
        path.mkdir()
    elif kind == "long_line":
        path.write_bytes(b"paris summit\ngoal match\n" + b"x" * (2 << 20) + b"\n")
    elif kind == "not_utf8":
        path.write_bytes(b"paris summit\n\xff\xfe goal\n")
    elif kind == "stdin_long_line":
        return b"paris summit\n" + b"y" * (2 << 20) + b"\n"
    return None


#: each hostile ``--file`` and the start of its one-line refusal
PREDICT_REFUSALS = {
    "fifo": "{path}: a file of texts (one per line) is not a regular file",
    "dev_zero": "{path}: a file of texts (one per line) is not a regular file",
    "sparse_1g": "{path}: line 1 is longer than 1,048,576 bytes",
    "folder": "{path}: is a folder, expected a file of texts (one per line)",
    "long_line": "{path}: line 3 is longer than 1,048,576 bytes",
    "not_utf8": "{path}: line 2: not UTF-8 text (invalid start byte at byte 0 of the line)",
    "stdin_long_line": "<stdin>: line 2 is longer than 1,048,576 bytes",
}


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "sparse_1g"])
def test_predict_file_refuses_a_special_or_huge_file_in_one_line(classify_run: Path, tmp_path: Path,
                                                                 kind: str) -> None:
    """Issue 41.6, under the caps (a subprocess): a FIFO hung; /dev/zero reached 5 GB then a MemoryError
    traceback; a 1 GB sparse file ran past 120 s at 4 GB."""
    path = tmp_path / "texts.txt"
    _hostile_texts(path, kind)
    done = subprocess.run([sys.executable, "-m", "train", "predict", "--run", str(classify_run), "--file",
                           str(path)], capture_output=True, text=True, timeout=60, preexec_fn=_predict_limits,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr[-2000:]
    assert err[0].startswith("train: error: " + PREDICT_REFUSALS[kind].format(path=path)), err[0]
    assert done.stdout == ""  # refused before any answer


@pytest.mark.parametrize("kind", ["folder", "long_line", "not_utf8", "stdin_long_line"])
def test_predict_file_refuses_in_one_line_before_the_model_loads(classify_run: Path, tmp_path: Path,
                                                                 kind: str, capsys, monkeypatch) -> None:
    """Issue 41.6: a folder was an IsADirectoryError traceback; a line of 2 MiB was classified; a bad byte
    was named by no line. Each is one line naming the file and the line, before the model loads."""
    import train.cli.classify
    from train.cli import main as train_main

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the file was checked")

    monkeypatch.setattr(train.cli.classify, "load_classification_run", no_model)
    path = tmp_path / "texts.txt"
    stdin = _hostile_texts(path, kind)
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    source = "-" if stdin is not None else str(path)
    code = train_main(["predict", "--run", str(classify_run), "--file", source])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2 and len(err) == 1, captured.err[-2000:]
    assert err[0].startswith("train: error: " + PREDICT_REFUSALS[kind].format(path=path)), err[0]
    assert captured.out == ""


def test_predict_escapes_control_and_invisible_characters(classify_run: Path, tmp_path: Path, capsys) -> None:
    """Issue 41.6: ESC, NUL and U+202E of a line were echoed raw to the terminal; they are escaped as `train
    query` escapes them (plain output), or as JSON escapes of the same text (--json)."""
    from train.cli import main as train_main

    texts = ["\x1b[2J\x1b[31mparis summit\x1b[0m", "goal\x00 match", "cup final \u202edlog", "tab\there"]
    # as `train query` shows them (vsecore.lines.printable)
    shown = ["\\x1b[2J\\x1b[31mparis summit\\x1b[0m", "goal\\x00 match", "cup final \\u202edlog",
             "tab\\there"]
    file = tmp_path / "texts.txt"
    file.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert train_main(["predict", "--run", str(classify_run), "--file", str(file)]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x00\u202e")
    rows = out.splitlines()
    assert [r.split("\t", 2)[2] for r in rows] == shown
    assert all(r.split("\t")[0] for r in rows)  # every line answered with a label
    for argv in (["--file", str(file), "--json"], ["--text", *texts, "--json"]):
        assert train_main(["predict", "--run", str(classify_run), *argv]) == 0
        out = capsys.readouterr().out
        assert not any(c in out for c in "\x1b\x00\u202e")
        assert [json.loads(line)["text"] for line in out.splitlines()] == texts  # the same texts once parsed
    assert train_main(["predict", "--run", str(classify_run), "--text", texts[0]]) == 0
    assert "\x1b" not in capsys.readouterr().out


def test_predict_answers_a_blank_line_in_place_and_says_so_in_one_line(classify_run: Path, tmp_path: Path,
                                                                       capsys) -> None:
    """Issue 41.6: a blank line got an empty label, silently. The rule: answered in its place with the empty
    answer (output line k answers input line k), and one closing warning counts and names the blank lines."""
    from train.cli import main as train_main

    file = tmp_path / "texts.txt"
    file.write_text("paris summit\n\n \t \ngoal match\n\u200b\n", encoding="utf-8")
    assert train_main(["predict", "--run", str(classify_run), "--file", str(file)]) == 0
    captured = capsys.readouterr()
    rows = captured.out.splitlines()
    assert [bool(r.split("\t")[0]) for r in rows] == [True, False, False, True, False]
    assert rows[2] == "\t\t \\t " and rows[4] == "\t\t\\u200b"
    assert captured.err.splitlines() == [
        "train predict: 3 blank lines (nothing to classify once read as the training texts were) answered "
        "with an empty label: line 2, 3, 5"]
    assert train_main(["predict", "--run", str(classify_run), "--text", "goal match", " "]) == 0
    assert capsys.readouterr().err.strip().endswith(
        "1 blank text (nothing to classify once read as the training texts were) answered with an empty "
        "label: text 2")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert train_main(["predict", "--run", str(classify_run), "--file", str(empty)]) == 2
    assert capsys.readouterr().err.strip() == f"train: error: {empty}: no texts to classify (an empty file)"
