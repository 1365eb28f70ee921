"""The block runner: read a block of images, map them to feature rows, write the rows.

One block (``block_size`` consecutive rows of the prepared dataset) is the unit of work, of resumption and of
Zarr chunks; inside it the mapper runs a few images at a time and the rows are committed in pieces
(:mod:`features.executors.mapping`, :mod:`features.executors.pieces`). :func:`run_block` does one block
wherever it runs (a Dask task; the in-process executor runs the same steps with a reader and a writer
thread); :func:`extract` is the loop over the blocks not yet done, with the executor outside the block;
:func:`cached_mapper` builds a mapper once per process (a Dask worker reuses it for every block). The
block's types and its reader live in :mod:`features.executors.block`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

import features.executors.pieces as pieces
from features.executors.block import (  # noqa: F401 - the block's types, also read from here
    MAX_TRANSIENT_IN_A_ROW,
    BlockResult,
    BlockTask,
    ImagesUnavailable,
    LoadedBlock,
    Mapper,
    MapperFactory,
    check_images_available,
    default_loader,
    host_part,
    load_resize,
    read_block,
)
from features.executors.mapping import map_block, where
from features.store.core import FeatureStore
from vsecore import console
from vsecore.errors import UserError


@dataclass
class ExtractSummary:
    """The final account of a run."""

    rows_written: int = 0
    rows_skipped: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    decode_s: float = 0.0
    map_s: float = 0.0
    write_s: float = 0.0
    #: where the blocks ran (a worker's device and pinning) -> blocks
    devices: dict[str, int] = field(default_factory=dict)

    def line(self, store: Path | str) -> str:
        """One summary line: rows written, skipped as already done, failed, time and rate."""
        rate = self.rows_written / self.seconds if self.seconds > 0 else 0.0
        return (f"features: wrote {self.rows_written} rows, skipped {self.rows_skipped} already done, "
                f"{len(self.failures)} failed, in {self.seconds:.1f} s ({rate:.1f} images/s) -> {store}")


def run_block(task: BlockTask, mapper: Mapper, loader: Callable[..., Any] | None = None) -> BlockResult:
    """Compute one block and write it into the store, here and now (a Dask task's body); skip it if its flag
    is already set.

    The reader (:func:`read_block`), then the mapper a call at a time with the writes done in this thread
    (:func:`features.executors.mapping.map_block`); with ``task.on_error == "fail"`` nothing of a block
    with a bad image is written.
    """
    if FeatureStore(task.store).block_done(task.block):
        # A retried Dask task (its worker died after writing the flag) must not redo the block.
        return BlockResult(task.block, task.rows - task.first, already_done=True)
    load, prepare = host_part(mapper)
    results: list[Any] = []
    block = read_block(task, loader or load, prepare=prepare)
    map_block(block, mapper, lambda write, *args: results.append(write(*args)))
    return results[-1]


def block_tasks(store: FeatureStore, paths: Sequence[str | Path], on_error: str = "record",
                resize: int | None = None, decode_threads: int | None = None) -> list[BlockTask]:
    """One :class:`BlockTask` per block of ``store`` whose flag is not yet set, from the first row its piece
    record does not keep (:func:`features.executors.pieces.kept`; ``resize``, ``decode_threads``: see
    :class:`BlockTask`)."""
    if len(paths) != store.n_rows:
        raise UserError(f"{store.path}: has {store.n_rows} rows but the dataset has {len(paths)} images")
    done = store.blocks_done()
    undone = [b for b in range(store.n_blocks) if not done[b] and np.subtract(*store.block_rows(b)) < 0]
    kept = pieces.kept(store, undone)
    tasks = []
    for b in undone:
        start, stop = store.block_rows(b)
        first, failures = kept.get(b, (0, []))
        tasks.append(BlockTask(str(store.path), b, start, tuple(str(p) for p in paths[start:stop]), on_error,
                               resize, first, json.dumps(failures) if failures else "", decode_threads))
    return tasks


class Executor(Protocol):
    """Runs block tasks somewhere and yields their results as they finish."""

    def run(self, tasks: Sequence[BlockTask], factory: MapperFactory,
            progress: Callable[[int], Any] | None = None) -> Iterator[BlockResult]:
        """Compute every task (order of results may differ from order of tasks), calling ``progress(n)`` as
        ``n`` more images are done."""


class _NoBar:
    """What ``--no-progress`` shows: nothing."""

    def update(self, n: int = 1) -> None:
        """Nothing."""

    def set_postfix(self, **values: object) -> None:
        """Nothing."""


def images_kept(store: FeatureStore) -> str:
    """``"N of M images kept (B of T blocks finished)"``: what a re-run skips (finished blocks and the rows
    their piece record keeps of the others)."""
    try:
        rows, blocks = pieces.rows_kept(store), int(store.blocks_done().sum())
        return f"{rows} of {store.n_rows} images kept ({blocks} of {store.n_blocks} blocks finished)"
    except (UserError, OSError):
        return "finished images kept"


def extract(store: FeatureStore, paths: Sequence[str | Path], factory: MapperFactory, executor: Executor,
            on_error: str = "record", progress: bool = True, resize: int | None = None,
            decode_threads: int | None = None) -> ExtractSummary:
    """Compute every block not yet done (the loop over blocks), with a progress bar.

    The bar counts images as the executor maps them (rate and ETA); rows of blocks done by an earlier run,
    and the rows it kept of unfinished blocks, count as skipped. ``resize``: the shorter side the mapper
    resizes images to (bounds the work per image); ``decode_threads``: see :class:`BlockTask`. Once every
    block is done the piece record is deleted (:func:`features.executors.pieces.drop_record`).
    """
    t0 = time.perf_counter()
    pieces.ensure_record(store)
    pieces.forget_finished(store)
    tasks = block_tasks(store, paths, on_error, resize, decode_threads)
    summary = ExtractSummary(rows_skipped=store.n_rows - sum(t.rows - t.first for t in tasks))
    shown = (console.progress(total=store.n_rows, initial=summary.rows_skipped, unit="img", desc="features",
                              smoothing=0.1) if progress else nullcontext(_NoBar()))
    try:
        _run_blocks(tasks, factory, executor, summary, shown)
    except ImagesUnavailable as exc:
        raise UserError(f"{exc}; {images_kept(store)}, the failing block not written: bring the images back "
                        "and re-run the same command to resume") from None
    if store.blocks_done().all():
        pieces.drop_record(store)
    summary.failures = store.block_failures()
    summary.seconds = time.perf_counter() - t0
    return summary


def _run_blocks(tasks: list[BlockTask], factory: MapperFactory, executor: Executor, summary: ExtractSummary,
                shown: Any) -> None:
    """The loop of :func:`extract`: run the tasks, count the results into ``summary``, show progress."""
    with shown as bar:
        for result in executor.run(tasks, factory, bar.update):
            if result.already_done:
                summary.rows_skipped += result.rows
            else:
                summary.rows_written += result.rows
            summary.decode_s += result.decode_s
            summary.map_s += result.map_s
            summary.write_s += result.write_s
            if result.device:
                summary.devices[result.device] = summary.devices.get(result.device, 0) + 1
            if result.failures:
                bar.set_postfix(failed=len(summary.failures) + len(result.failures))
            summary.failures.extend(result.failures)


def retry_failures(store: FeatureStore, everything: bool = False) -> tuple[int, int]:
    """Recompute the blocks holding failures that may be transient (missing file, I/O error, truncated
    file: :func:`features.extractors.images.is_transient`; every failure with ``everything``): the flags of
    finished ones are cleared, and what the piece record keeps of unfinished ones is forgotten. Returns
    ``(failed images retried, blocks recomputed)``."""
    from features.extractors.images import is_transient

    done = {int(b) for b in np.flatnonzero(store.blocks_done())}
    kept = set(pieces.kept(store, [b for b in range(store.n_blocks) if b not in done]))
    failures = [f for f in store.block_failures() if int(f["imgid"]) // store.block_size in done | kept
                and (everything or is_transient(f["reason"]))]
    blocks = {int(f["imgid"]) // store.block_size for f in failures}
    if blocks & done:
        store.clear_blocks(sorted(blocks & done))
    pieces.forget(store, sorted(blocks & kept))
    return len(failures), len(blocks)


# One cache per process (a Dask worker process, or the driver in-process): the model is expensive
# to load and the cache key is the mapper's full configuration, so a different model never hits.
_MAPPERS: dict[str, Mapper] = {}
_MAPPERS_LOCK = threading.Lock()


def cached_mapper(factory: MapperFactory) -> Mapper:
    """The mapper of ``factory``, built once per process and kept for later blocks."""
    with _MAPPERS_LOCK:
        mapper = _MAPPERS.get(factory.key)
        if mapper is None:
            mapper = factory.build()
            # Keep one model per process: a worker serving two configurations one after the other
            # should not hold both in (GPU) memory.
            _MAPPERS.clear()
            _MAPPERS[factory.key] = mapper
        return mapper


def compute_block(task: BlockTask, factory: MapperFactory) -> BlockResult:
    """The body of one task: the cached mapper, then :func:`run_block` (its result says where it ran)."""
    mapper = cached_mapper(factory)
    result = run_block(task, mapper)
    result.device = where(mapper)
    return result
