"""Features read a batch at a time (features.store.rows, train.engine.data.read_features above the memory
limit): the same batches as the features read whole, the same refusals, and sharded region arrays."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_prepared, make_store

from features.store.core import FeatureStore
from features.store.layout import rows_per_file
from features.store.read import read_matrix
from features.store.rows import StoreRows, open_rows
from prep.dataset import PreparedDataset, Vocabulary
from train.config.run import features_fingerprint
from train.engine.codecs import TextCodec
from train.engine.data import (
    CaptionSet,
    ImageRows,
    batch_loader,
    feature_memory_limit,
    load_caption_set,
    read_features,
)
from train.engine.inference import batch_to
from vsecore.errors import UserError


def region_store(path: Path, n: int, k: int = 49, dim: int = 640, block: int = 16,
                 invalid: tuple[int, ...] = ()) -> Path:
    """A float16 region store written block by block with the store's writer (rows of 62 KB: sharded)."""
    rng = np.random.default_rng(1)
    store = FeatureStore.create(path, np.arange(n), {"regions": (k, dim), "counts": ()}, block_size=block,
                                config={"test": True}, provenance={"network": "random"},
                                dtypes={"regions": "float16", "counts": "int32"})
    for b in range(store.n_blocks):
        start, stop = store.block_rows(b)
        x = rng.standard_normal((stop - start, k, dim)).astype(np.float16)
        valid = np.array([i not in invalid for i in range(start, stop)])
        x[~valid] = np.nan
        fails = [{"imgid": i, "reason": "test"} for i in range(start, stop) if i in invalid]
        store.write_block(b, {"regions": x, "counts": np.full(stop - start, k, np.int32)}, valid, fails)
    store.set_attrs(complete=True)
    return path


def test_large_rows_are_sharded_one_row_per_chunk_one_file_per_block(tmp_path) -> None:
    path = region_store(tmp_path / "r.zarr", 40)
    arr = FeatureStore(path).array("regions")
    assert arr.zarr.chunks[0] == 1 and rows_per_file(arr.zarr) == 16
    assert sorted(p.name for p in (path / "regions" / "c").iterdir()) == ["0", "1", "2"]
    assert FeatureStore(path).array("counts").zarr.shards is None  # small rows: one chunk per block


def test_on_demand_rows_equal_the_whole_read_in_any_order(tmp_path) -> None:
    path = region_store(tmp_path / "r.zarr", 40, invalid=(7,))
    whole, valid = read_matrix(f"{path}:regions", keep_dtype=True)
    rows, valid2 = open_rows(f"{path}:regions")
    assert isinstance(rows, StoreRows) and rows.shape == whole.shape and rows.dtype == np.float16
    assert np.array_equal(valid, valid2)
    pick = np.array([39, 3, 3, 17, 16, 15, 0])
    assert np.array_equal(rows.take(pick), whole[pick])
    assert np.array_equal(rows[5:30:3], whole[5:30:3], equal_nan=True)
    assert features_fingerprint(rows, valid) == features_fingerprint(whole, valid)
    again = pickle.loads(pickle.dumps(rows))  # DataLoader workers reopen the store
    assert np.array_equal(again.take(pick), whole[pick])


def test_the_memory_limit_decides_by_size_and_batches_are_bit_identical(tmp_path, monkeypatch) -> None:
    data = make_prepared(tmp_path / "tiny")
    store = make_store(tmp_path / "tiny.zarr", data, invalid=(3,))
    ds = PreparedDataset.load(data)
    x, valid = read_features(f"{store}:global", ds)
    assert isinstance(x, np.ndarray)
    monkeypatch.setenv("VSE_FEATURE_MEMORY_MB", "0")
    assert feature_memory_limit() == 0
    lazy, valid2 = read_features(f"{store}:global", ds)
    assert isinstance(lazy, StoreRows) and np.array_equal(valid, valid2)
    a = load_caption_set(ds, x, valid, "train", "en", max_chars=256)
    b = load_caption_set(ds, lazy, valid2, "train", "en", max_chars=256)
    order = torch.randperm(len(a), generator=torch.Generator().manual_seed(0)).numpy()
    for start in range(0, len(order), 7):
        one, two = a.batch(order[start:start + 7]), b.batch(order[start:start + 7])
        assert all(torch.equal(p, q) and p.dtype == q.dtype for p, q in zip(one[:4], two[:4], strict=True))
    assert torch.equal(a.images[:], b.images[:])


