"""A block mapped in pieces: a few images at a time, the rows committed as they come.

:func:`map_block` calls the mapper on ``images_per_call`` images at a time (the mapper's own count: on the
CPU a few images, on CUDA a few forward passes; a mapper without one maps the block in one call), reports
each call's images to the progress bar, and hands its writes to ``write`` (the in-process executor's writer
thread, or a plain call in a Dask task): every :func:`features.executors.pieces.piece_seconds` the rows
mapped so far (:func:`features.executors.pieces.commit_piece`), when an interrupt stops it the rows it has
mapped, and at the end the rest of the block with its flag (:func:`finish_block`). Rows never depend on
how a block is cut into calls or pieces (a mapper's rows never depend on the other images of a call), so a
resumed block ends bit-identical to one mapped in one go.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import features.executors.pieces as pieces
from features.executors.block import MAPPER_FAILURES, BlockResult, LoadedBlock, Mapper
from features.store.layout import fill_value, row_shape

#: ``write(function, *args)``: run a store write now or in the writer thread
Write = Callable[..., Any]


def images_per_call(mapper: Any, rows: int) -> int:
    """Images the block runner hands the mapper at a time: its ``images_per_call``, else the whole block."""
    per_call = getattr(mapper, "images_per_call", None)
    return max(1, int(per_call)) if per_call else max(1, rows)


class BlockRows:
    """The rows of a block from row ``first`` on, filled as the mapper returns them (rows of failed images
    keep the fill value: NaN, or 0 in integer arrays, as :meth:`features.store.core.FeatureStore.empty_rows`
    makes them)."""

    def __init__(self, block: LoadedBlock, mapper: Mapper) -> None:
        self.block, self.first = block, block.task.first
        dtypes = getattr(mapper, "dtypes", None) or {}
        n = block.task.rows - self.first
        self.arrays = {}
        for name, spec in mapper.outputs.items():
            dtype = np.dtype(dtypes.get(name, "float32"))
            self.arrays[name] = np.full((n, *row_shape(spec)), fill_value(dtype), dtype=dtype)
        self.where = {row: k for k, row in enumerate(block.good)}  # row of the block -> its image
        #: the failures among the rows read now: the reader's, then the mapper's (in row order)
        self.failures = list(block.failures)

    def map(self, mapper: Mapper, lo: int, hi: int) -> None:
        """Map the usable images of rows ``lo .. hi`` of the block into place; images the mapper could not use
        (:data:`features.executors.block.MAPPER_FAILURES`) become failures, their rows filled as failed."""
        rows = [row for row in range(lo, hi) if row in self.where]
        if not rows:
            return
        mapped = mapper([self.block.images[self.where[row]] for row in rows])
        at = np.asarray(rows) - self.first
        for name, values in self.arrays.items():
            values[at] = mapped[name]
        failed = mapped.get(MAPPER_FAILURES) or []
        task = self.block.task
        for k, reason in failed:
            for values in self.arrays.values():
                values[at[k]] = fill_value(values.dtype)
            row = rows[k]
            self.failures.append({"imgid": task.start + row, "path": task.paths[row], "reason": reason})
        if failed:
            self.failures.sort(key=lambda f: f["imgid"])

    def take(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Rows ``lo .. hi`` of the block (views: the mapper only fills rows after them meanwhile)."""
        return {name: values[lo - self.first : hi - self.first] for name, values in self.arrays.items()}

    def failures_before(self, row: int) -> list[dict[str, Any]]:
        """The block's failures among its rows before ``row`` (kept ones, then those read now)."""
        last = self.block.task.start + row
        return [*self.block.task.failures_kept(), *(f for f in self.failures if f["imgid"] < last)]


def map_block(block: LoadedBlock, mapper: Mapper, write: Write, progress: Callable[[int], Any] | None = None
              ) -> None:
    """Map ``block`` a call at a time and hand its writes to ``write`` (see the module docstring); an
    interrupt (Ctrl-C, ``SIGTERM``) hands over the rows mapped since the last commit before it goes on."""
    task = block.task
    per_call, every = images_per_call(mapper, task.rows), pieces.piece_seconds()
    rows = BlockRows(block, mapper)
    committed = mapped = task.first
    last, map_s = time.monotonic(), 0.0
    try:
        for lo in range(task.first, task.rows, per_call):
            hi = min(lo + per_call, task.rows)
            t0 = time.perf_counter()
            rows.map(mapper, lo, hi)
            map_s += time.perf_counter() - t0
            mapped = hi
            if progress is not None:
                progress(hi - lo)
            if hi < task.rows and time.monotonic() - last >= every:
                write(pieces.commit_piece, task.store, task.block, committed, rows.take(committed, hi),
                      rows.failures_before(hi))
                committed, last = hi, time.monotonic()
    except KeyboardInterrupt:
        if mapped > committed:  # keep what was computed: the re-run maps only the rest
            write(pieces.commit_piece, task.store, task.block, committed, rows.take(committed, mapped),
                  rows.failures_before(mapped))
        raise
    write(finish_block, block, committed, rows.take(committed, task.rows), rows.failures_before(task.rows),
          map_s, where(mapper), rows.failures)


def finish_block(block: LoadedBlock, first: int, arrays: dict[str, np.ndarray],
                 failures: list[dict[str, Any]], map_s: float, device: str = "",
                 new_failures: list[dict[str, Any]] | None = None) -> BlockResult:
    """Write the rest of a block (rows ``first ..``), its validity, failures (``failures``: all of the
    block's; ``new_failures``: those of the rows read now) and flag; its result."""
    task = block.task
    t0 = time.perf_counter()
    valid = np.ones(task.rows, dtype=bool)
    valid[np.asarray([f["imgid"] - task.start for f in failures], dtype=np.int64)] = False
    pieces.commit_block(task.store, task.block, first, arrays, valid, failures)
    return BlockResult(task.block, task.rows - task.first, list(new_failures or block.failures), False,
                       block.decode_s, map_s, time.perf_counter() - t0, device)


def where(mapper: Any) -> str:
    """Where ``mapper`` runs: its device and this process's ``CUDA_VISIBLE_DEVICES`` (a worker's pinning)."""
    device = str(getattr(mapper, "device", "cpu"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return device if visible is None else f"{device} (CUDA_VISIBLE_DEVICES={visible})"
