"""``features <kind>`` as a library: images of a prepared dataset -> a feature store.

:func:`run_features` is the whole extraction for one validated :class:`~features.settings.FeaturesSection`:
the extractor its ``kind`` names (:mod:`features.extractors`), the mapper's recipe from
:mod:`features.extractors.recipe`, blocks mapped and written by :func:`features.executors.extract.extract`
in this process or on a Dask cluster, then what the extractor does once every block is in (the FNE
statistics and ternary code); :func:`rethreshold_store` rewrites only the ternary code. Both hold the
store's lock (:func:`vsecore.io.exclusive_lock`) for their whole run. :mod:`features.cli`, the pipeline
runner and the benchmarks call them.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from features.executors import check_scheduler, open_executor
from features.executors.block import default_decode_threads
from features.executors.extract import (
    ExtractSummary,
    Mapper,
    cached_mapper,
    extract,
    images_kept,
    load_resize,
    retry_failures,
)
from features.extractors.recipe import ImageMapperFactory
from features.extractors.registry import Extractor, get_extractor_of
from features.settings import FeaturesSection
from features.store.core import FeatureStore, check_replaceable, remove_killed_leftovers
from features.store.ternary import check_threshold_options, write_ternary
from prep.dataset import DATASET_FILE, PreparedDataset
from vsecore import console
from vsecore.device import resolve_device
from vsecore.errors import UserError, disk_error_reason
from vsecore.io import exclusive_lock, sha256_file
from vsecore.outputs import check_output_folder


def _dataset(settings: FeaturesSection) -> PreparedDataset:
    if not settings.data:
        raise UserError("features: --data is required (a prepared dataset folder; give it or use --pipeline)")
    return PreparedDataset.load(settings.data)


def store_config(settings: FeaturesSection, mapper: Mapper, images_sha256: str,
                 n_rows: int) -> dict[str, Any]:
    """The settings that determine the stored numbers: a resumed run must match them exactly.

    The rows' identity is ``images_sha256`` (the prepared dataset's ordered images and splits), not
    the whole ``dataset.json``: re-preparing captions keeps a store resumable. Batch size, threads,
    device, scheduler and workers are left out: they change speed (and at most the last bits of
    CPU rows, see :func:`features.extractors.recipe.torch_threads`), not what the rows are. The extractor
    records its rows' description (its ``record``), and every mapper setting the run asked for (its
    ``recipe``) is recorded, which is what query-time featurisation rebuilds the mapper from
    (:func:`features.extractors.recipe.mapper_config`).
    """
    extractor = get_extractor_of(settings)
    store = {"block_size": settings.block_size, "images_sha256": images_sha256, "n_rows": n_rows,
             "outputs": dict(mapper.outputs)}
    config = extractor.record(settings, mapper, store)
    unrecorded = {k: v for k, v in extractor.recipe(settings).items() if k not in config}
    return {**config, **unrecorded}


def run_features(settings: FeaturesSection, overwrite: bool = False, rethreshold: bool = False,
                 progress: bool = True, retry_failed: bool = False) -> Path:
    """Run ``features <kind>`` with resolved ``settings``; return the store's path.

    Resumes a store made with the same configuration (recomputing finished blocks whose chunk
    files are missing or empty), refuses one made with another (unless ``overwrite``).
    ``rethreshold`` (fne only) rewrites only the ternary array. The store's lock is held from
    before anything is deleted until the end, Dask runs included (the driver holds it). Images whose
    failure may be transient (missing file, I/O error, truncated file) are retried on resume;
    ``retry_failed`` retries every recorded failure.
    """
    out = Path(settings.out)
    if rethreshold:
        return rethreshold_store(out, settings.threshold_low, settings.threshold_high)
    extractor = get_extractor_of(settings)
    extractor.check(settings)
    if settings.codec != "zstd" and "codec" not in extractor.config.model_fields:
        raise UserError(f"features {settings.kind}: codec {settings.codec} applies to region stores (rows "
                        "stored one chunk per row); other arrays are always zstd")
    check_scheduler(settings.scheduler, settings.workers)
    dataset = _dataset(settings)
    if not dataset.images:
        raise UserError(f"{dataset.root}: the prepared dataset has no images")
    # the store is no input (not inside --data or its images) and lies inside no other artifact (a run,
    # another prepared dataset or store); it may be an existing store (resumed or replaced)
    check_output_folder(out, (), inputs=[dataset.root, dataset.images_root], owner=out)
    # Locked before the model is loaded (a second writer is told at once) and before --overwrite
    # deletes anything; released by the kernel if this process dies.
    with exclusive_lock(out, "the feature store"):
        summary = _extract_locked(settings, extractor, dataset, out, overwrite, progress, retry_failed)
    _print_summary(summary, out)
    return out


def _extract_locked(settings: FeaturesSection, extractor: Extractor, dataset: PreparedDataset, out: Path,
                    overwrite: bool, progress: bool, retry_failed: bool = False) -> ExtractSummary:
    """The body of :func:`run_features`, run while holding the store's lock."""
    remove_killed_leftovers(out)
    if out.is_dir() and not overwrite:
        probe_writable(out)
    if out.exists() and overwrite:
        check_replaceable(out)  # before the model loads: a NOTES.txt in the store keeps it
    dataset_sha = sha256_file(dataset.root / DATASET_FILE)
    images_sha = dataset.images_fingerprint()
    paths = [str(p) for p in dataset.image_paths()]
    imgids = np.arange(len(paths), dtype=np.int64)
    in_process = settings.scheduler == "none"
    devices = local_devices(settings)
    # The driver needs the widths and provenance; in-process its mapper is the one that computes.
    # On a cluster the driver's copy only describes the model, so it stays on the CPU, and
    # ``auto`` is resolved by each worker (the driver may have no GPU); a local worker pinned to a GPU
    # sees it as its only one, ``cuda``.
    if in_process:
        factory = driver = ImageMapperFactory.from_settings(settings, str(resolve_device(settings.device)))
    else:
        factory = ImageMapperFactory.from_settings(settings, "cuda" if devices else None)
        driver = ImageMapperFactory.from_settings(settings, "cpu")
    mapper = cached_mapper(driver)
    config = store_config(settings, mapper, images_sha, len(paths))
    provenance = {**mapper.provenance, "dataset": str(dataset.root), "dataset_sha256": dataset_sha,
                  "images_sha256": images_sha, "thresholds": config.get("thresholds"),
                  "torch_threads": factory.config["threads"]}
    resuming = out.exists() and not overwrite
    store = FeatureStore.open_or_create(out, imgids, mapper.outputs, settings.block_size, config,
                                        provenance, overwrite=overwrite, hints=extractor.hints,
                                        dtypes=getattr(mapper, "dtypes", None), codec=settings.codec)
    if resuming:
        _recompute_damaged(store)
        _retry_failures(store, retry_failed)
    try:
        with open_executor(settings.scheduler, settings.workers, devices, settings.decode_threads,
                           settings.read_ahead) as executor:
            summary = extract(store, paths, factory, executor, settings.on_error, progress,
                              resize=load_resize(mapper), decode_threads=decode_threads(settings))
        if extractor.finish is not None:
            extractor.finish(store, dataset, settings)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: say what is kept
        exc.args = (f"interrupted: {images_kept(store)}, re-run the same command to resume",)
        raise
    except OSError as exc:
        reason = disk_error_reason(exc)
        if reason is None:
            raise
        raise UserError(f"{out}: cannot write the feature store: {reason}; {images_kept(store)}, the same "
                        "command resumes") from None
    store.set_attrs(failures=summary.failures, complete=True,
                    summary={"rows_written": summary.rows_written, "rows_skipped": summary.rows_skipped,
                             "failed": len(summary.failures), "seconds": round(summary.seconds, 3)})
    return summary


