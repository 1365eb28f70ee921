"""FNE statistics (train rows only, streamed) and the ternary discretisation against plain NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from features.store.ternary import fne_statistics, standardize, ternarize


def _data(seed: int = 0, n: int = 53, f: int = 9):
    rng = np.random.default_rng(seed)
    raw = (rng.gamma(1.5, 2.0, size=(n, f)) * (rng.random((n, f)) > 0.3)).astype(np.float32)
    raw[:, 2] = 0.1  # constant (and not exactly representable: the sums round)
    train = rng.random(n) < 0.6
    return raw, train


def _reference_ternary(raw, mean, std, low, high):
    out = np.zeros(raw.shape, dtype=np.int8)
    for i in range(raw.shape[0]):
        for j in range(raw.shape[1]):
            z = 0.0 if std[j] == 0 else (float(raw[i, j]) - float(mean[j])) / float(std[j])
            out[i, j] = -1 if z < low else (1 if z > high else 0)
    return out


@pytest.mark.parametrize("chunk_rows", [1, 7, 1000])
def test_statistics_equal_numpy_on_train_rows(chunk_rows):
    raw, train = _data()
    mean, std = fne_statistics(raw, train, chunk_rows=chunk_rows)
    assert mean.dtype == np.float32 and std.dtype == np.float32 and mean.shape == (9,)
    ref = raw[train].astype(np.float64)
    np.testing.assert_allclose(mean, ref.mean(axis=0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(std, ref.std(axis=0), rtol=1e-5, atol=1e-7)  # population std (ddof 0)
    assert std[2] == 0.0


def test_non_train_rows_do_not_change_statistics():
    raw, train = _data()
    mean, std = fne_statistics(raw, train, chunk_rows=8)
    changed = raw.copy()
    changed[~train] = 1e6
    mean2, std2 = fne_statistics(changed, train, chunk_rows=8)
    assert np.array_equal(mean, mean2) and np.array_equal(std, std2)
    changed[np.flatnonzero(train)[0], 0] += 1.0
    assert fne_statistics(changed, train, chunk_rows=8)[0][0] != mean[0]
    with pytest.raises(ValueError, match="no train rows"):
        fne_statistics(raw, np.zeros(len(raw), bool))


class _CountingArray:
    """Array-like that records the row slices read (to check streaming)."""

    def __init__(self, arr):
        self.arr, self.shape, self.reads = arr, arr.shape, []

    def __getitem__(self, key):
        self.reads.append((key.start, key.stop))
        return self.arr[key]


def test_statistics_stream_from_zarr_in_row_chunks():
    raw, train = _data(n=40)
    train[10:20] = False
    memory = zarr.storage.MemoryStore()
    store = zarr.create_array(store=memory, shape=raw.shape, chunks=(10, 9), dtype="float32")
    store[:] = raw
    mean_z, std_z = fne_statistics(store, train, chunk_rows=10)
    mean_n, std_n = fne_statistics(raw, train, chunk_rows=10)
    assert np.array_equal(mean_z, mean_n) and np.array_equal(std_z, std_n)
    counting = _CountingArray(raw)
    fne_statistics(counting, train, chunk_rows=10)
    assert counting.reads == [(0, 10), (20, 30), (30, 40)]  # the chunk without train rows is never read


def test_ternarize_matches_numpy_reference_and_defaults():
    raw, train = _data(seed=3)
    mean, std = fne_statistics(raw, train)
    got = ternarize(raw, mean, std)
    assert got.dtype == np.int8 and got.shape == raw.shape
    assert np.array_equal(got, _reference_ternary(raw, mean, std, -0.25, 0.15))
    assert set(np.unique(got)) <= {-1, 0, 1} and (got[:, 2] == 0).all()  # constant feature -> 0
    other = ternarize(raw, mean, std, low=-1.0, high=1.0)
    assert np.array_equal(other, _reference_ternary(raw, mean, std, -1.0, 1.0))
    assert not np.array_equal(other, got)


def test_ternary_bounds_are_strict_and_nan_is_zero():
    mean, std = np.zeros(4, np.float32), np.ones(4, np.float32)
    raw = np.array([[-0.25, 0.125, -0.2500001, 0.1250001], [np.nan, 0, -5, 5]], dtype=np.float32)
    got = ternarize(raw, mean, std, low=-0.25, high=0.125)
    assert got.tolist() == [[0, 0, -1, 1], [0, 0, -1, 1]]
    np.testing.assert_array_equal(standardize(raw[1:], [1, 0, 0, 0], [0, 1, 1, 1])[0, :1], [0.0])
    with pytest.raises(ValueError):
        ternarize(raw, mean, std, low=0.5, high=0.1)
