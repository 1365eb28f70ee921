"""Trustworthy stores: dataset identity, writer locks, damaged or non-finite rows, atomic rethreshold.

Small stores of real COCO images: the colour-statistics mapper of ``test_features_store`` for the
store mechanics, and ``features cnn`` (EfficientNet-Lite0, random weights, 64 px) where the whole
command is under test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    BASE,
    ColourFactory,
    hold_lock,
    make_image_dataset,
    new_store,
    paths_of,
)

from features.cli import main
from features.executors.extract import extract
from features.executors.in_process import InProcessExecutor
from features.run import rethreshold_store
from features.store import core as store_module
from features.store.core import TERNARY, TERNARY_NEW, TERNARY_OLD, FeatureStore
from features.store.read import check_store_matches, read_matrix
from features.store.ternary import finish_fne
from features.store.verify import check_files, verify_store
from prep.dataset import PreparedDataset
from vsecore.errors import UserError
from vsecore.io import lock_path

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("features: error:") and "\n" not in err, err
    return err


@pytest.fixture(scope="module")
def data(coco_sample, tmp_path_factory) -> Path:
    return make_image_dataset(tmp_path_factory.mktemp("prep") / "a", coco_sample, 8)


@pytest.fixture(scope="module")
def other_images(coco_sample, tmp_path_factory) -> Path:
    """Same size as ``data``, but row 0 is another image."""
    ninth = sorted((coco_sample / "images").iterdir())[8]
    return make_image_dataset(tmp_path_factory.mktemp("prep") / "b", coco_sample, 8, extra={0: ninth})


@pytest.fixture(scope="module")
def other_captions(data, tmp_path_factory) -> Path:
    """The same images and splits as ``data``, other captions (re-prepared text)."""
    root = tmp_path_factory.mktemp("prep") / "c"
    root.mkdir()
    for name in ("chars.json", "words.json"):
        (root / name).write_text((data / name).read_text())
    doc = json.loads((data / "dataset.json").read_text())
    for im in doc["images"]:
        im["sentences"][0]["raw"] = "another caption entirely"
    (root / "dataset.json").write_text(json.dumps(doc))
    return root


def cnn(data: Path, out: Path, *extra: str) -> int:
    return main(["cnn", "--data", str(data), "--out", str(out), *BASE, "--block-size", "2", *extra])


# -- 5: dataset identity ------------------------------------------------------------------------
def test_store_records_images_sha256_and_export_checks_it(data, other_images, other_captions, tmp_path,
                                                          capsys):
    out = tmp_path / "s.zarr"
    assert cnn(data, out) == 0
    attrs = FeatureStore(out).attrs
    fingerprint = PreparedDataset.load(data).images_fingerprint()
    assert attrs["config"]["images_sha256"] == fingerprint == attrs["provenance"]["images_sha256"]
    assert "dataset_sha256" not in attrs["config"] and attrs["provenance"]["dataset_sha256"]
    capsys.readouterr()

    assert main(["export", "--store", str(out), "--data", str(other_images), "--format", "precomp",
                 "--out", str(tmp_path / "p")]) == 2
    err = one_line_error(capsys)
    assert str(out) in err and str(data.resolve()) in err and str(other_images.resolve()) in err
    assert not (tmp_path / "p").exists()
    with pytest.raises(UserError, match="images, order or splits differ"):
        read_matrix(str(out), dataset=other_images)

    # re-prepared captions: same rows, so export, reading and resuming all accept the store
    assert main(["export", "--store", str(out), "--data", str(other_captions), "--format", "precomp",
                 "--out", str(tmp_path / "p")]) == 0
    x, _ = read_matrix(str(out), dataset=PreparedDataset.load(other_captions))
    assert x.shape[0] == 8
    assert cnn(other_captions, out) == 0
    assert "wrote 0 rows, skipped 8" in capsys.readouterr().out
    # other images: resuming is refused too
    assert cnn(other_images, out) == 2
    assert "images_sha256" in one_line_error(capsys)


def test_identity_falls_back_for_older_stores(data, other_images, other_captions, tmp_path):
    from vsecore.io import sha256_file

    sha = sha256_file(data / "dataset.json")
    old = new_store(tmp_path / "old.zarr", 8, block=4, config={"cnn": "colour", "dataset_sha256": sha})
    check_store_matches(old, PreparedDataset.load(data))
    with pytest.raises(UserError, match="dataset.json sha256"):
        check_store_matches(old, PreparedDataset.load(other_captions))  # no images_sha256: whole file
    bare = new_store(tmp_path / "bare.zarr", 8, block=4)
    check_store_matches(bare, PreparedDataset.load(other_images))  # nothing recorded: rows only
    short = new_store(tmp_path / "short.zarr", 7, block=4)
    with pytest.raises(UserError, match="rows 7"):
        check_store_matches(short, PreparedDataset.load(data))


def test_every_writer_takes_the_lock_and_a_killed_holder_releases_it(data, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    assert main(["fne", "--data", str(data), "--out", str(out), *BASE]) == 0
    before = FeatureStore(out).array("fne/raw")[:]
    np.save(tmp_path / "x.npy", np.ones((len(PreparedDataset.load(data).image_rows("test")), 3), np.float32))
    holder = hold_lock(out)
    try:
        capsys.readouterr()
        writers = [
            ["fne", "--data", str(data), "--out", str(out), *BASE, "--overwrite"],
            ["fne", "--data", str(data), "--out", str(out), *BASE],
            ["fne", "--out", str(out), "--rethreshold", "--threshold-low", "-1", "--threshold-high", "1"],
            ["import", "--npy", str(tmp_path / "x.npy"), "--data", str(data), "--split", "test", "--out",
             str(out), "--overwrite"],
            ["verify", str(out), "--repair"],
        ]
        for argv in writers:
            assert main(argv) == 2, argv
            err = one_line_error(capsys)
            assert f"pid {holder.pid}" in err and "the feature store is being written" in err
        # nothing was deleted or changed by the refused writers
        store = FeatureStore(out)
        np.testing.assert_array_equal(store.array("fne/raw")[:], before)
        assert store.attrs["complete"] and store.attrs["config"]["thresholds"] == [-0.25, 0.15]
        assert main(["verify", str(out)]) == 0  # a reader needs no lock
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_path(out).exists()  # stale: its flock died with the holder
    assert main(["fne", "--data", str(data), "--out", str(out), *BASE, "--overwrite"]) == 0
    assert not lock_path(out).exists()


# -- 8 and 11: damaged chunks, non-finite rows ---------------------------------------------------
def test_deleted_chunk_is_reported_repaired_and_recomputed(data, tmp_path, capsys):
    clean, out = tmp_path / "clean.zarr", tmp_path / "s.zarr"
    assert cnn(data, clean) == 0 and cnn(data, out) == 0
    assert main(["verify", str(out), "--data", str(data)]) == 0
    assert "4/4 blocks done, 0 damaged, complete" in capsys.readouterr().out
    (out / "global" / "c" / "1" / "0").unlink()  # block 1 now reads back NaN with valid=True

    assert main(["verify", str(out)]) == 2
    captured = capsys.readouterr()
    assert "block 1: global/c/1/0 missing" in captured.out
    assert "1 damaged block(s)" in captured.err and "--repair" in captured.err
    with pytest.raises(UserError, match="features verify"):
        read_matrix(str(out))  # valid but NaN rows are refused, never handed to training

    # resume notices the missing file by itself, recomputes only that block
    assert cnn(data, out) == 0
    captured = capsys.readouterr()
    assert "1 finished block(s)" in captured.err and "global/c/1/0 missing" in captured.err
    assert "wrote 2 rows, skipped 6" in captured.out
    for name in ("global", "valid", "blocks_done", "imgid"):
        np.testing.assert_array_equal(FeatureStore(out).array(name)[:], FeatureStore(clean).array(name)[:])
    assert main(["verify", str(out)]) == 0


def test_a_folder_in_a_chunks_place_is_damage_and_never_written_through(data, tmp_path, capsys):
    """issue 41.4: Zarr reads a folder where a chunk file belongs as NaN rows ("valid rows not finite");
    verify names the file, the reader names the chunk, and the resume, which recomputes the block, says in
    one line that the folder is in the way (Zarr failed with IsADirectoryError) and deletes nothing of it.
    The half-built store a kill left beside the store goes with the next run."""
    import shutil

    clean, out = tmp_path / "clean.zarr", tmp_path / "s.zarr"
    assert cnn(data, clean) == 0 and cnn(data, out) == 0
    chunk = out / "global" / "c" / "1" / "0"
    chunk.unlink()
    chunk.mkdir()
    (chunk / "mine.txt").write_text("mine")
    capsys.readouterr()
    assert main(["verify", str(out)]) == 2
    assert "  block 1: global/c/1/0: a folder, not a file" in capsys.readouterr().out.splitlines()
    with pytest.raises(UserError, match=r"'global' is damaged at rows 2-3 \(chunk file global/c/1/0: a fo"):
        read_matrix(str(out))
    assert cnn(data, out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "(block 1: global/c/1/0: a folder, not a file); recomputing them" in err[0]
    assert err[1] == (f"features: error: {out}: global/c/1/0 is a folder where a chunk file of block 1 goes; "
                      "move it away and run again")
    assert (chunk / "mine.txt").read_text() == "mine"
    shutil.rmtree(chunk)
    stale = tmp_path / ".s.zarr.abcd_123.partial"
    (stale / "global").mkdir(parents=True)  # what a kill while --overwrite built the store leaves
    assert cnn(data, out) == 0
    assert f"features: removed {stale.name} (left by a killed run)" in capsys.readouterr().err
    assert not stale.exists()
    for name in ("global", "valid", "blocks_done", "imgid"):
        np.testing.assert_array_equal(FeatureStore(out).array(name)[:], FeatureStore(clean).array(name)[:])


def test_verify_repair_clears_flags_of_bad_blocks(data, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    store = new_store(out, 8, block=3)
    extract(store, paths_of(data), ColourFactory(), InProcessExecutor(), progress=False)
    store.set_attrs(complete=True)
    store.array("global")[4] = np.inf  # a valid row gone non-finite (block 1)
    store.array("valid")[7] = False  # invalid without a recorded failure (block 2)
    report = verify_store(out)
    assert sorted(report.blocks) == [1, 2] and not report.ok
    assert "valid rows 4 not finite" in report.blocks[1][0]
    assert "imgid 7 invalid without a recorded failure" in report.blocks[2][0]
    assert main(["verify", str(out), "--repair"]) == 0
    assert "cleared 2 damaged block(s)" in capsys.readouterr().out
    repaired = FeatureStore(out)
    assert repaired.blocks_done().tolist() == [True, False, False] and not repaired.attrs["complete"]
    assert main(["verify", str(out)]) == 2
    assert "incomplete (1/3 blocks done)" in one_line_error(capsys)


def test_truncated_chunk_is_one_line_everywhere(data, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    assert cnn(data, out) == 0
    chunk = out / "global" / "c" / "2" / "0"
    chunk.write_bytes(chunk.read_bytes()[:5])
    capsys.readouterr()
    with pytest.raises(UserError) as info:
        read_matrix(f"{out}:global")  # the reader `train` uses
    message = str(info.value)
    assert "'global' is damaged at rows 4-5" in message and "global/c/2/0" in message
    assert "features verify" in message and "\n" not in message
    for argv in (["export", "--store", str(out), "--data", str(data), "--format", "precomp", "--out",
                  str(tmp_path / "p")],
                 ["export", "--store", str(out), "--data", str(data), "--format", "hdf5", "--out",
                  str(tmp_path / "f.h5")]):
        assert main(argv) == 2
        assert "global/c/2/0" in one_line_error(capsys)
    assert not (tmp_path / "f.h5").exists() and not list(tmp_path.glob(".f.h5*"))
    assert main(["verify", str(out)]) == 2
    captured = capsys.readouterr()
    assert "block 2: global/c/2/0 unreadable" in captured.out
    assert check_files(FeatureStore(out)) == {}  # not empty, not missing: only decoding finds it
    assert main(["verify", str(out), "--repair"]) == 0 and cnn(data, out) == 0
    assert np.isfinite(read_matrix(str(out))[0]).all()


def test_import_marks_nonfinite_rows_invalid(data, tmp_path, capsys):
    ds = PreparedDataset.load(data)
    train = ds.image_rows("train")
    x = np.arange(len(train) * 3, dtype=np.float32).reshape(len(train), 3)
    x[1, 2], x[3, 0] = np.nan, -np.inf
    np.save(tmp_path / "train_ims.npy", x)
    out = tmp_path / "i.zarr"
    assert main(["import", "--npy", str(tmp_path / "train_ims.npy"), "--data", str(data), "--split", "train",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"2 of {len(train)} imported rows hold NaN or inf" in text
    assert f"imgid {train[1]}, {train[3]}" in text
    y, valid = read_matrix(str(out), dataset=ds)
    assert np.flatnonzero(valid).tolist() == [r for k, r in enumerate(train) if k not in (1, 3)]
    np.testing.assert_array_equal(y[train[0]], x[0])
    store = FeatureStore(out)
    assert [f["imgid"] for f in store.block_failures()] == [train[1], train[3]]
    assert store.attrs["config"]["images_sha256"] == ds.images_fingerprint()
    assert verify_store(out).ok
    # importing the split again with the rows fixed makes them valid and drops their failures
    np.save(tmp_path / "train_ims.npy", np.nan_to_num(x, posinf=0, neginf=0))
    assert main(["import", "--npy", str(tmp_path / "train_ims.npy"), "--data", str(data), "--split", "train",
                 "--out", str(out)]) == 0
    assert read_matrix(str(out))[1][train].all() and FeatureStore(out).block_failures() == []


def test_import_of_one_split_writes_every_chunk(tmp_path):
    """A split filling only the last of three blocks: the other blocks' chunks exist too (NaN)."""
    n = 2100  # block size min(n, 1024): three blocks
    images = [{"imgid": i, "split": "test" if i >= 2050 else "train", "filename": f"{i}.jpg", "sentids": [],
               "sentences": []} for i in range(n)]
    data = tmp_path / "big"
    data.mkdir()
    (data / "dataset.json").write_text(json.dumps({"dataset": "big", "images_root": str(tmp_path),
                                                   "images": images}))
    for name, key in (("chars.json", "symbols"), ("words.json", "tokens")):
        (data / name).write_text(json.dumps({key: ["<pad>", "<unk>"]}))
    np.save(tmp_path / "test_ims.npy", np.ones((50, 4), dtype=np.float32))
    out = tmp_path / "i.zarr"
    assert main(["import", "--npy", str(tmp_path / "test_ims.npy"), "--data", str(data), "--split", "test",
                 "--out", str(out)]) == 0
    assert FeatureStore(out).n_blocks == 3
    report = verify_store(out)
    assert report.ok, report.lines()
    x, valid = read_matrix(str(out))
    assert np.flatnonzero(valid).tolist() == list(range(2050, 2100)) and (x[2050:] == 1).all()


