"""Export to / import from other codebases: VSE++/SCAN precomp ``{split}_ims.npy`` and HDF5."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from test_features_store import ColourFactory, make_prepared, new_store, paths_of

from features.cli import main
from features.executors import InProcessExecutor
from features.extract import extract, finish_fne
from features.store import FeatureStore, read_matrix

SPLITS = ["train", "val", "train", "test", "val", "train", "test", "train", "train"]


@pytest.fixture(scope="module")
def data(coco_sample, tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("prep"), coco_sample, 9, splits=SPLITS)


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
    assert names == ["dev_ims.npy", "test_ims.npy", "train_ims.npy"]
    for split, prefix in (("train", "train"), ("val", "dev"), ("test", "test")):
        ims = np.load(tmp_path / "precomp" / f"{prefix}_ims.npy")
        assert ims.dtype == np.float32
        np.testing.assert_array_equal(ims, x[rows_of(split)])

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


def test_fne_hdf5_and_invalid_rows_refused(coco_sample, tmp_path, capsys):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    data = make_prepared(tmp_path / "prep", coco_sample, 6, splits=["train"] * 4 + ["test"] * 2,
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
