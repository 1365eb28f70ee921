"""The Full-Network Embedding's stored code (FNE paper section 3.1): per-feature statistics of the train
split, the ternary discretisation and its thresholds, and the arrays of a store that hold them
(``fne/mean``, ``fne/std``, ``fne/ternary``; the raw activations ``fne/raw`` come from
:mod:`features.extractors.full_network`).

Statistics and discretisation (section 3.1): each feature is standardised with the mean and the population
standard deviation of the **train** rows only; a feature constant over them (std 0) maps to z = 0. Then
``z < low -> -1``, ``z > high -> 1``, else 0 (strict bounds: z equal to a threshold is 0), with the paper's
``low = -0.25`` and ``high = 0.15``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from vsecore.errors import UserError

if TYPE_CHECKING:
    from features.store.core import FeatureStore

DEFAULT_LOW = -0.25
DEFAULT_HIGH = 0.15


def fne_statistics(raw: Any, train_rows: np.ndarray, chunk_rows: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and population std (ddof 0) of ``raw`` (N, F) over the rows where ``train_rows``
    (N,) bool is True, read ``chunk_rows`` rows at a time (``raw`` may be a Zarr or NumPy array).

    Pass ``train & valid`` so that failed images do not count. Returns float32 (F,), (F,); a feature whose
    train values are all equal has std exactly 0. Chunks are combined with Chan et al.'s parallel update in
    float64, so the result does not depend on ``chunk_rows`` beyond rounding.
    """
    train_rows = np.asarray(train_rows, dtype=bool)
    n_rows, n_feat = raw.shape
    if train_rows.shape != (n_rows,):
        raise ValueError(f"train_rows has shape {train_rows.shape}, expected ({n_rows},)")
    if not train_rows.any():
        raise ValueError("no train rows: the FNE statistics come from the train split only")
    count = 0
    mean = np.zeros(n_feat, dtype=np.float64)
    m2 = np.zeros(n_feat, dtype=np.float64)
    low = np.full(n_feat, np.inf)
    high = np.full(n_feat, -np.inf)
    for start in range(0, n_rows, chunk_rows):
        stop = min(n_rows, start + chunk_rows)
        select = train_rows[start:stop]
        if not select.any():
            continue  # never read chunks without train rows
        x = np.asarray(raw[start:stop], dtype=np.float64)[select]
        n_b = x.shape[0]
        mean_b = x.mean(axis=0)
        m2_b = ((x - mean_b) ** 2).sum(axis=0)
        delta = mean_b - mean
        total = count + n_b
        mean = mean + delta * (n_b / total)
        m2 = m2 + m2_b + delta**2 * (count * n_b / total)
        count = total
        low = np.minimum(low, x.min(axis=0))
        high = np.maximum(high, x.max(axis=0))
    std = np.sqrt(m2 / count)
    std[low == high] = 0.0  # exactly constant, whatever the rounding of the sums
    return mean.astype(np.float32), std.astype(np.float32)