# -- 9: rethreshold is atomic -------------------------------------------------------------------
@pytest.fixture
def fne_store(data, tmp_path) -> Path:
    out = tmp_path / "f.zarr"
    store = new_store(out, 8, block=3, name="fne/raw", config={"cnn": "colour", "thresholds": [-0.25, 0.15]})
    extract(store, paths_of(data), ColourFactory("fne/raw"), InProcessExecutor(), progress=False)
    finish_fne(store, np.arange(8) < 5, -0.25, 0.15)
    store.set_attrs(complete=True)
    return out


def ternary_state(path: Path) -> tuple[list[float], np.ndarray]:
    """The thresholds the readable ternary array carries and its values; checks they agree."""
    from features.store.ternary import ternarize

    store = FeatureStore(path)
    tern = store.array(TERNARY)
    low, high = tern.attrs["thresholds"]
    raw = store.array("fne/raw")[:]
    values = tern[:]
    expected = ternarize(raw, store.array("fne/mean")[:], store.array("fne/std")[:], low, high)
    np.testing.assert_array_equal(values, expected)
    np.testing.assert_array_equal(read_matrix(f"{path}:fne")[0], values.astype(np.float32))
    return [low, high], values


@pytest.mark.parametrize("step", ["write", "rename-old", "rename-new", "remove-old", "attributes"])
def test_rethreshold_killed_at_any_step_leaves_a_complete_array(fne_store, monkeypatch, step):
    class Killed(BaseException):
        pass

    def fail(*args, **kwargs):
        raise Killed(step)

    real_replace, real_rmtree = os.replace, store_module.shutil.rmtree

    def replace(src, dst):  # os.replace also writes every Zarr chunk: pick the two folder renames
        if (step, Path(src).name, Path(dst).name) in (("rename-old", "ternary", "ternary_old"),
                                                      ("rename-new", "ternary_new", "ternary")):
            fail()
        real_replace(src, dst)

    def rmtree(path, *a, **k):
        if step == "remove-old" and Path(path).name == "ternary_old":
            fail()
        real_rmtree(path, *a, **k)

    old_values = ternary_state(fne_store)[1]
    if step == "write":
        real_write = store_module.StoreArray.__setitem__

        def write(self, key, value):  # dies after the first block of the new array
            real_write(self, key, value)
            if self.name == TERNARY_NEW:
                fail()
        monkeypatch.setattr(store_module.StoreArray, "__setitem__", write)
    monkeypatch.setattr(store_module.os, "replace", replace)
    monkeypatch.setattr(store_module.shutil, "rmtree", rmtree)
    if step == "attributes":
        monkeypatch.setattr(FeatureStore, "set_attrs", fail)
    with pytest.raises(Killed):
        rethreshold_store(fne_store, -1.0, 1.0)
    monkeypatch.undo()

    # whatever the step, a reader sees one complete array that agrees with its thresholds
    thresholds, values = ternary_state(fne_store)
    if step in ("write", "rename-old"):
        assert thresholds == [-0.25, 0.15]
        np.testing.assert_array_equal(values, old_values)
    else:
        assert thresholds == [-1.0, 1.0]
    # the next writer finishes the job: no leftovers, attributes follow the array
    store = FeatureStore(fne_store, mode="r+")
    store.recover()
    assert not (fne_store / TERNARY_NEW).exists() and not (fne_store / TERNARY_OLD).exists()
    assert store.attrs["config"]["thresholds"] == thresholds == store.attrs["provenance"]["thresholds"]
    rethreshold_store(fne_store, -1.0, 1.0)
    assert ternary_state(fne_store)[0] == [-1.0, 1.0]
    assert verify_store(fne_store).ok


