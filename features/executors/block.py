"""What a block is to the executors: the task (:class:`BlockTask`), its images read from disk
(:func:`read_block` -> :class:`LoadedBlock`) and what a task returns (:class:`BlockResult`), with the two
protocols a mapper and its recipe follow (:class:`Mapper`, :class:`MapperFactory`)."""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vsecore.errors import UserError

#: the key of a mapper's result that lists the images it could not use after all (``[(index in the call,
#: reason)]``, e.g. a JPEG that neither the device decoder nor PIL decodes): their rows are recorded failed
MAPPER_FAILURES = "__failed__"


class Mapper(Protocol):
    """What the block runner needs of a mapper (``features.extractors.crop_mapper.ImageMapper`` is one)."""

    outputs: dict[str, Any]
    provenance: dict[str, Any]

    def __call__(self, images: list[Any]) -> dict[str, np.ndarray]:
        """Images -> name -> ``(B, *row_shape)`` rows (``outputs`` maps each name to a width ``C``, rows
        ``(B, C)`` float32, or to one row's shape; region mappers also have ``dtypes``). A row never depends
        on the other images of the call. A mapper may also have ``prepare(image) -> item``, the host's part
        of its input (thread-safe): the reader then hands it prepared items (:func:`read_block`); ``load(path,
        resize) -> item``, its own reading of an image file (instead of PIL's decoding and ``prepare``);
        ``resize``, the shorter side it resizes images to (:func:`load_resize`); ``images_per_call``, the
        images it maps at a time (default: a whole block), each call a piece of the block
        (:mod:`features.executors.mapping`). A result may also hold :data:`MAPPER_FAILURES`."""


class MapperFactory(Protocol):
    """A picklable recipe for a mapper; ``key`` identifies it in a worker's cache."""

    key: str

    def build(self) -> Mapper:
        """Load the model and return the mapper (expensive: done once per process)."""


@dataclass(frozen=True)
class BlockTask:
    """One block to compute: where to write it and which images it holds (absolute paths).

    ``first``: rows of the block already on disk (written in pieces by an interrupted run,
    :mod:`features.executors.pieces`), ``kept_failures`` the JSON list of the failures among them; only the
    rows after them are read and mapped. ``decode_threads``: threads that decode its images (``None``: the
    machine's CPU count, :func:`default_decode_threads`).
    """

    store: str
    block: int
    start: int
    paths: tuple[str, ...]
    on_error: str = "record"
    #: the shorter side the mapper resizes images to (bounds the work per image, see
    #: :func:`features.extractors.images.check_work`); ``None``: the aspect-ratio bound only
    resize: int | None = None
    first: int = 0
    kept_failures: str = ""
    decode_threads: int | None = None

    @property
    def rows(self) -> int:
        """Number of rows (images) of the block."""
        return len(self.paths)

    def failures_kept(self) -> list[dict[str, Any]]:
        """The failures among the rows kept on disk (:attr:`first`)."""
        return json.loads(self.kept_failures) if self.kept_failures else []


@dataclass
class BlockResult:
    """What a block task returns to the driver: small, so it travels cheaply from a worker.

    ``rows``: rows mapped and written by this task (of an ``already_done`` block: those it skipped);
    ``device``: where it ran (the mapper's device and the worker's ``CUDA_VISIBLE_DEVICES``).
    """

    block: int
    rows: int
    failures: list[dict[str, Any]] = field(default_factory=list)
    already_done: bool = False
    decode_s: float = 0.0
    map_s: float = 0.0
    write_s: float = 0.0
    device: str = ""


def default_decode_threads() -> int:
    """Threads that decode a block's images by default: the CPUs this process may run on (the decoding
    and the resize release the GIL, so they scale with the cores)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


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


def host_part(mapper: Any) -> tuple[Callable[..., Any], Callable[[Any], Any] | None]:
    """``(loader, prepare)`` of ``mapper``'s images in the decode threads: its own ``load`` (no prepare), or
    PIL's decoding (:func:`default_loader`) and its ``prepare`` (if any)."""
    load = getattr(mapper, "load", None)
    if load is not None:
        return load, None
    return default_loader, getattr(mapper, "prepare", None)


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
    """A block's images read from disk (the reader's output): the usable images, their rows in the block
    (``good``, from ``task.first`` on), the failures among the rows read, seconds spent."""

    task: BlockTask
    images: list[Any]
    good: list[int]
    failures: list[dict[str, Any]]
    decode_s: float


def read_block(task: BlockTask, loader: Callable[..., Any] = default_loader,
               decode_threads: int | None = None, prepare: Callable[[Any], Any] | None = None) -> LoadedBlock:
    """Decode a block's images from row ``task.first`` on in ``decode_threads`` threads (default: the
    task's, else :func:`default_decode_threads`; PIL releases the GIL while decoding), each then given to
    ``prepare`` (the mapper's host part, e.g. the resize: PIL releases the GIL there too) in its thread.
    ``loader(path, resize=...)`` reads one image (:func:`host_part`).

    Images that cannot be used (``features.extractors.images.ImageError``) become failure records (imgid,
    path, reason); with ``task.on_error == "fail"`` the first one raises a :class:`UserError`
    naming the file.
    """
    t0 = time.perf_counter()
    if task.resize is not None:
        loader = functools.partial(loader, resize=task.resize)
    threads = decode_threads or task.decode_threads or default_decode_threads()
    paths = task.paths[task.first:]
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(paths)))) as pool:
        loaded = list(pool.map(lambda p: _load(p, loader, prepare), paths))
    failures, good, images = [], [], []
    for k, (path, item) in enumerate(zip(paths, loaded, strict=True), start=task.first):
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
