"""The block runner: read a block of images, map them to feature rows, write the rows.

One block (``block_size`` consecutive rows of the prepared dataset) is the unit of work and of
resumption. :func:`run_block` does one block wherever it runs (in-process or in a Dask task);
:func:`extract` is the loop over the blocks not yet done, with the executor outside the block;
:func:`cached_mapper` builds a mapper once per process (a Dask worker reuses it for every block).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from features.store.core import FeatureStore
from vsecore import console
from vsecore.errors import UserError


class Mapper(Protocol):
    """What :func:`run_block` needs of a mapper (``features.extractors.crop_mapper.ImageMapper`` is one)."""

    outputs: dict[str, Any]
    provenance: dict[str, Any]

    def __call__(self, images: list[Any]) -> dict[str, np.ndarray]:
        """Images -> name -> ``(B, *row_shape)`` rows (``outputs`` maps each name to a width ``C``, rows
        ``(B, C)`` float32, or to one row's shape; region mappers also have ``dtypes``). A mapper may also
        have ``prepare(image) -> item``, the host's part of its input (thread-safe): the reader then hands it
        prepared items (:func:`read_block`); and ``resize``, the shorter side it resizes images to
        (:func:`load_resize`)."""


class MapperFactory(Protocol):
    """A picklable recipe for a mapper; ``key`` identifies it in a worker's cache."""

    key: str

    def build(self) -> Mapper:
        """Load the model and return the mapper (expensive: done once per process)."""


@dataclass(frozen=True)
class BlockTask:
    """One block to compute: where to write it and which images it holds (absolute paths)."""

    store: str
    block: int
    start: int
    paths: tuple[str, ...]
    on_error: str = "record"
    #: the shorter side the mapper resizes images to (bounds the work per image, see
    #: :func:`features.extractors.images.check_work`); ``None``: the aspect-ratio bound only
    resize: int | None = None

    @property
    def rows(self) -> int:
        """Number of rows (images) of the block."""
        return len(self.paths)


@dataclass
class BlockResult:
    """What a block task returns to the driver: small, so it travels cheaply from a worker."""

    block: int
    rows: int
    failures: list[dict[str, Any]] = field(default_factory=list)
    already_done: bool = False
    decode_s: float = 0.0
    map_s: float = 0.0
    write_s: float = 0.0


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

    def line(self, store: Path | str) -> str:
        """One summary line: rows written, skipped as already done, failed, time and rate."""
        rate = self.rows_written / self.seconds if self.seconds > 0 else 0.0
        return (f"features: wrote {self.rows_written} rows, skipped {self.rows_skipped} already done, "
                f"{len(self.failures)} failed, in {self.seconds:.1f} s ({rate:.1f} images/s) -> {store}")


def load_resize(mapper: Any) -> int | None:
    """The shorter side ``mapper`` resizes images to, which bounds the work an image may cost when it is
    loaded (:func:`features.extractors.images.check_work`); ``None`` (a mapper that resizes otherwise, e.g.
    to a square): the aspect-ratio bound only."""
    resize = getattr(mapper, "resize", None)
    return int(resize) if resize is not None else None


def default_loader(path: str, resize: int | None = None) -> Any:
    """``features.extractors.images.load_image`` (imported late: workers import it where they run)."""
    from features.extractors.images import load_image

    return load_image(path, resize=resize)


def _load(path: str, loader: Callable[[str], Any], prepare: Callable[[Any], Any] | None = None) -> Any:
    from features.extractors.images import ImageError

    try:
        image = loader(path)
    except ImageError as exc:
        return exc
    return image if prepare is None else prepare(image)


def _reason(exc: Exception) -> str:
    return str(getattr(exc, "reason", None) or exc)


@dataclass
class LoadedBlock:
    """A block's decoded images (the reader's output): usable images, their positions, failures."""

    task: BlockTask
    images: list[Any]
    good: list[int]
    failures: list[dict[str, Any]]
    decode_s: float


def read_block(task: BlockTask, loader: Callable[[str], Any] = default_loader,
               decode_threads: int = 4, prepare: Callable[[Any], Any] | None = None) -> LoadedBlock:
    """Decode a block's images in a few threads (PIL releases the GIL while decoding), each then given to
    ``prepare`` (the mapper's host part, e.g. the resize: PIL releases the GIL there too) in its thread.

    Images that cannot be used (``features.extractors.images.ImageError``) become failure records (imgid,
    path, reason); with ``task.on_error == "fail"`` the first one raises a :class:`UserError`
    naming the file.
    """
    t0 = time.perf_counter()
    if loader is default_loader and task.resize is not None:
        loader = functools.partial(default_loader, resize=task.resize)
    with ThreadPoolExecutor(max_workers=max(1, min(decode_threads, task.rows))) as pool:
        loaded = list(pool.map(lambda p: _load(p, loader, prepare), task.paths))
    failures, good, images = [], [], []
    for k, (path, item) in enumerate(zip(task.paths, loaded, strict=True)):
        if isinstance(item, Exception):
            if task.on_error == "fail":
                raise UserError(f"{path}: cannot use image (imgid {task.start + k}): {_reason(item)}")
            failures.append({"imgid": task.start + k, "path": path, "reason": _reason(item)})
        else:
            good.append(k)
            images.append(item)
    check_images_available(failures)
    return LoadedBlock(task, images, good, failures, time.perf_counter() - t0)


#: this many transient failures (missing file, I/O error) in a row stop the run: the images folder looks
#: unavailable, and recording them all would only make a re-run recompute them
MAX_TRANSIENT_IN_A_ROW = 16


class ImagesUnavailable(UserError):
    """The images folder looks unavailable (vanished, unmounted): the block is not written."""


def check_images_available(failures: list[dict[str, Any]]) -> None:
    """Raise :class:`ImagesUnavailable` when a block's failures say the folder is gone, not the images:
    a missing file whose folder is missing too, or :data:`MAX_TRANSIENT_IN_A_ROW` consecutive rows that
    failed transiently (``failures``: the block's records, in row order)."""
    from features.extractors.images import is_transient

    run, last = 0, None
    for f in failures:
        if not is_transient(f["reason"]):
            run, last = 0, None
            continue
        folder = Path(f["path"]).parent
        if f["reason"] == "missing file" and not folder.is_dir():
            raise ImagesUnavailable(f"{folder}: the images folder looks unavailable (it is missing; imgid "
                                    f"{f['imgid']}: {f['path']})")
        run = run + 1 if last is not None and f["imgid"] == last + 1 else 1
        last = f["imgid"]
        if run >= MAX_TRANSIENT_IN_A_ROW:
            raise ImagesUnavailable(f"{folder}: the images folder looks unavailable ({run} images in a row "
                                    f"failed, the last imgid {f['imgid']}: {f['reason']})")


def map_and_write(block: LoadedBlock, mapper: Mapper) -> BlockResult:
    """Map a decoded block to rows and write them (failed images: NaN rows, 0 in integer arrays such as
    ``counts``, ``valid=False``)."""
    task = block.task
    t0 = time.perf_counter()
    mapped = mapper(block.images) if block.images else {}
    t1 = time.perf_counter()
    store = FeatureStore(task.store, mode="r+")
    arrays = {}
    for name in mapper.outputs:
        rows = store.empty_rows(name, task.rows)
        if block.good:
            rows[block.good] = mapped[name]
        arrays[name] = rows
    valid = np.zeros(task.rows, dtype=bool)
    valid[block.good] = True
    store.write_block(task.block, arrays, valid, block.failures)
    return BlockResult(task.block, task.rows, block.failures, False, block.decode_s, t1 - t0,
                       time.perf_counter() - t1)


def run_block(task: BlockTask, mapper: Mapper, loader: Callable[[str], Any] = default_loader) -> BlockResult:
    """Compute one block and write it into the store; skip it if its flag is already set.

    The reader (:func:`read_block`), the mapper and the writer (:func:`map_and_write`) in a
    row; with ``task.on_error == "fail"`` nothing of a block with a bad image is written.
    """
    if FeatureStore(task.store).block_done(task.block):
        # A retried Dask task (its worker died after writing the flag) must not redo the block.
        return BlockResult(task.block, task.rows, already_done=True)
    return map_and_write(read_block(task, loader, prepare=getattr(mapper, "prepare", None)), mapper)


def block_tasks(store: FeatureStore, paths: Sequence[str | Path],
                on_error: str = "record", resize: int | None = None) -> list[BlockTask]:
    """One :class:`BlockTask` per block of ``store`` whose flag is not yet set (``resize``: see
    :attr:`BlockTask.resize`)."""
    if len(paths) != store.n_rows:
        raise UserError(f"{store.path}: has {store.n_rows} rows but the dataset has {len(paths)} images")
    done = store.blocks_done()
    tasks = []
    for b in range(store.n_blocks):
        start, stop = store.block_rows(b)
        if not done[b] and stop > start:
            tasks.append(BlockTask(str(store.path), b, start, tuple(str(p) for p in paths[start:stop]),
                                   on_error, resize))
    return tasks


class Executor(Protocol):
    """Runs block tasks somewhere and yields their results as they finish."""

    def run(self, tasks: Sequence[BlockTask], factory: MapperFactory) -> Iterator[BlockResult]:
        """Compute every task (order of results may differ from order of tasks)."""


class _NoBar:
    """What ``--no-progress`` shows: nothing."""

    def update(self, n: int = 1) -> None:
        """Nothing."""

    def set_postfix(self, **values: object) -> None:
        """Nothing."""


def extract(store: FeatureStore, paths: Sequence[str | Path], factory: MapperFactory, executor: Executor,
            on_error: str = "record", progress: bool = True, resize: int | None = None) -> ExtractSummary:
    """Compute every block not yet done (the loop over blocks), with a progress bar.

    The bar counts images (rate and ETA); rows of blocks done by an earlier run count as skipped.
    ``resize``: the shorter side the mapper resizes images to (bounds the work per image).
    """
    t0 = time.perf_counter()
    tasks = block_tasks(store, paths, on_error, resize)
    summary = ExtractSummary(rows_skipped=store.n_rows - sum(t.rows for t in tasks))
    shown = (console.progress(total=store.n_rows, initial=summary.rows_skipped, unit="img", desc="features",
                              smoothing=0.1) if progress else nullcontext(_NoBar()))
    try:
        _run_blocks(store, tasks, factory, executor, summary, shown)
    except ImagesUnavailable as exc:
        kept = int(store.blocks_done().sum())
        raise UserError(f"{exc}; {kept} of {store.n_blocks} blocks kept, the failing block not written: "
                        "bring the images back and re-run the same command to resume") from None
    summary.failures = store.block_failures()
    summary.seconds = time.perf_counter() - t0
    return summary


def _run_blocks(store: FeatureStore, tasks: list[BlockTask], factory: MapperFactory, executor: Executor,
                summary: ExtractSummary, shown: Any) -> None:
    """The loop of :func:`extract`: run the tasks, count the results into ``summary``, show progress."""
    with shown as bar:
        for result in executor.run(tasks, factory):
            if result.already_done:
                summary.rows_skipped += result.rows
            else:
                summary.rows_written += result.rows
            summary.decode_s += result.decode_s
            summary.map_s += result.map_s
            summary.write_s += result.write_s
            bar.update(result.rows)
            if result.failures:
                bar.set_postfix(failed=len(summary.failures) + len(result.failures))
            summary.failures.extend(result.failures)


def retry_failures(store: FeatureStore, everything: bool = False) -> tuple[int, int]:
    """Clear the flags of finished blocks holding failures that may be transient (missing file, I/O
    error, truncated file: :func:`features.extractors.images.is_transient`; every failure with
    ``everything``), so that the run computes them again. Returns ``(failed images retried, blocks
    cleared)``."""
    from features.extractors.images import is_transient

    failures = [f for f in store.block_failures() if everything or is_transient(f["reason"])]
    done = {int(b) for b in np.flatnonzero(store.blocks_done())}
    blocks = sorted({int(f["imgid"]) // store.block_size for f in failures} & done)
    if blocks:
        store.clear_blocks(blocks)
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
    """The body of one task: the cached mapper, then :func:`run_block`."""
    return run_block(task, cached_mapper(factory))
