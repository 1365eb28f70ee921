"""Export to / import from other codebases: VSE++/SCAN precomp ``{split}_ims.npy`` and HDF5."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import ColourFactory, make_image_dataset, new_store, paths_of

from features.cli import main
from features.executors.extract import extract
from features.executors.in_process import InProcessExecutor
from features.store.core import FeatureStore
from features.store.read import read_matrix
from features.store.ternary import finish_fne
from prep.dataset import PreparedDataset

SPLITS = ["train", "val", "train", "test", "val", "train", "test", "train", "train"]


@pytest.fixture(scope="module")
def data(coco_sample, tmp_path_factory) -> Path:
    return make_image_dataset(tmp_path_factory.mktemp("prep"), coco_sample, 9, splits=SPLITS)


@pytest.fixture(scope="module")
def store(data, tmp_path_factory) -> FeatureStore:
    store = new_store(tmp_path_factory.mktemp("s") / "s.zarr", 9, block=4)
    extract(store, paths_of(data), ColourFactory(), InProcessExecutor(), progress=False)
    store.set_attrs(complete=True)
    return store


def rows_of(split: str) -> list[int]:
    return [i for i, s in enumerate(SPLITS) if s == split]


def test_precomp_export_and_import_round_trip(data, store, tmp_path):
    x = store.array("global")[:]
    assert main(["export", "--store", str(store.path), "--data", str(data), "--format", "precomp",
                 "--out", str(tmp_path / "precomp")]) == 0
    names = sorted(p.name for p in (tmp_path / "precomp").iterdir())
    assert names == sorted(f"{p}_{k}" for p in ("dev", "test", "train")
                           for k in ("ims.npy", "caps.txt", "ids.json"))
    dataset = PreparedDataset.load(data)
    for split, prefix in (("train", "train"), ("val", "dev"), ("test", "test")):
        ims = np.load(tmp_path / "precomp" / f"{prefix}_ims.npy")
        assert ims.dtype == np.float32
        np.testing.assert_array_equal(ims, x[rows_of(split)])
        caps = (tmp_path / "precomp" / f"{prefix}_caps.txt").read_text().splitlines()
        assert caps == [s.raw for s in dataset.sentences_of(split)] and len(caps) == len(rows_of(split))
        ids = json.loads((tmp_path / "precomp" / f"{prefix}_ids.json").read_text())
        assert [im["imgid"] for im in ids["images"]] == rows_of(split)
        assert [im["file"] for im in ids["images"]] == [f"images/{dataset.images[r].filename}"
                                                        for r in rows_of(split)]
        assert ids["captions_per_image"] == {"en": 1}

    out = tmp_path / "imported.zarr"
    for split, prefix in (("test", "test"), ("train", "train")):
        assert main(["import", "--npy", str(tmp_path / "precomp" / f"{prefix}_ims.npy"), "--data", str(data),
                     "--split", split, "--out", str(out)]) == 0
    y, valid = read_matrix(str(out))
    have = sorted(rows_of("train") + rows_of("test"))
    assert np.flatnonzero(valid).tolist() == have
    np.testing.assert_array_equal(y[have], x[have])
    assert np.isnan(y[rows_of("val")]).all()
    assert set(FeatureStore(out).attrs["provenance"]["imported_from"]) == {"test", "train"}


def test_import_checks_the_row_count(data, tmp_path, capsys):
    np.save(tmp_path / "wrong.npy", np.zeros((5, 3), dtype=np.float32))
    assert main(["import", "--npy", str(tmp_path / "wrong.npy"), "--data", str(data), "--split", "test",
                 "--out", str(tmp_path / "i.zarr")]) == 2
    assert "5 rows, but split 'test'" in capsys.readouterr().err


def test_hdf5_export(data, store, tmp_path):
    assert main(["export", "--store", str(store.path), "--data", str(data), "--format", "hdf5",
                 "--out", str(tmp_path / "f.h5")]) == 0
    with h5py.File(tmp_path / "f.h5", "r") as h5:
        np.testing.assert_array_equal(h5["global"][:], store.array("global")[:])
        assert h5["imgid"][:].tolist() == list(range(9))
        assert [s.decode() for s in h5["split"][:]] == SPLITS
        assert "colour" in h5.attrs["provenance"]
        files = [f"images/{im.filename}" for im in PreparedDataset.load(data).images]
        assert [f.decode() for f in h5["filename"][:]] == files
        assert h5["cocoid"][:].tolist() == [-1] * 9  # no COCO ids in this dataset


def test_hdf5_import_round_trip_and_identity(data, store, coco_sample, tmp_path, capsys):
    x = store.array("global")[:]
    h5file = tmp_path / "f.h5"
    assert main(["export", "--store", str(store.path), "--data", str(data), "--format", "hdf5",
                 "--out", str(h5file)]) == 0
    with h5py.File(h5file, "a") as h5:  # a failed image and a NaN row, as another codebase may have them
        h5["valid"][2] = False
        g = h5["global"][:]
        g[4, 0] = np.nan
        h5["global"][...] = g
    out = tmp_path / "in.zarr"
    assert main(["import", "--format", "hdf5", "--h5", str(h5file), "--data", str(data),
                 "--out", str(out)]) == 0
    assert "2 of 9 imported rows hold NaN or inf" in capsys.readouterr().out
    y, valid = read_matrix(str(out))
    assert np.flatnonzero(~valid).tolist() == [2, 4]
    np.testing.assert_array_equal(y[valid], x[valid])
    assert set(FeatureStore(out).attrs["provenance"]["imported_from"]) == {"hdf5"}

    only = tmp_path / "test.zarr"  # --split keeps those rows only
    assert main(["import", "--format", "hdf5", "--h5", str(h5file), "--data", str(data), "--split", "test",
                 "--out", str(only)]) == 0
    assert np.flatnonzero(read_matrix(str(only))[1]).tolist() == rows_of("test")

    tenth = sorted((coco_sample / "images").iterdir())[9]  # same size, another image at row 3
    other = make_image_dataset(tmp_path / "other", coco_sample, 9, splits=SPLITS, extra={3: tenth})
    assert main(["import", "--format", "hdf5", "--h5", str(h5file), "--data", str(other),
                 "--out", str(tmp_path / "x.zarr")]) == 2
    err = capsys.readouterr().err.strip()
    assert "made for another prepared dataset" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.zarr").exists()
    assert main(["import", "--format", "hdf5", "--npy", str(h5file), "--data", str(data),
                 "--out", str(tmp_path / "y.zarr")]) == 2
    assert "reads --h5 FILE.h5" in capsys.readouterr().err


def test_coco_5k_test_split_is_written_as_scan_testall_and_test(coco_sample, tmp_path, capsys):
    """A 5,000-image test split: testall = all, test = the first 1,000 (SCAN's coco_precomp layout)."""
    n = 5000
    root = tmp_path / "p"
    names = sorted(p.name for p in (coco_sample / "images").iterdir())
    images = [{"imgid": i, "split": "test", "filename": names[i % len(names)], "filepath": "images",
               "cocoid": 10_000 + i, "sentids": [i],
               "sentences": [{"sentid": i, "imgid": i, "raw": f"caption {i}", "tokens": ["caption"],
                              "lang": "en"}]} for i in range(n)]
    root.mkdir()
    (root / "dataset.json").write_text(json.dumps({"dataset": "coco", "languages": ["en"], "pairs": [],
                                                   "images_root": str(coco_sample), "images": images}))
    (root / "chars.json").write_text(json.dumps({"symbols": ["<pad>", "<unk>", "a"]}))
    (root / "words.json").write_text(json.dumps({"tokens": ["<pad>", "<unk>", "a"]}))
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    np.save(tmp_path / "testall_ims.npy", x)
    assert main(["import", "--npy", str(tmp_path / "testall_ims.npy"), "--data", str(root), "--split", "test",
                 "--out", str(tmp_path / "s.zarr")]) == 0
    out = tmp_path / "precomp"
    assert main(["export", "--store", str(tmp_path / "s.zarr"), "--data", str(root), "--format", "precomp",
                 "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{p}_{k}" for p in ("test", "testall") for k in ("ims.npy", "caps.txt", "ids.json"))
    np.testing.assert_array_equal(np.load(out / "testall_ims.npy"), x)
    np.testing.assert_array_equal(np.load(out / "test_ims.npy"), x[:1000])
    assert (out / "test_caps.txt").read_text().splitlines() == [f"caption {i}" for i in range(1000)]
    assert len((out / "testall_caps.txt").read_text().splitlines()) == n
    assert json.loads((out / "test_ids.json").read_text())["images"][999]["cocoid"] == 10_999
    capsys.readouterr()
    assert main(["import", "--npy", str(out / "test_ims.npy"), "--data", str(root), "--split", "test",
                 "--out", str(tmp_path / "t.zarr")]) == 2
    assert "import testall_ims.npy" in capsys.readouterr().err


def test_fne_hdf5_and_invalid_rows_refused(coco_sample, tmp_path, capsys):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    data = make_image_dataset(tmp_path / "prep", coco_sample, 6, splits=["train"] * 4 + ["test"] * 2,
                         extra={5: bad})
    store = new_store(tmp_path / "f.zarr", 6, block=4, name="fne/raw")
    extract(store, paths_of(data), ColourFactory("fne/raw"), InProcessExecutor(), progress=False)
    finish_fne(store, np.array([True] * 4 + [False] * 2), -0.25, 0.15)
    store.set_attrs(complete=True)
    assert main(["export", "--store", f"{store.path}:fne", "--data", str(data), "--format", "precomp",
                 "--out", str(tmp_path / "p")]) == 2
    assert "imgid 5" in capsys.readouterr().err
    assert main(["export", "--store", f"{store.path}:fne", "--data", str(data), "--format", "hdf5",
                 "--out", str(tmp_path / "f.h5"), "--split", "train"]) == 0
    with h5py.File(tmp_path / "f.h5", "r") as h5:
        assert h5["fne/ternary"].dtype == np.int8 and h5["fne/ternary"].shape == (4, 12)
        np.testing.assert_array_equal(h5["fne/mean"][:], store.array("fne/mean")[:])
        assert h5["valid"][:].all()
