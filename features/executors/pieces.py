"""A block written in pieces: what a run keeps of a block it did not finish.

A block (``--block-size`` rows, one chunk of every row array) is the unit of resumption, but on a CPU a
block of 10-crop images takes minutes. So a block is mapped a few images at a time and, every
:func:`piece_seconds` and when the run is interrupted (Ctrl-C, ``SIGTERM``), the rows mapped so far are
committed: written into the block's chunks (Zarr rewrites a chunk whole, through a temporary file and a
rename), the block's ``failures`` entry set to the failures among them, then the block's entry of the piece
record ``rows_done`` set to the number of rows of the block that are on disk. A resumed run maps only the
rows after them (:func:`kept`); the block's flag in ``blocks_done`` still means "every row written".

The record is an array of its own, ``rows_done (n_blocks,) int32``, one chunk per block like
``blocks_done`` (so Dask tasks never write the same file). A block's entry is set to 0 before its flag is
written, so a flagged block never has one, and the array is deleted when every block is done
(:func:`drop_record`): a finished store has the layout it always had, and a store written before the
record existed resumes as before (no record: no rows kept inside a block). A kill between a piece's rows
and its record leaves the previous record, which the rows on disk still satisfy.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from features.store.core import FeatureStore
from features.store.layout import ARRAY_CONFIG
from vsecore.jsonfile import parse_json

#: the piece record: rows of each unfinished block already on disk (see the module docstring)
RECORD = "rows_done"
#: seconds between two commits of a block's rows while it is mapped (``VSE_PIECE_SECONDS`` overrides)
PIECE_SECONDS = 10.0


def piece_seconds() -> float:
    """Seconds between two commits of a block's mapped rows: :data:`PIECE_SECONDS`, or the environment's
    ``VSE_PIECE_SECONDS`` (0: after every call of the mapper)."""
    try:
        return max(0.0, float(os.environ.get("VSE_PIECE_SECONDS", PIECE_SECONDS)))
    except ValueError:
        return PIECE_SECONDS


def has_record(store: FeatureStore) -> bool:
    """Whether the store holds the piece record."""
    return (store.path / RECORD / "zarr.json").is_file()


def ensure_record(store: FeatureStore) -> None:
    """Create the piece record (all zeros) unless it exists; only the writer holding the store's lock does,
    before any block task runs."""
    if not has_record(store):
        store.group.create_array(RECORD, shape=(store.n_blocks,), chunks=(1,), dtype="int32", fill_value=0,
                                 config=ARRAY_CONFIG)


def drop_record(store: FeatureStore) -> None:
    """Delete the piece record (every block is done: no entry is left to keep)."""
    if (store.path / RECORD).is_dir():
        shutil.rmtree(store.path / RECORD)


def kept(store: FeatureStore, blocks: Iterable[int]) -> dict[int, tuple[int, list[dict[str, Any]]]]:
    """``block -> (rows kept, their failures)`` for the ``blocks`` (unfinished ones) whose record says rows
    are on disk. An entry out of range, or failures that are not among the kept rows, keep nothing."""
    if not has_record(store):
        return {}
    record, failures = np.asarray(store.array(RECORD)[:]), store.array("failures")
    out = {}
    for block in blocks:
        rows = int(record[block])
        if rows == 0:
            continue
        start, stop = store.block_rows(block)
        if not 0 < rows <= stop - start:
            continue
        text = str(failures[block])
        listed = parse_json(text, f"{store.path}: failures of block {block}") if text else []
        if all(isinstance(f, dict) and start <= f.get("imgid", -1) < start + rows for f in listed):
            out[block] = (rows, listed)
    return out


def rows_kept(store: FeatureStore) -> int:
    """Rows on disk: those of finished blocks and those the piece record keeps of the others."""
    done = store.blocks_done()
    rows = sum(stop - start for start, stop in map(store.block_rows, np.flatnonzero(done).tolist()))
    return rows + sum(r for r, _ in kept(store, np.flatnonzero(~done).tolist()).values())


def forget(store: FeatureStore, blocks: Iterable[int]) -> None:
    """Keep nothing of ``blocks``: they are mapped again from their first row."""
    if has_record(store):
        record = store.array(RECORD)
        for block in blocks:
            record[block] = 0


def forget_finished(store: FeatureStore) -> None:
    """Zero the entries of flagged blocks (a run of an older version finished them without knowing the
    record), so that a block cleared later (``--retry-failed``, a repair) is mapped whole."""
    if has_record(store):
        record = np.asarray(store.array(RECORD)[:])
        forget(store, np.flatnonzero(record * store.blocks_done()).tolist())


def commit_piece(path: str, block: int, first: int, arrays: Mapping[str, np.ndarray],
                 failures: list[dict[str, Any]]) -> None:
    """Write rows ``first .. first + n`` of ``block`` (``arrays``: name -> ``(n, *row_shape)``), the block's
    failures so far, then its record (``first + n`` rows kept)."""
    store = FeatureStore(path, mode="r+")
    start, _ = store.block_rows(block)
    store.check_chunk_places(block, [*arrays, "failures", RECORD])
    n = 0
    for name, values in arrays.items():
        arr = store.array(name)
        n = values.shape[0]
        arr[start + first : start + first + n] = np.asarray(values, dtype=arr.dtype)
    store.array("failures")[block] = json.dumps(failures) if failures else ""
    store.array(RECORD)[block] = first + n


def commit_block(path: str, block: int, first: int, arrays: Mapping[str, np.ndarray], valid: np.ndarray,
                 failures: list[dict[str, Any]]) -> None:
    """Write the rest of ``block`` (rows ``first ..``, earlier ones kept on disk), its validity and failures,
    then its flag (:meth:`FeatureStore.write_block`). Its record is zeroed first: a kill before the flag then
    maps the block again whole, never trusting a record of a block being finished."""
    store = FeatureStore(path, mode="r+")
    forget(store, [block])
    store.write_block(block, arrays, valid, failures, first=first)