def standardize(raw: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """z-values (N, F) float64: ``(raw - mean) / std``, and 0 where ``std == 0``."""
    raw = np.asarray(raw, dtype=np.float64)
    std = np.asarray(std, dtype=np.float64)
    safe = np.where(std > 0, std, 1.0)
    z = (raw - np.asarray(mean, dtype=np.float64)) / safe
    return np.where(std > 0, z, 0.0)


def check_thresholds(low: float, high: float, strict: bool = True) -> None:
    """A ``ValueError`` unless ``low`` and ``high`` are finite numbers and ``low < high`` (``strict``;
    else ``low <= high``). A NaN threshold compares false with every z, an infinite one with all of them:
    either turns the ternary code into {0, 1} or all zeros without any other sign."""
    for name, value in (("low", low), ("high", high)):
        if not isinstance(value, (int, float, np.floating, np.integer)) or not np.isfinite(value):
            raise ValueError(f"threshold {name} must be a finite number, got {value!r}")
    if low > high or (strict and low == high):
        raise ValueError(f"threshold low {low} must be below high {high}")


def ternarize(
    raw: np.ndarray, mean: np.ndarray, std: np.ndarray, low: float = DEFAULT_LOW, high: float = DEFAULT_HIGH
) -> np.ndarray:
    """The FNE discretisation: (N, F) raw activations -> int8 (N, F) in {-1, 0, 1}.

    ``z < low -> -1``, ``z > high -> 1``, otherwise 0 (strict inequalities); constant features (std 0) and
    NaN inputs give 0. ``low`` and ``high`` must be finite, ``low`` not above ``high``.
    """
    check_thresholds(low, high, strict=False)
    z = standardize(raw, mean, std)
    out = np.zeros(z.shape, dtype=np.int8)
    out[z < low] = -1
    out[z > high] = 1
    return out


def finish_fne(store: FeatureStore, train_rows: np.ndarray, low: float, high: float) -> None:
    """Write ``fne/mean``, ``fne/std`` (valid train rows only) and ``fne/ternary`` from ``fne/raw``.

    ``train_rows`` (N,) bool marks the train split. ``fne_statistics`` streams the Zarr array in
    row chunks, and the ternary array is written block by block, so memory stays bounded.
    """
    # Zarr loads only when a store is written: the FNE's settings (pipelines.yaml, --help) read this module
    from features.store.layout import ARRAY_CONFIG

    rows = np.asarray(train_rows, dtype=bool) & np.asarray(store.array("valid")[:], dtype=bool)
    if not rows.any():
        raise UserError(f"{store.path}: no valid train-split rows to compute the FNE statistics from")
    mean, std = fne_statistics(store.array("fne/raw"), rows, chunk_rows=max(store.block_size, 1024))
    width = store.array("fne/raw").shape[1]
    with store.rewriting("features fne: statistics and fne/ternary"):
        for name, values in (("fne/mean", mean), ("fne/std", std)):
            if not store.has(name):
                store.group.create_array(name, shape=(width,), chunks=(width,), dtype="float32",
                                         fill_value=np.nan, config=ARRAY_CONFIG)
            store.array(name)[:] = np.asarray(values, dtype=np.float32)
        write_ternary(store, low, high)


def write_ternary(store: FeatureStore, low: float, high: float) -> None:
    """(Re)write ``fne/ternary`` from ``fne/raw`` and the stored statistics, block by block.

    Written aside and swapped in (:meth:`FeatureStore.replace_ternary`), with the thresholds in the
    array's own attributes: a kill leaves the previous complete array (or the new one) in place.
    """
    raw = store.array("fne/raw")
    n = raw.shape[0]
    mean = np.asarray(store.array("fne/mean")[:])
    std = np.asarray(store.array("fne/std")[:])
    valid = np.asarray(store.array("valid")[:], dtype=bool)

    def write(out: Any) -> None:
        for b in range(math.ceil(n / store.block_size)):
            start, stop = store.block_rows(b)
            block = np.asarray(raw[start:stop])
            tern = np.zeros(block.shape, dtype=np.int8)
            ok = valid[start:stop]
            if ok.any():
                tern[ok] = ternarize(block[ok], mean, std, low, high)
            out[start:stop] = tern

    store.replace_ternary(write, (low, high))


def check_threshold_options(low: float, high: float) -> None:
    """A one-line :class:`UserError` unless ``--threshold-low`` and ``--threshold-high`` are finite and
    ``low < high`` (NaN or inf would silently give a ternary code of {0, 1} or all zeros)."""
    for option, value in (("--threshold-low", low), ("--threshold-high", high)):
        if not math.isfinite(value):
            raise UserError(f"{option} {value}: must be a finite number")
    try:
        check_thresholds(low, high)
    except ValueError:
        raise UserError(f"--threshold-low ({low}) must be below --threshold-high ({high})") from None
