"""``prep --out``: what may be replaced (a prepared dataset, with --overwrite), what never is, the lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import prep.dataset
from prep.cli import main
from prep.dataset import MARKER_FILE, PreparedDataset, is_prepared_dataset
from vsecore.io import stale_siblings

ROOT = Path(__file__).resolve().parents[1]
SYNTH = ["synthetic", "--num-images", "12", "--image-size", "32", "--languages", "en"]


def _error(args: list[str], capsys: pytest.CaptureFixture) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("prep: error: ") and "\n" not in err and "Traceback" not in err
    return err


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _coco(tmp_path: Path) -> tuple[Path, Path]:
    """A one-image-per-split Karpathy JSON and an images folder holding the three images."""
    images = tmp_path / "images"
    images.mkdir()
    rows = []
    for k, split in enumerate(("train", "val", "test")):
        name = f"COCO_val2014_{k:012d}.jpg"
        (images / name).write_bytes(b"jpeg")
        rows.append({"filename": name, "cocoid": k, "split": split,
                     "sentences": [{"raw": f"a caption {k}", "sentid": k}]})
    karpathy = tmp_path / "karpathy.json"
    karpathy.write_text(json.dumps({"images": rows}))
    return karpathy, images


def test_out_is_created_marked_and_replaced_only_with_overwrite(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "new" / "data"
    assert main([*SYNTH, "--out", str(out)]) == 0
    assert (out / MARKER_FILE).is_file() and is_prepared_dataset(out)
    before = _tree(out)
    err = _error([*SYNTH, "--seed", "1", "--out", str(out)], capsys)
    assert f"{out}: already holds a prepared dataset; add --overwrite" in err
    assert _tree(out) == before
    assert main([*SYNTH, "--seed", "1", "--out", str(out), "--overwrite"]) == 0
    assert _tree(out) != before and PreparedDataset.load(out).record["options"]["seed"] == 1
    # an empty folder is used as it is
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*SYNTH, "--out", str(empty)]) == 0 and is_prepared_dataset(empty)


def test_a_folder_or_file_prep_did_not_write_is_never_replaced(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    docs = tmp_path / "documents"
    docs.mkdir()
    (docs / "thesis.tex").write_text("years of work")
    for extra in ([], ["--overwrite"]):
        err = _error([*SYNTH, "--out", str(docs), *extra], capsys)
        assert f"{docs}: exists, is not empty and is not a prepared dataset" in err
    assert _tree(docs) == {"thesis.tex": b"years of work"}
    file = tmp_path / "notes.txt"
    file.write_text("keep")
    err = _error([*SYNTH, "--out", str(file), "--overwrite"], capsys)
    assert f"{file}: exists and is not a folder" in err
    assert file.read_text() == "keep"
    # a prepared dataset that someone put a file into is not replaced either
    out = tmp_path / "data"
    assert main([*SYNTH, "--out", str(out)]) == 0
    (out / "mine.txt").write_text("x")
    err = _error([*SYNTH, "--out", str(out), "--overwrite"], capsys)
    assert f"{out}: a prepared dataset, but it also holds 'mine.txt', which prep did not write" in err
    # one written before the marker existed: recognised by its prep.json and its files only
    (out / MARKER_FILE).unlink()
    assert not is_prepared_dataset(out)
    assert "is not a prepared dataset" in _error([*SYNTH, "--out", str(out), "--overwrite"], capsys)
    assert (out / "mine.txt").read_text() == "x"
    (out / "mine.txt").unlink()
    assert is_prepared_dataset(out)
    assert main([*SYNTH, "--out", str(out), "--overwrite"]) == 0 and (out / MARKER_FILE).is_file()


def test_out_must_not_be_contain_or_lie_inside_an_input(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    karpathy, images = _coco(tmp_path)
    args = ["coco", "--karpathy", str(karpathy), "--images", str(images)]
    before = _tree(tmp_path)
    # the images folder itself (with --overwrite too), a folder inside it, a folder holding the input
    err = _error([*args, "--out", str(images), "--overwrite"], capsys)
    assert f"must not be or contain an input of prep ({images}, given by --images)" in err
    err = _error([*args, "--out", str(images / "prepared")], capsys)
    assert f"must not lie inside an input of prep ({images}, given by --images)" in err
    err = _error([*args, "--out", str(images / "a" / "b")], capsys)
    assert "must not lie inside" in err
    assert _tree(tmp_path) == before and sorted(p.name for p in images.iterdir() if p.is_dir()) == []
    # a prepared dataset that someone put an input into
    data = tmp_path / "data"
    assert main([*SYNTH, "--out", str(data)]) == 0
    moved = data / "karpathy.json"
    moved.write_bytes(karpathy.read_bytes())
    err = _error(["coco", "--karpathy", str(moved), "--images", str(images), "--out", str(data),
                  "--overwrite"], capsys)
    assert f"must not be or contain an input of prep ({moved}, given by --karpathy)" in err
    assert moved.is_file()
    # the images folder a reader chose by default (coco --flat: images/ next to the lists)
    flat = tmp_path / "flat"
    (flat / "images").mkdir(parents=True)
    for kind in ("train", "val"):
        rows = [{"image_path": f"COCO_val2014_{k:012d}.jpg", "caption": "a cat", "image_id": k}
                for k in range(3)]
        (flat / f"{kind}.json").write_text(json.dumps(rows))
    err = _error(["coco", "--flat", str(flat / "train.json"), str(flat / "val.json"),
                  "--out", str(flat / "images" / "data")], capsys)
    assert f"must not lie inside an input of prep ({flat / 'images'}, given by the images root)" in err
    assert list((flat / "images").iterdir()) == []


def test_stale_temporary_folders_of_killed_runs_are_removed(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "data"
    stale = [tmp_path / ".data.k3x9_q0a.partial", tmp_path / ".data.old-4242"]
    other = [tmp_path / ".data.v2.k3x9_q0a.partial", tmp_path / ".database.old-1", tmp_path / ".data.old"]
    for p in stale + other:
        p.mkdir()
        (p / "dataset.json").write_text("{}")
    assert stale_siblings(out) == sorted(stale)
    assert main([*SYNTH, "--out", str(out)]) == 0
    assert all(not p.exists() for p in stale) and all(p.exists() for p in other)
    assert ".data.old-4242 (left by a killed run)" in capsys.readouterr().err


def _wait_for(predicate, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


@pytest.mark.slow
def test_a_killed_run_holds_the_lock_while_alive_and_is_cleaned_up_after(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "prep", "synthetic", "--num-images", "100000",
                             "--image-size", "32", "--languages", "en", "--out", str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any(any((p / "images").glob("*.png")) for p in stale_siblings(out)))
        # a second prep on the same folder while the first is writing it
        err = _error([*SYNTH, "--out", str(out)], capsys)
        assert f"{out}: this prepared dataset is being written by pid {proc.pid}" in err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    partial = stale_siblings(out)
    assert len(partial) == 1 and not out.exists()
    assert main([*SYNTH, "--out", str(out)]) == 0
    assert f"removed {partial[0].name}" in capsys.readouterr().err
    assert stale_siblings(out) == [] and is_prepared_dataset(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write read-only folders")
def test_read_only_out_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        assert "cannot write --out" in _error([*SYNTH, "--out", str(parent / "data")], capsys)
        data = tmp_path / "data"
        assert main([*SYNTH, "--out", str(data)]) == 0
        data.chmod(0o555)
        assert "--out is read-only" in _error([*SYNTH, "--out", str(data), "--overwrite"], capsys)
    finally:
        parent.chmod(0o755)
        (tmp_path / "data").chmod(0o755)


def test_write_errors_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # whoever runs the tests (root too): a permission error where prep writes, as a read-only
    # folder or file system gives it
    out = tmp_path / "data"
    real = prep.dataset.write_json_atomic

    def denied(path: Path, obj: object, indent: int | None = 1) -> None:
        if Path(path).name == "chars.json":
            raise PermissionError(13, "Permission denied", str(path))
        real(path, obj, indent)

    monkeypatch.setattr(prep.dataset, "write_json_atomic", denied)
    err = _error([*SYNTH, "--out", str(out)], capsys)
    assert f"{out}: cannot write --out ({tmp_path}/.data." in err  # the file, then the words of disk errors
    assert err.endswith("chars.json: permission denied: fix the permissions or write elsewhere)"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # and on an input: the file named, no traceback
    karpathy, images = _coco(tmp_path)

    def unreadable(path: Path, *args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("prep.sources.coco.read_json", unreadable)
    err = _error(["coco", "--karpathy", str(karpathy), "--images", str(images), "--out", str(out)], capsys)
    assert err == f"prep: error: {karpathy}: Permission denied"
