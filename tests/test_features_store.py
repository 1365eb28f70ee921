"""Feature store and block runner, in-process, with a small deterministic mapper on real COCO images.

``helpers.ColourMapper`` (per-image colour statistics of a 16x16 thumbnail) stands in for a CNN so these
tests pin the store and the runner, not a network; ``helpers.make_image_dataset`` builds a tiny prepared
dataset over ``coco_sample`` images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import ColourFactory, ColourMapper, make_image_dataset, new_store, paths_of
from PIL import Image

from features.executors.extract import block_tasks, extract, run_block
from features.executors.in_process import InProcessExecutor
from features.extractors.images import load_image
from features.store.read import parse_spec, read_matrix
from features.store.ternary import finish_fne, fne_statistics, ternarize, write_ternary
from vsecore.errors import UserError


@pytest.fixture(scope="module")
def small(coco_sample, tmp_path_factory) -> Path:
    return make_image_dataset(tmp_path_factory.mktemp("prep"), coco_sample, 10)


def test_extract_writes_rows_in_dataset_order(small, tmp_path):
    paths = paths_of(small)
    store = new_store(tmp_path / "s.zarr", len(paths), block=4)
    summary = extract(store, paths, ColourFactory(), InProcessExecutor(), progress=False)
    assert (summary.rows_written, summary.rows_skipped, summary.failures) == (10, 0, [])
    expected = ColourMapper()([load_image(p) for p in paths])["global"]
    np.testing.assert_array_equal(store.array("global")[:], expected)
    np.testing.assert_array_equal(store.array("imgid")[:], np.arange(10))
    assert store.blocks_done().tolist() == [True, True, True]
    assert store.array("valid")[:].all()
    assert store.array("global").chunks == (4, 12)  # chunks along rows = blocks


def test_resume_skips_done_blocks_and_equals_uninterrupted(small, tmp_path):
    paths = paths_of(small)
    full = new_store(tmp_path / "full.zarr", 10, block=3)
    extract(full, paths, ColourFactory(), InProcessExecutor(), progress=False)
    part = new_store(tmp_path / "part.zarr", 10, block=3)
    first = block_tasks(part, paths)[:2]
    for task in first:
        run_block(task, ColourMapper())
    again = new_store(tmp_path / "part.zarr", 10, block=3)  # same command again: resume
    summary = extract(again, paths, ColourFactory(), InProcessExecutor(), progress=False)
    assert (summary.rows_written, summary.rows_skipped) == (4, 6)
    np.testing.assert_array_equal(again.array("global")[:], full.array("global")[:])
    # a retried task whose block is already flagged does nothing
    assert run_block(first[0], ColourMapper()).already_done


def test_flag_is_written_after_rows(small, tmp_path):
    """A block killed between its rows and its flag is recomputed, never taken as done."""
    paths = paths_of(small)
    store = new_store(tmp_path / "s.zarr", 10, block=5)
    store.array("global")[0:5] = 0.0  # rows of a block whose flag never got written
    assert [t.block for t in block_tasks(store, paths)] == [0, 1]


def test_bad_images_are_recorded_and_nan(coco_sample, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    good = sorted((coco_sample / "images").iterdir())[0].read_bytes()
    (bad / "truncated.jpg").write_bytes(good[: len(good) // 3])
    (bad / "noise.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg" * 10)
    Image.new("1", (10_000, 10_000)).save(bad / "bomb.png")
    extra = {1: bad / "truncated.jpg", 4: bad / "noise.jpg", 6: bad / "bomb.png", 7: bad / "missing.jpg"}
    data = make_image_dataset(tmp_path / "prep", coco_sample, 8, extra=extra)
    paths = paths_of(data)
    store = new_store(tmp_path / "s.zarr", 8, block=3)
    summary = extract(store, paths, ColourFactory(), InProcessExecutor(), progress=False)
    failed = {f["imgid"]: f["reason"] for f in summary.failures}
    assert sorted(failed) == [1, 4, 6, 7]
    assert "truncated" in failed[1] and "bomb" in failed[6] and "missing" in failed[7]
    assert [f["imgid"] for f in store.block_failures()] == [1, 4, 6, 7]
    valid = store.array("valid")[:]
    assert valid.tolist() == [i not in failed for i in range(8)]
    x = store.array("global")[:]
    assert np.isnan(x[~valid]).all() and np.isfinite(x[valid]).all()
    store.set_attrs(complete=True)
    _, v = read_matrix(f"{store.path}:global")
    assert v.tolist() == valid.tolist()

    fresh = new_store(tmp_path / "f.zarr", 8, block=3)
    with pytest.raises(UserError, match="truncated.jpg"):
        extract(fresh, paths, ColourFactory(), InProcessExecutor(), on_error="fail", progress=False)
    assert fresh.blocks_done().tolist() == [False, False, False]


def test_changed_configuration_is_an_error_and_overwrite_starts_over(small, tmp_path):
    paths = paths_of(small)
    store = new_store(tmp_path / "s.zarr", 10, block=4, config={"cnn": "colour", "crops": 10})
    extract(store, paths, ColourFactory(), InProcessExecutor(), progress=False)
    with pytest.raises(UserError, match=r"crops=10.*crops=1 "):
        new_store(tmp_path / "s.zarr", 10, block=4, config={"cnn": "colour", "crops": 1})
    again = new_store(tmp_path / "s.zarr", 10, block=4, config={"cnn": "colour", "crops": 1}, overwrite=True)
    assert not again.blocks_done().any() and again.attrs["config"]["crops"] == 1
    assert np.isnan(again.array("global")[:]).all()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(UserError, match="not a feature store"):
        new_store(tmp_path / "mine", 10, block=4, overwrite=True)
    assert (tmp_path / "mine" / "thesis.tex").exists()


def test_read_matrix_specs_and_incomplete_store(small, tmp_path):
    paths = paths_of(small)
    store = new_store(tmp_path / "s.zarr", 10, block=4)
    with pytest.raises(UserError, match="incomplete"):
        read_matrix(str(store.path))
    extract(store, paths, ColourFactory(), InProcessExecutor(), progress=False)
    store.set_attrs(complete=True)
    x, valid = read_matrix(str(store.path))
    assert x.dtype == np.float32 and x.shape == (10, 12) and valid.all()
    np.testing.assert_array_equal(x, read_matrix(f"{store.path}:global")[0])
    with pytest.raises(UserError, match="no 'fne' features"):
        read_matrix(f"{store.path}:fne")
    assert parse_spec("/a/b:c.zarr:fne_raw") == (Path("/a/b:c.zarr"), "fne_raw")
    assert parse_spec("/a/s.zarr") == (Path("/a/s.zarr"), None)


def test_fne_statistics_from_train_rows_and_rethreshold(small, tmp_path):
    paths = paths_of(small)
    store = new_store(tmp_path / "s.zarr", 10, block=4, name="fne/raw")
    extract(store, paths, ColourFactory("fne/raw"), InProcessExecutor(), progress=False)
    train = np.array([i < 6 for i in range(10)])
    finish_fne(store, train, -0.25, 0.15)
    raw = store.array("fne/raw")[:]
    mean, std = store.array("fne/mean")[:], store.array("fne/std")[:]
    np.testing.assert_allclose(mean, raw[:6].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(std, raw[:6].std(0), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(store.array("fne/ternary")[:], ternarize(raw, *fne_statistics(raw, train)))
    write_ternary(store, -1.0, 1.0)
    tern = store.array("fne/ternary")[:]
    np.testing.assert_array_equal(tern, ternarize(raw, mean, std, -1.0, 1.0))
    assert tern.dtype == np.int8 and set(np.unique(tern)) <= {-1, 0, 1}
    store.set_attrs(complete=True)
    x, _ = read_matrix(f"{store.path}:fne")
    np.testing.assert_array_equal(x, tern.astype(np.float32))
    np.testing.assert_array_equal(read_matrix(f"{store.path}:fne_raw")[0], raw)
