"""Region stores: ``features regions`` (grid and Faster R-CNN) through the block runner, resumption, bad
images, ``features verify``, ``read_regions``, and ``features import --format scan-precomp|butd-tsv`` /
``features export`` of region stores (files written here in their exact formats).

Small inputs keep it fast: random weights, 64-pixel grid views (2 x 2 = 4 regions of 1280), a 128-pixel
detector scale, a few real COCO images, one torch thread.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import (
    annotated_dataset,
    kill_after_first_block,
    make_image_dataset,
    random_regions,
    write_butd_tsv,
)

from features.cli import main
from features.extractors.grid_mapper import GridRegionMapper
from features.extractors.images import load_image
from features.store.core import FeatureStore
from features.store.read import read_matrix, read_regions
from features.store.verify import verify_store
from prep.dataset import PreparedDataset
from vsecore.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
GRID = ["--weights", "none", "--input-size", "64", "--device", "cpu", "--no-progress", "--threads", "1"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data(coco_sample, tmp_path_factory) -> Path:
    return make_image_dataset(tmp_path_factory.mktemp("prep"), coco_sample, 24)


@pytest.fixture(scope="module")
def grid_store(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grid") / "r.zarr"
    assert main(["regions", "--data", str(data), "--out", str(out), *GRID, "--block-size", "5"]) == 0
    return out


def test_grid_store_layout_values_and_reader(grid_store, data):
    store = FeatureStore(grid_store)
    shapes = {n: (store.array(n).shape, str(store.array(n).dtype)) for n in
              ("regions", "boxes", "counts", "image_size")}
    assert shapes == {"regions": ((24, 4, 1280), "float32"), "boxes": ((24, 4, 4), "float32"),
                      "counts": ((24,), "int32"), "image_size": ((24, 2), "int32")}
    assert store.array("regions").chunks == (5, 4, 1280)  # one chunk per block
    config = store.attrs["config"]
    assert (config["kind"], config["detector"], config["cnn"], config["input_size"]) == (
        "regions", "grid", "efficientnet_lite0", 64)
    # the rows are what the mapper gives for the images (same seeded random weights)
    ds = PreparedDataset.load(data)
    mapper = GridRegionMapper.from_config({"cnn": "efficientnet_lite0", "weights": "none", "input_size": 64})
    images = [load_image(p) for p in ds.image_paths()[:3]]
    expected = mapper(images)
    got = read_regions(str(grid_store), ds, with_boxes=True)
    np.testing.assert_array_equal(got.regions[:3], expected["regions"])
    np.testing.assert_array_equal(got.boxes[:3], expected["boxes"])
    assert got.counts.tolist() == [4] * 24 and got.valid.all() and got.counts.dtype == np.int64
    w, h = images[0].size
    np.testing.assert_array_equal(got.boxes[0, 3], [w / 2, h / 2, w, h])  # bottom-right cell
    np.testing.assert_array_equal(store.array("image_size")[0], [w, h])
    x, valid = read_matrix(f"{grid_store}:regions", ds)
    np.testing.assert_array_equal(x, got.regions)
    np.testing.assert_array_equal(read_matrix(str(grid_store))[0], x)  # a bare path finds the regions
    assert verify_store(grid_store, data).ok


def test_grid_resume_skips_and_changed_config_is_refused(grid_store, data, capsys):
    assert main(["regions", "--data", str(data), "--out", str(grid_store), *GRID, "--block-size", "5"]) == 0
    assert "wrote 0 rows, skipped 24 already done" in capsys.readouterr().out
    assert main(["regions", "--data", str(data), "--out", str(grid_store), *GRID, "--block-size", "5",
                 "--input-size", "96"]) == 2
    err = capsys.readouterr().err
    assert "input_size=64" in err and "input_size=96" in err
    assert main(["regions", "--data", str(data), "--out", str(grid_store), "--detector", "fasterrcnn",
                 "--cnn", "vgg16", "--weights", "none"]) == 2
    assert "--cnn chooses the network of --detector grid" in capsys.readouterr().err


def test_regions_resume_after_sigkill_equals_uninterrupted_run(grid_store, data, tmp_path):
    out = tmp_path / "killed.zarr"
    done = kill_after_first_block(["regions", "--data", str(data), "--out", str(out), *GRID,
                                   "--block-size", "2"], out)
    assert main(["regions", "--data", str(data), "--out", str(out), *GRID, "--block-size", "2"]) == 0
    resumed, clean = FeatureStore(out), FeatureStore(grid_store)  # clean: block size 5, same numbers
    assert resumed.attrs["summary"]["rows_skipped"] == 2 * int(done.sum())
    for name in ("regions", "boxes", "counts", "image_size", "valid"):
        np.testing.assert_array_equal(resumed.array(name)[:], clean.array(name)[:])
    assert verify_store(out).ok


def test_damaged_region_chunks_are_reported_and_recomputed(grid_store, data, tmp_path, capsys):
    out = tmp_path / "copy.zarr"
    shutil.copytree(grid_store, out)
    (out / "counts" / "c" / "1").unlink()
    (out / "regions" / "c" / "3" / "0" / "0").unlink()
    report = verify_store(out)
    assert report.blocks == {1: ["counts/c/1 missing"], 3: ["regions/c/3/0/0 missing"]}
    assert main(["regions", "--data", str(data), "--out", str(out), *GRID, "--block-size", "5"]) == 0
    assert "wrote 10 rows, skipped 14 already done" in capsys.readouterr().out
    fixed, clean = FeatureStore(out), FeatureStore(grid_store)
    for name in ("regions", "counts"):
        np.testing.assert_array_equal(fixed.array(name)[:], clean.array(name)[:])


def test_region_writers_take_the_lock(grid_store, data, tmp_path, capsys):
    from helpers import hold_lock

    np.save(tmp_path / "x.npy", np.ones((len(PreparedDataset.load(data).image_rows("test")), 4, 8),
                                        np.float32))
    before = FeatureStore(grid_store).array("regions")[:]
    holder = hold_lock(grid_store)
    try:
        for argv in (["regions", "--data", str(data), "--out", str(grid_store), *GRID, "--block-size", "5",
                      "--overwrite"],
                     ["import", "--format", "scan-precomp", "--npy", str(tmp_path / "x.npy"), "--split",
                      "test", "--data", str(data), "--out", str(grid_store), "--overwrite"]):
            capsys.readouterr()
            assert main(argv) == 2, argv
            assert f"pid {holder.pid}" in capsys.readouterr().err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    np.testing.assert_array_equal(FeatureStore(grid_store).array("regions")[:], before)


def test_bad_image_is_recorded_invalid(coco_sample, tmp_path, capsys):
    bad = tmp_path / "truncated.jpg"
    good = sorted((coco_sample / "images").iterdir())[0].read_bytes()
    bad.write_bytes(good[: len(good) // 4])
    data = make_image_dataset(tmp_path / "prep", coco_sample, 4, extra={2: bad})
    out = tmp_path / "r.zarr"
    assert main(["regions", "--data", str(data), "--out", str(out), *GRID, "--block-size", "3"]) == 0
    assert "1 failed" in capsys.readouterr().out
    got = read_regions(str(out))
    assert got.valid.tolist() == [True, True, False, True] and got.counts.tolist() == [4, 4, 0, 4]
    assert np.isnan(got.regions[2]).all() and np.isfinite(got.regions[[0, 1, 3]]).all()
    store = FeatureStore(out)
    assert [f["imgid"] for f in store.attrs["failures"]] == [2]
    assert store.array("counts")[2] == 0 and np.isnan(store.array("boxes")[2]).all()
    assert verify_store(out).ok


def test_fasterrcnn_adaptive_boxes_store_and_verify_finds_bad_counts(coco_sample, tmp_path):
    data = make_image_dataset(tmp_path / "prep", coco_sample, 2)
    out = tmp_path / "f.zarr"
    assert main(["regions", "--detector", "fasterrcnn", "--weights", "none", "--input-size", "128",
                 "--min-boxes", "2", "--max-boxes", "12", "--data", str(data), "--out", str(out),
                 "--device", "cpu", "--no-progress"]) == 0
    store = FeatureStore(out)
    config = store.attrs["config"]
    assert (config["detector"], config["min_boxes"], config["max_boxes"], config["min_size"]) == (
        "fasterrcnn", 2, 12, 128)
    got = read_regions(str(out), with_boxes=True)
    assert got.regions.shape == (2, 12, 1024) and ((got.counts >= 2) & (got.counts <= 12)).all()
    for i, n in enumerate(got.counts):
        assert (got.regions[i, n:] == 0).all() and (got.boxes[i, n:] == 0).all()
        w, h = store.array("image_size")[i]
        assert (got.boxes[i, :n, 2] <= w + 1e-3).all() and (got.boxes[i, :n, 3] <= h + 1e-3).all()
    assert verify_store(out).ok
    # counts that do not describe the rows are damage
    counts = store.array("counts")[:]
    FeatureStore(out, mode="r+").array("counts")[:] = np.where(np.arange(2) == 0, 13, counts)
    report = verify_store(out)
    assert not report.ok and "counts: valid rows 0 outside 1..12" in " ".join(report.blocks[0])
    with pytest.raises(UserError, match="imgid 0 is valid but has 13 regions"):
        read_regions(str(out))
    FeatureStore(out, mode="r+").array("counts")[:] = [counts[0], counts[1] - 1]  # still >= 1
    assert "regions: rows 1 hold non-zero regions after their counts" in " ".join(verify_store(out).blocks[0])


# --- import / export -----------------------------------------------------------------------------------


def test_scan_precomp_import_missing_nonfinite_padding_and_export_round_trip(tmp_path, capsys):
    splits = ["train", "test", "train", "val", "test", "train"]
    data = annotated_dataset(tmp_path, [f"{i}.jpg" for i in range(6)], splits,
                             cocoids=[10, 11, 12, 13, 14, 15])
    rng = np.random.default_rng(0)
    train = rng.standard_normal((3, 5, 8)).astype(np.float32)
    train[1, 3:] = 0  # an image with 3 real regions, zero padding after them
    train[2, 0, 0] = np.nan
    np.save(tmp_path / "train_ims.npy", train)
    test = rng.standard_normal((1, 5, 8)).astype(np.float32)  # the test split has 2 images: one by id
    np.save(tmp_path / "test_ims.npy", test)
    (tmp_path / "test_ids.txt").write_text("000014\n")
    out = tmp_path / "i.zarr"
    root = str(data.root)
    assert main(["import", "--format", "scan-precomp", "--npy", str(tmp_path / "train_ims.npy"), "--split",
                 "train", "--data", root, "--out", str(out)]) == 0
    assert "1 of 3 imported rows hold NaN or inf and are stored invalid (imgid 5)" in capsys.readouterr().out
    assert main(["import", "--format", "scan-precomp", "--npy", str(tmp_path / "test_ims.npy"), "--ids",
                 str(tmp_path / "test_ids.txt"), "--split", "test", "--data", root, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 images of the dataset have no features in the file and are stored invalid (imgid 1)" in text
    got = read_regions(str(out), data, with_boxes=True)
    assert got.valid.tolist() == [True, False, True, False, True, False]  # val never imported
    assert got.counts.tolist() == [5, 0, 3, 0, 5, 0] and got.boxes is None
    np.testing.assert_array_equal(got.regions[[0, 2]], train[:2])
    np.testing.assert_array_equal(got.regions[4], test[0])
    store = FeatureStore(out)
    reasons = {f["imgid"]: f["reason"] for f in store.block_failures()}
    assert sorted(reasons) == [1, 5] and "no features" in reasons[1] and "non-finite" in reasons[5]
    assert set(store.attrs["provenance"]["imported_from"]) == {"train", "test"}
    assert verify_store(out).ok
    # export: SCAN's (n, k, D) per split; failed rows only with --allow-invalid
    assert main(["export", "--store", f"{out}:regions", "--data", root, "--format", "precomp",
                 "--out", str(tmp_path / "exp")]) == 2
    assert "--allow-invalid" in capsys.readouterr().err
    assert main(["export", "--store", str(out), "--data", root, "--format", "precomp", "--split", "train",
                 "--allow-invalid", "--out", str(tmp_path / "exp")]) == 0
    exported = np.load(tmp_path / "exp" / "train_ims.npy")
    assert exported.shape == (3, 5, 8)
    np.testing.assert_array_equal(exported[:2], train[:2])
    assert main(["export", "--store", str(out), "--data", root, "--format", "hdf5", "--allow-invalid",
                 "--out", str(tmp_path / "r.h5")]) == 0
    with h5py.File(tmp_path / "r.h5") as h5:
        assert h5["regions"].shape == (6, 5, 8) and h5["counts"][:].tolist() == [5, 0, 3, 0, 5, 0]


def test_butd_tsv_import_boxes_counts_missing_and_extra(tmp_path, capsys):
    names = [f"COCO_val2014_{i:012d}.jpg" for i in (391895, 522418, 184613, 318219)]
    data = annotated_dataset(tmp_path, names, ["train", "train", "val", "test"])
    rng = np.random.default_rng(3)
    regions = {cid: random_regions(rng, n, 16) for cid, n in ((391895, 10), (184613, 7), (318219, 4), (9, 3))}
    write_butd_tsv(tmp_path / "a.tsv.0", [(cid, 640, 480, *regions[cid]) for cid in (318219, 391895)])
    write_butd_tsv(tmp_path / "a.tsv.1", [(cid, 640, 480, *regions[cid]) for cid in (184613, 9)],
               python3_bytes=True)
    out = tmp_path / "t.zarr"
    assert main(["import", "--format", "butd-tsv", "--tsv", str(tmp_path / "a.tsv.0"), "--tsv",
                 str(tmp_path / "a.tsv.1"), "--data", str(data.root), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "have no features in the file and are stored invalid (imgid 1)" in text
    assert "1 ids of the file match no image of the dataset (ignored; e.g. 9)" in text
    got = read_regions(str(out), data, with_boxes=True)
    assert got.regions.shape == (4, 10, 16) and got.counts.tolist() == [10, 0, 7, 4]
    assert got.valid.tolist() == [True, False, True, True]
    for row, cid in ((0, 391895), (2, 184613), (3, 318219)):
        boxes, feats = regions[cid]
        n = len(boxes)
        np.testing.assert_array_equal(got.regions[row, :n], feats)
        np.testing.assert_array_equal(got.boxes[row, :n], boxes)
        assert (got.regions[row, n:] == 0).all()
    np.testing.assert_array_equal(FeatureStore(out).array("image_size")[3], [640, 480])
    assert verify_store(out).ok
    # the wrong input for a format is one line
    assert main(["import", "--format", "butd-tsv", "--npy", str(tmp_path / "x.npy"), "--data",
                 str(data.root), "--out", str(out)]) == 2
    assert "reads --tsv FILE" in capsys.readouterr().err
    assert main(["import", "--format", "scan-precomp", "--npy", str(tmp_path / "x.npy"), "--data",
                 str(data.root), "--out", str(out)]) == 2
    assert "--split is required" in capsys.readouterr().err


def test_read_regions_of_a_store_written_directly(tmp_path):
    """What a trainer's test does: a store written with FeatureStore, counts derived when absent."""
    regions = np.zeros((3, 4, 2), dtype=np.float32)
    regions[0, :2], regions[1, :4], regions[2, :1] = 1.0, 2.0, 3.0
    store = FeatureStore.create(tmp_path / "s.zarr", np.arange(3), {"regions": (4, 2)}, 3, {}, {})
    store.write_block(0, {"regions": regions}, np.ones(3, dtype=bool), [])
    store.set_attrs(complete=True)
    got = read_regions(str(tmp_path / "s.zarr"))
    assert got.counts.tolist() == [2, 4, 1] and got.boxes is None
    np.testing.assert_array_equal(got.regions, regions)
    json.dumps(store.attrs)  # the attributes stay plain JSON