def _recompute_damaged(store: FeatureStore) -> None:
    """The resume check: clear the flags of finished blocks whose chunk files are missing or empty.

    Files are only ``stat``-ed (see :mod:`features.store.verify`); ``features verify`` decodes them.
    """
    from features.store.verify import check_files

    damaged = check_files(store)
    if damaged:
        first = min(damaged)
        console.warning(f"features: {len(damaged)} finished block(s) of {store.path} are damaged (block "
                        f"{first}: {damaged[first][0]}); recomputing them")
        store.clear_blocks(sorted(damaged))


def _retry_failures(store: FeatureStore, everything: bool = False) -> None:
    """Recompute the finished blocks holding failures that may be transient (every failure with
    ``everything``; :func:`features.executors.extract.retry_failures`), saying so on stderr."""
    images, blocks = retry_failures(store, everything)
    if blocks:
        what = ("recorded failures" if everything
                else "failures that may be transient (missing file, I/O error, truncated file)")
        console.warning(f"features: retrying {images} image(s) with {what}: recomputing {blocks} block(s)")


def rethreshold_store(path: Path, low: float, high: float) -> Path:
    """Recompute ``fne/ternary`` of a finished FNE store with new thresholds, under the store's lock.

    The new array is written aside and swapped in (:meth:`FeatureStore.replace_ternary`): a kill at
    any point leaves a complete ternary array whose attributes name its thresholds.
    """
    check_threshold_options(low, high)
    FeatureStore(path)  # a clear error for a path that is not a store, before creating a lock file
    with exclusive_lock(path, "the feature store"):
        probe_writable(path)
        store = FeatureStore(path, mode="r+")
        store.recover()
        store.require_complete()
        if not store.has("fne/mean"):
            raise UserError(f"{path}: not a Full-Network Embedding store (no fne/mean); "
                            "nothing to rethreshold")
        write_ternary(store, low, high)
    console.result(f"features: rewrote fne/ternary with thresholds {low} / {high} -> {path}")
    return path


