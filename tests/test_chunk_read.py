"""A whole array read straight from its chunk files (features.store.chunk_read) is Zarr's read, bit for bit:
wide and narrow chunks, partial edge chunks, absent chunks, NaN rows, every dtype the writer makes; a layout
it does not decode is left to Zarr, and a damaged chunk is still named in one line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import make_prepared, make_store
from zarr.codecs import ZstdCodec

from features.store.array import StoreArray
from features.store.chunk_read import compress_bound, matches, read_whole
from features.store.core import FeatureStore
from features.store.read import read_matrix
from vsecore.errors import UserError


@dataclass
class Folder:
    path: Path


def _array(tmp_path: Path, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: str,
           fill: float | int = 0, skip: tuple[int, ...] = ()) -> StoreArray:
    """A Zarr v3 array of the writer's codecs (bytes + zstd) with random values; chunks in ``skip`` (row
    chunk numbers) never written."""
    z = zarr.create_array(store=str(tmp_path / "s.zarr"), name="x", shape=shape, chunks=chunks, dtype=dtype,
                          compressors=ZstdCodec(level=0), fill_value=fill, zarr_format=3)
    rng = np.random.default_rng(3)
    values = (rng.standard_normal(shape) * 50).astype(dtype)
    for r in range(0, shape[0], chunks[0]):
        if r // chunks[0] not in skip:
            z[r:r + chunks[0]] = values[r:r + chunks[0]]
    return StoreArray(Folder(tmp_path / "s.zarr"), "x", zarr.open_array(str(tmp_path / "s.zarr"), path="x"))


@pytest.mark.parametrize(("shape", "chunks", "dtype"), [
    ((70, 24), (32, 24), "float32"),          # chunks as wide as the array, a partial last one
    ((70, 5000), (32, 2048), "int8"),         # narrow chunks (an FNE's), partial in both dimensions
    ((33, 7, 5), (8, 7, 5), "float16"),       # rows of more than one dimension
    ((64, 3), (32, 3), "float64"),
])
@pytest.mark.parametrize("threads", [1, 4])
def test_the_whole_read_is_zarrs_bit_for_bit(tmp_path: Path, shape, chunks, dtype, threads: int) -> None:
    array = _array(tmp_path, shape, chunks, dtype, fill=0, skip=(1,))  # the second row chunk absent
    assert matches(array)
    whole = read_whole(array, threads=threads)
    expected = np.asarray(array.zarr[:])
    assert whole.dtype == expected.dtype and whole.shape == expected.shape
    assert whole.tobytes() == expected.tobytes()
    assert not whole[chunks[0]:2 * chunks[0]].any()  # the absent chunk reads as the fill value


def test_a_store_read_is_the_same_and_nan_rows_stay_nan(tmp_path: Path) -> None:
    data = make_prepared(tmp_path / "data", n_train=40, n_val=10, n_test=10)
    store = make_store(tmp_path / "f.zarr", data, dim=16, invalid=(3, 41))
    array = FeatureStore(store).array("global")
    assert matches(array)
    whole = read_whole(array)
    assert whole.tobytes() == np.asarray(array.zarr[:]).tobytes() and np.isnan(whole[3]).all()
    x, valid = read_matrix(f"{store}:global", data)
    assert not valid[3] and np.isnan(x[41]).all()


def test_a_layout_it_does_not_decode_is_left_to_zarr(tmp_path: Path) -> None:
    store = FeatureStore.create(tmp_path / "r.zarr", np.arange(20), {"regions": (49, 640)}, block_size=8,
                                config={"t": 1}, provenance={"n": "r"}, dtypes={"regions": "float16"})
    array = store.array("regions")  # sharded: one inner chunk per row
    assert not matches(array) and read_whole(array) is None
    z = zarr.create_array(store=str(tmp_path / "g.zarr"), name="x", shape=(10, 4), chunks=(5, 4),
                          dtype="float32", compressors=None, zarr_format=3)
    assert not matches(StoreArray(Folder(tmp_path / "g.zarr"), "x", z))  # no zstd


def test_a_damaged_chunk_is_named_and_an_oversized_one_refused(tmp_path: Path) -> None:
    data = make_prepared(tmp_path / "data", n_train=40, n_val=10, n_test=10)
    store = make_store(tmp_path / "f.zarr", data, dim=16)
    chunk = next(p for p in sorted((store / "global" / "c").rglob("*")) if p.is_file())
    original = chunk.read_bytes()
    chunk.write_bytes(original[: len(original) // 2])
    with pytest.raises(UserError, match=r"array 'global' is damaged at rows .*chunk file"):
        read_matrix(f"{store}:global", data)
    array = FeatureStore(store).array("global")
    chunk.write_bytes(original + b"\0" * (1 << 20))  # more than any frame of a 16-wide chunk may take
    with pytest.raises(ValueError, match="more than a zstd frame"):
        read_whole(array)
    assert compress_bound(1 << 20) > 1 << 20
