"""Rows of a sharded (region) array read straight from the shard files (features.store.rows.ShardRows, issue
33.1): the same bits as Zarr's own reader, damage named in one line."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from features.store.core import FeatureStore
from features.store.rows import ShardRows, StoreRows
from vsecore.errors import UserError

#: rows of 35,840 bytes in either dtype: over SHARD_ROW_BYTES, so one inner chunk per row in a shard per block
ROWS, BLOCK, SHAPES = 70, 16, {"float16": (28, 640), "float32": (14, 640)}


def make_store(path: Path, dtype: str = "float16") -> FeatureStore:
    shape = SHAPES[dtype]
    store = FeatureStore.create(path, np.arange(ROWS), {"regions": shape}, BLOCK, config={"kind": "regions"},
                                provenance={}, dtypes={"regions": dtype})
    rng = np.random.default_rng(3)
    for block in range(store.n_blocks):
        start, stop = store.block_rows(block)
        x = np.maximum(rng.standard_normal((stop - start, *shape)), 0).astype(dtype)
        x[:, -2:] = 0  # padded regions, as a store with fewer boxes than k has
        store.write_block(block, {"regions": x}, np.ones(stop - start, bool), [])
    store.set_attrs(complete=True)
    return FeatureStore(path)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_direct_reads_are_zarr_reads_bit_for_bit(tmp_path: Path, dtype: str) -> None:
    store = make_store(tmp_path / "r.zarr", dtype)
    array = store.array("regions")
    assert array.zarr.shards is not None and ShardRows.matches(array)
    rows = StoreRows(store, "regions", np.ones(ROWS, bool), store.opened_state)
    assert rows.direct
    rng = np.random.default_rng(0)
    batches = [rng.choice(ROWS, 12, replace=True) for _ in range(5)] + [np.arange(ROWS), np.array([69, 0])]
    for batch in batches:
        got = rows.take(batch)
        want = np.asarray(array.zarr.get_orthogonal_selection((np.unique(batch),)))[
            np.unique(batch, return_inverse=True)[1]]
        assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))
    # a DataLoader worker's copy reopens the store and reads the same bits
    again = pickle.loads(pickle.dumps(rows))
    every = np.arange(ROWS)
    assert np.array_equal(again.take(every).view(np.uint8), rows.take(every).view(np.uint8))


def shard_file(store: FeatureStore, block: int) -> Path:
    array = store.array("regions")
    return store.path / array.zarr.path / array.chunk_key((block, 0, 0))


@pytest.mark.parametrize("damage", ["index", "truncated", "chunk"])
def test_a_damaged_shard_is_one_line(tmp_path: Path, damage: str) -> None:
    store = make_store(tmp_path / "r.zarr")
    file = shard_file(store, 1)
    data = bytearray(file.read_bytes())
    if damage == "index":
        data[-10] ^= 0xFF  # the CRC-32C of the index no longer matches
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data[40] ^= 0xFF  # inside the first inner chunk's zstd frame
    file.write_bytes(bytes(data))
    rows = StoreRows(FeatureStore(store.path), "regions", np.ones(ROWS, bool), store.opened_state)
    rows.take(np.arange(0, BLOCK))  # block 0 is intact
    with pytest.raises(UserError, match=r"'regions' is damaged at rows 16-31 \(chunk file regions/c/1/0/0"):
        rows.take(np.arange(BLOCK, 2 * BLOCK))