def test_sigkilled_rethreshold_leaves_a_complete_array(fne_store):
    """A real kill in the middle of writing the new array: the old one is untouched and readable."""
    old_thresholds, old_values = ternary_state(fne_store)
    code = ("import sys, time\n"
            "from features.store import core as S\n"
            "from features.run import rethreshold_store\n"
            "real = S.StoreArray.__setitem__\n"
            "def slow(self, key, value):\n"
            "    real(self, key, value)\n"
            "    if self.name == S.TERNARY_NEW:\n"
            "        print('writing', flush=True); time.sleep(60)\n"
            "S.StoreArray.__setitem__ = slow\n"
            f"rethreshold_store(S.Path({str(fne_store)!r}), -1.0, 1.0)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (fne_store / TERNARY_NEW).exists()
    thresholds, values = ternary_state(fne_store)
    assert thresholds == old_thresholds
    np.testing.assert_array_equal(values, old_values)
    rethreshold_store(fne_store, -1.0, 1.0)  # the lock of the killed run is stale, the leftover removed
    assert ternary_state(fne_store)[0] == [-1.0, 1.0] and not (fne_store / TERNARY_NEW).exists()


# -- issue 41.5 and 41.9: where `features import` and `features cnn` may write ---------------------------
def test_import_out_a_dangling_link_a_users_file_and_a_killed_creation(tmp_path, capsys):
    """`features import --out` a symbolic link to nowhere is one line (it was a NotADirectoryError traceback);
    the half-built store a kill left beside `--out` (`.NAME.XXXXXXXX.partial`) is removed by the next import
    holding the lock (it stayed for ever); `--overwrite` keeps a store holding a file features did not
    write (it was deleted with the store)."""
    from helpers import minimal_prepared

    data = minimal_prepared(tmp_path / "data", 8, 4)
    npy = tmp_path / "train.npy"
    np.save(npy, np.random.default_rng(0).random((8, 16), dtype=np.float32))
    argv = ["import", "--format", "precomp", "--npy", str(npy), "--data", str(data), "--split", "train",
            "--out"]
    link = tmp_path / "o.zarr"
    link.symlink_to(tmp_path / "nowhere")
    assert main([*argv, str(link)]) == 2
    assert f"--out {link}: is a symbolic link to {tmp_path / 'nowhere'}, which does" in one_line_error(capsys)
    out = tmp_path / "s.zarr"
    stale = tmp_path / ".s.zarr.k9x2m4q1.partial"  # what a SIGKILL while the store was created leaves
    (stale / "imgid").mkdir(parents=True)
    (stale / "zarr.json").write_text("{}")
    assert main([*argv, str(out)]) == 0
    assert "features: removed .s.zarr.k9x2m4q1.partial (left by a killed run)" in capsys.readouterr().err
    assert not stale.exists()
    (out / "NOTES.txt").write_text("mine")
    assert main([*argv, str(out), "--overwrite"]) == 2
    err = one_line_error(capsys)
    assert "a feature store, but it also holds 'NOTES.txt', which features did not write" in err
    assert (out / "NOTES.txt").read_text() == "mine"


def test_overwrite_keeps_a_store_holding_a_users_file_before_the_model_loads(data, tmp_path, monkeypatch,
                                                                              capsys):
    out = tmp_path / "s.zarr"
    assert cnn(data, out) == 0
    capsys.readouterr()
    (out / "global" / "NOTES.txt").write_text("mine")
    monkeypatch.setattr("features.run.cached_mapper", lambda f: pytest.fail("the model was loaded"))
    assert cnn(data, out, "--overwrite") == 2
    assert "also holds 'global/NOTES.txt', which features did not write" in one_line_error(capsys)
    assert (out / "global" / "NOTES.txt").read_text() == "mine" and FeatureStore(out).attrs["complete"]