@pytest.mark.parametrize("threads", ["1", "3"])
def test_a_valid_row_that_is_not_finite_is_refused_when_read(tmp_path, monkeypatch, threads) -> None:
    """Each row is checked by the thread that read it; the first bad row is named whatever the threads."""
    monkeypatch.setenv("VSE_READ_THREADS", threads)
    path = region_store(tmp_path / "r.zarr", 40, invalid=(5,))
    FeatureStore(path, mode="r+").array("regions")[21, 0, 0] = np.inf
    FeatureStore(path, mode="r+").array("regions")[35, 3, 7] = np.nan
    rows, _ = open_rows(f"{path}:regions")
    assert rows.take(np.array([1, 2, 5, 5])).shape == (4, 49, 640)  # row 5's failed image is never checked
    with pytest.raises(UserError, match="row 21 .*not finite"):
        rows.take(np.array([35, 1, 21, 21, 5]))
    with pytest.raises(UserError, match="row 35 .*not finite"):
        rows.take(np.array([35, 2, 35]))


def test_a_store_rewritten_after_opening_is_refused(tmp_path) -> None:
    path = region_store(tmp_path / "r.zarr", 40)
    rows, _ = open_rows(f"{path}:regions")
    FeatureStore(path, mode="r+").set_attrs(complete=True)  # a new generation token
    with pytest.raises(UserError, match="rewritten .*while it was being read"):
        rows.take(np.array([0]))


def test_a_damaged_shard_is_named(tmp_path) -> None:
    path = region_store(tmp_path / "r.zarr", 40)
    shard = path / "regions" / "c" / "1" / "0" / "0"
    shard.write_bytes(shard.read_bytes()[:1000])
    rows, _ = open_rows(f"{path}:regions")
    with pytest.raises(UserError, match=r"'regions' is damaged at rows 16-31 \(chunk file regions/c/1/0/0"):
        rows.take(np.array([2, 20]))


@pytest.mark.parametrize("threads", ["1", "3"])
def test_a_damaged_row_read_on_a_thread_is_named_after_every_thread_stopped(tmp_path, monkeypatch,
                                                                            threads) -> None:
    monkeypatch.setenv("VSE_READ_THREADS", threads)
    path = region_store(tmp_path / "r.zarr", 40)
    whole, _ = read_matrix(f"{path}:regions", keep_dtype=True)
    shard = path / "regions" / "c" / "1" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[8:4000] = bytes(3992)  # the first rows' zstd frames; the index at the end is intact
    shard.write_bytes(bytes(data))
    rows, _ = open_rows(f"{path}:regions")
    with pytest.raises(UserError, match=r"'regions' is damaged at rows .*\(chunk file regions/c/1/0/0"):
        rows.take(np.arange(40))
    assert np.array_equal(rows.take(np.array([0, 39])), whole[[0, 39]])  # the other shards still read


def test_the_rows_are_the_same_bits_on_any_number_of_threads(tmp_path, monkeypatch) -> None:
    path = region_store(tmp_path / "r.zarr", 70, invalid=(9,))
    whole, _ = read_matrix(f"{path}:regions", keep_dtype=True)
    pick = np.random.default_rng(4).integers(0, 70, 50)
    for threads in ("1", "2", "7"):
        monkeypatch.setenv("VSE_READ_THREADS", threads)
        rows, _ = open_rows(f"{path}:regions")
        assert np.array_equal(rows.take(pick), whole[pick], equal_nan=True)
    for bad in ("0", "two"):
        monkeypatch.setenv("VSE_READ_THREADS", bad)
        with pytest.raises(UserError, match="VSE_READ_THREADS"):
            rows.take(pick)


@pytest.mark.parametrize("workers", [0, 1])
def test_region_batches_ship_float16_and_become_the_same_float32_on_the_device(tmp_path, workers) -> None:
    """A batch carries the stored float16 (half the bytes to pin and copy); batch_to converts it, exactly:
    the values are those of the float32 rows the split gives when indexed."""
    n = 24
    rows, _ = open_rows(f"{region_store(tmp_path / 'r.zarr', n, k=4, dim=8192)}:regions")
    counts = torch.full((n,), 4, dtype=torch.int64)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 6, 3 * n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    codec = TextCodec("words", Vocabulary(["<pad>", "<unk>", "a", "b", "c"]), 50)
    data = CaptionSet(split="train", lang="en", images=ImageRows(rows, np.arange(n)[::-1].copy(), counts),
                      imgids=np.arange(n), codes=rng.integers(2, 5, int(lengths.sum())).astype(np.int16),
                      offsets=offsets, caption_image=np.repeat(np.arange(n), 3), texts=[""] * (3 * n),
                      skipped_images=0, codec=codec)
    batches = [rng.permutation(3 * n)[:10] for _ in range(4)]
    for idx, batch in zip(batches, batch_loader(data, batches, workers=workers), strict=True):
        assert batch.image_features.dtype == torch.float16 and batch.image_features.shape == (10, 4, 8192)
        moved = batch_to(batch, torch.device("cpu"))
        expected = data.images[torch.from_numpy(data.caption_image[idx])]
        assert moved.image_features.dtype == torch.float32 and expected.dtype == torch.float32
        assert torch.equal(moved.image_features, expected)
        assert torch.equal(moved.image_counts, batch.image_counts) and torch.equal(moved.text, batch.text)