def _print_summary(summary: ExtractSummary, out: Path) -> None:
    console.result(summary.line(out))
    for f in summary.failures[:20]:
        console.result(f"  failed imgid {f['imgid']}: {f['path']}: {f['reason']}")
    if len(summary.failures) > 20:
        console.result(f"  ... and {len(summary.failures) - 20} more (all listed in the store's 'failures' "
                       "attribute)")
    if len(summary.devices) > 1:
        console.info("features: blocks per worker device: " + ", ".join(
            f"{device}: {blocks}" for device, blocks in sorted(summary.devices.items())))
    if summary.rows_written:
        total = summary.decode_s + summary.map_s + summary.write_s
        # on stderr, as always: the timing is no result, and stdout keeps only the summary
        console.warning(f"features: time in blocks: decode and resize {summary.decode_s:.1f} s, network "
                        f"{summary.map_s:.1f} s, write {summary.write_s:.1f} s (sum over workers "
                        f"{total:.1f} s)")


def local_devices(settings: FeaturesSection) -> list[str]:
    """The GPUs the workers of ``--scheduler local`` are pinned to, one each (round robin): with ``--device
    cuda`` (or ``auto`` on a machine with CUDA) every GPU of this machine, with ``cuda:N`` that one; none on
    the CPU or on another scheduler."""
    if settings.scheduler != "local" or str(settings.device) == "cpu":
        return []
    device = resolve_device(settings.device)
    if device.type != "cuda":
        return []
    import torch

    if device.index is not None:
        return [str(device.index)]
    return [str(i) for i in range(torch.cuda.device_count())]


def decode_threads(settings: FeaturesSection) -> int | None:
    """Threads decoding a block's images: ``--decode-threads``, else in-process the CPU count, for ``local``
    the CPU count divided among ``--workers``, on a remote cluster each worker's own count (None)."""
    if settings.decode_threads is not None:
        if settings.decode_threads < 1:
            raise UserError(f"--decode-threads must be at least 1, got {settings.decode_threads}")
        return int(settings.decode_threads)
    if settings.scheduler == "none":
        return default_decode_threads()
    if settings.scheduler == "local":
        return max(1, default_decode_threads() // max(1, settings.workers))
    return None


def probe_writable(path: Path) -> None:
    """A one-line UserError, before the model is loaded or any block computed, unless files can be
    created in the existing store ``path`` (a new store is created in its parent, where the lock file
    was just created: that proves the parent writable).

    Creates and removes one small file in the store's folder.
    """
    probe = path / f".write-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            os.write(fd, b"probe")
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as exc:
        with contextlib.suppress(OSError):
            probe.unlink()
        reason = disk_error_reason(exc) or f"{exc.strerror or exc}: make it writable (or use another --out)"
        raise UserError(f"{path}: the feature store is not writable: {reason}; nothing was computed or "
                        "changed") from None
