"""The ``features`` command: images of a prepared dataset -> a feature store.

``features cnn`` (10-crop global CNN features), ``features fne`` (the Full-Network Embedding),
``features regions`` (grid cells of a CNN's feature map, or Faster R-CNN boxes: :mod:`features.regions`),
``features export`` / ``features import`` (VSE++/SCAN precomp ``.npy``, SCAN region precomp,
bottom-up-attention TSV, HDF5), ``features verify`` (integrity of a store's finished blocks). Every
command that writes a store holds its lock (:func:`vsecore.io.exclusive_lock`) for its whole run.
Settings merge as everywhere: explicit options > ``--pipeline`` > the schema defaults in
:mod:`pipelines.schema`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from features.entry import exit_status, signal_handlers
from features.executors import cached_mapper, check_scheduler, open_executor
from features.extract import ExtractSummary, Mapper, extract, finish_fne, retry_failures, write_ternary
from features.images import check_sizes
from features.store import WRITE_ERRNOS, FeatureStore, blocks_kept, probe_writable
from pipelines.schema import FeaturesSection, add_pipeline_arguments, stage_settings
from prep.dataset import DATASET_FILE, PreparedDataset
from vsecore.device import DEVICE_HELP, resolve_device
from vsecore.errors import UserError, add_common_options, run_cli
from vsecore.io import exclusive_lock, sha256_file

PROG = "features"
#: the network of ``features regions --detector grid`` when no --cnn is given: its ImageNet weights install
#: offline (see README), and its 7 x 7 x 1280 last feature map gives 49 regions
GRID_CNN = "efficientnet_lite0"
#: mapper settings that change speed, not the stored numbers (left out of a region store's config)
SPEED_KEYS = ("batch_size", "device", "threads", "allow_download")


@dataclass(frozen=True)
class ImageMapperFactory:
    """Recipe for a ``features.mapper.ImageMapper``: a plain dict, so it pickles to Dask workers.

    ``device`` ``auto`` is resolved where the mapper is built (a worker may have a GPU the
    driver lacks).
    """

    config_json: str

    @classmethod
    def from_settings(cls, settings: FeaturesSection, device: str | None = None) -> ImageMapperFactory:
        """The recipe of the mapper that ``settings`` asks for (``threads`` resolved, see
        :func:`torch_threads`, so the driver and every worker use the same count)."""
        if settings.kind == "regions":
            return cls(json.dumps(region_config(settings, device), sort_keys=True))
        config = {
            "cnn": settings.cnn, "weights": settings.weights, "allow_download": settings.allow_download,
            "kind": "fne" if settings.kind == "fne" else "global", "crops": settings.crops,
            "batch_size": settings.batch_size, "device": device or settings.device, "amp": settings.amp,
            "input_size": settings.input_size, "resize": settings.resize, "threads": torch_threads(settings),
        }
        return cls(json.dumps(config, sort_keys=True))

    @property
    def config(self) -> dict[str, Any]:
        """The mapper configuration as a dict."""
        return json.loads(self.config_json)

    @property
    def key(self) -> str:
        """Cache key: the whole configuration."""
        return self.config_json

    def build(self) -> Mapper:
        """Load the backbone and build the mapper (once per process, see ``cached_mapper``)."""
        from features.mapper import ImageMapper

        config = self.config
        config["device"] = str(resolve_device(config["device"]))
        if config.get("kind") == "regions":
            from features.regions import build_region_mapper

            return build_region_mapper(config)
        return ImageMapper.from_config(config)


def region_config(settings: FeaturesSection, device: str | None = None) -> dict[str, Any]:
    """The plain config of the region mapper ``settings`` ask for (see
    :func:`features.regions.build_region_mapper`).

    ``grid``: ``--cnn`` (default :data:`GRID_CNN`), ``--weights``, ``--input-size``. ``fasterrcnn``: weights
    ``coco`` (``imagenet``, the schema default, means the detector's own COCO weights), a file or ``none``;
    ``--input-size`` the shorter side the detector sees (default 800, the longer capped at 1333 / 800 of it);
    ``fixed_boxes`` K gives exactly K regions (``min_boxes = max_boxes = K``), ``null`` the adaptive
    ``min_boxes..max_boxes``; the selection's ``score_threshold`` and ``nms_threshold``.
    """
    from features.regions import DETECTORS, FASTERRCNN_NETWORK

    detector = "fasterrcnn" if settings.detector == FASTERRCNN_NETWORK else settings.detector
    common = {"kind": "regions", "detector": detector, "allow_download": settings.allow_download,
              "batch_size": settings.batch_size, "device": device or settings.device, "amp": settings.amp,
              "threads": torch_threads(settings)}
    if detector == "grid":
        cnn = settings.cnn if "cnn" in settings.model_fields_set else GRID_CNN
        return {**common, "cnn": cnn, "weights": settings.weights, "input_size": settings.input_size}
    if detector == "fasterrcnn":
        if "cnn" in settings.model_fields_set:
            raise UserError(f"--cnn {settings.cnn}: the network of --detector fasterrcnn is "
                            f"{FASTERRCNN_NETWORK}; --cnn chooses the network of --detector grid")
        low, high = ((settings.fixed_boxes, settings.fixed_boxes) if settings.fixed_boxes
                     else (settings.min_boxes, settings.max_boxes))
        weights = "coco" if settings.weights == "imagenet" else settings.weights
        scale = {} if settings.input_size is None else {
            "min_size": settings.input_size, "max_size": round(settings.input_size * 1333 / 800)}
        return {**common, **scale, "weights": weights, "min_boxes": low, "max_boxes": high,
                "score_threshold": settings.score_threshold, "nms_iou": settings.nms_threshold}
    if detector == "detectron2":
        return {**common, "detector": detector}  # build_region_mapper explains the way round it
    raise UserError(f"--detector {settings.detector!r}: use one of {', '.join(DETECTORS)}")


def torch_threads(settings: FeaturesSection) -> int:
    """Intra-op torch threads of every mapper of a run: ``--threads``, else a default per scheduler.

    CPU kernels sum in an order that depends on the thread count (rows differ in the last bits:
    up to 1.4e-6 for EfficientNet-Lite0 between 1 and 2 threads), so the count is fixed per run and
    sent to the workers with the mapper's recipe: the same ``--threads`` gives bit-identical rows
    in-process and on any cluster. Defaults: in-process all of torch's threads; ``local``: the CPU
    cores shared among ``--workers``; a remote cluster: 1 (as ``dask worker`` sets).
    """
    if settings.threads is not None:
        if settings.threads < 1:
            raise UserError(f"--threads must be at least 1, got {settings.threads}")
        return int(settings.threads)
    if settings.scheduler == "none":
        import torch

        return int(torch.get_num_threads())
    if settings.scheduler == "local":
        return max(1, (os.cpu_count() or 1) // max(1, settings.workers))
    return 1


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
    CPU rows, see :func:`torch_threads`), not what the rows are.
    """
    prov = mapper.provenance
    if settings.kind == "regions":
        described = getattr(mapper, "config", {})
        # amp as asked: on a cluster the driver's CPU copy has it off while CUDA workers use it
        return {**{k: v for k, v in described.items() if k not in SPEED_KEYS}, "kind": "regions",
                "amp": settings.amp, "weights_sha256": prov.get("weights_sha256"),
                "block_size": settings.block_size,
                "images_sha256": images_sha256, "n_rows": n_rows, "outputs": dict(mapper.outputs)}
    config = {
        "kind": settings.kind, "cnn": settings.cnn, "weights": settings.weights,
        "weights_sha256": prov.get("weights_sha256"), "crops": settings.crops,
        "input_size": prov.get("input_size", settings.input_size),
        "resize": prov.get("resize", settings.resize),
        "amp": settings.amp, "block_size": settings.block_size, "images_sha256": images_sha256,
        "n_rows": n_rows, "outputs": dict(mapper.outputs),
    }
    if settings.kind == "fne":
        config["thresholds"] = [settings.threshold_low, settings.threshold_high]
    return config


def run_features(settings: FeaturesSection, overwrite: bool = False, rethreshold: bool = False,
                 progress: bool = True, retry_failed: bool = False) -> Path:
    """Run ``features cnn|fne|regions`` with resolved ``settings``; return the store's path.

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
    _check_thresholds(settings)
    check_sizes(settings.input_size, None if settings.kind == "regions" else settings.resize)
    check_scheduler(settings.scheduler, settings.workers)
    dataset = _dataset(settings)
    if not dataset.images:
        raise UserError(f"{dataset.root}: the prepared dataset has no images")
    # Locked before the model is loaded (a second writer is told at once) and before --overwrite
    # deletes anything; released by the kernel if this process dies.
    with exclusive_lock(out, "the feature store"):
        summary = _extract_locked(settings, dataset, out, overwrite, progress, retry_failed)
    _print_summary(summary, out)
    return out


def _extract_locked(settings: FeaturesSection, dataset: PreparedDataset, out: Path, overwrite: bool,
                    progress: bool, retry_failed: bool = False) -> ExtractSummary:
    """The body of :func:`run_features`, run while holding the store's lock."""
    if out.is_dir() and not overwrite:
        probe_writable(out)
    dataset_sha = sha256_file(dataset.root / DATASET_FILE)
    images_sha = dataset.images_fingerprint()
    paths = [str(p) for p in dataset.image_paths()]
    imgids = np.arange(len(paths), dtype=np.int64)
    in_process = settings.scheduler == "none"
    # The driver needs the widths and provenance; in-process its mapper is the one that computes.
    # On a cluster the driver's copy only describes the model, so it stays on the CPU, and
    # ``auto`` is resolved by each worker (the driver may have no GPU).
    if in_process:
        factory = driver = ImageMapperFactory.from_settings(settings, str(resolve_device(settings.device)))
    else:
        factory = ImageMapperFactory.from_settings(settings)
        driver = ImageMapperFactory.from_settings(settings, "cpu")
    mapper = cached_mapper(driver)
    config = store_config(settings, mapper, images_sha, len(paths))
    provenance = {**mapper.provenance, "dataset": str(dataset.root), "dataset_sha256": dataset_sha,
                  "images_sha256": images_sha, "thresholds": config.get("thresholds"),
                  "torch_threads": factory.config["threads"]}
    hints = {"thresholds": "use `features fne --rethreshold` to change only the thresholds, or --overwrite"}
    resuming = out.exists() and not overwrite
    store = FeatureStore.open_or_create(out, imgids, mapper.outputs, settings.block_size, config,
                                        provenance, overwrite=overwrite, hints=hints,
                                        dtypes=getattr(mapper, "dtypes", None))
    if resuming:
        _recompute_damaged(store)
        _retry_failures(store, retry_failed)
    try:
        with open_executor(settings.scheduler, settings.workers) as executor:
            summary = extract(store, paths, factory, executor, settings.on_error, progress,
                              resize=_mapper_resize(settings, mapper))
        if settings.kind == "fne":
            train = np.array([im.split == "train" for im in dataset.images], dtype=bool)
            finish_fne(store, train, settings.threshold_low, settings.threshold_high)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: say what is kept
        exc.args = (f"interrupted: {blocks_kept(store)}, re-run the same command to resume",)
        raise
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        raise UserError(f"{out}: cannot write the feature store ({exc.strerror or exc}); "
                        f"{blocks_kept(store)}: {WRITE_ERRNOS[exc.errno]} and re-run the same command to "
                        "resume") from None
    store.set_attrs(failures=summary.failures, complete=True,
                    summary={"rows_written": summary.rows_written, "rows_skipped": summary.rows_skipped,
                             "failed": len(summary.failures), "seconds": round(summary.seconds, 3)})
    return summary


def _mapper_resize(settings: FeaturesSection, mapper: Mapper) -> int | None:
    """The shorter side the crops mapper resizes images to (region mappers bound their own views)."""
    if settings.kind == "regions":
        return None
    backbone = getattr(mapper, "backbone", None)
    return int(backbone.resize) if backbone is not None else None


def _recompute_damaged(store: FeatureStore) -> None:
    """The resume check: clear the flags of finished blocks whose chunk files are missing or empty.

    Files are only ``stat``-ed (see :mod:`features.verify`); ``features verify`` decodes them.
    """
    from features.verify import check_files

    damaged = check_files(store)
    if damaged:
        first = min(damaged)
        print(f"features: {len(damaged)} finished block(s) of {store.path} are damaged (block {first}: "
              f"{damaged[first][0]}); recomputing them", file=sys.stderr)
        store.clear_blocks(sorted(damaged))


def _retry_failures(store: FeatureStore, everything: bool = False) -> None:
    """Recompute the finished blocks holding failures that may be transient (every failure with
    ``everything``; :func:`features.extract.retry_failures`), saying so on stderr."""
    images, blocks = retry_failures(store, everything)
    if blocks:
        what = ("recorded failures" if everything
                else "failures that may be transient (missing file, I/O error, truncated file)")
        print(f"features: retrying {images} image(s) with {what}: recomputing {blocks} block(s)",
              file=sys.stderr)


def _check_thresholds(settings: FeaturesSection) -> None:
    check_threshold_options(settings.threshold_low, settings.threshold_high)


def check_threshold_options(low: float, high: float) -> None:
    """A one-line :class:`UserError` unless ``--threshold-low`` and ``--threshold-high`` are finite and
    ``low < high`` (NaN or inf would silently give a ternary code of {0, 1} or all zeros)."""
    from features.fne import check_thresholds

    for option, value in (("--threshold-low", low), ("--threshold-high", high)):
        if not math.isfinite(value):
            raise UserError(f"{option} {value}: must be a finite number")
    try:
        check_thresholds(low, high)
    except ValueError:
        raise UserError(f"--threshold-low ({low}) must be below --threshold-high ({high})") from None


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
    print(f"features: rewrote fne/ternary with thresholds {low} / {high} -> {path}")
    return path


def _print_summary(summary: ExtractSummary, out: Path) -> None:
    print(summary.line(out))
    for f in summary.failures[:20]:
        print(f"  failed imgid {f['imgid']}: {f['path']}: {f['reason']}")
    if len(summary.failures) > 20:
        print(f"  ... and {len(summary.failures) - 20} more (all listed in the store's 'failures' attribute)")
    if summary.rows_written:
        total = summary.decode_s + summary.map_s + summary.write_s
        print(f"features: time in blocks: decode {summary.decode_s:.1f} s, network {summary.map_s:.1f} s, "
              f"write {summary.write_s:.1f} s (sum over workers {total:.1f} s)", file=sys.stderr)


# -- command line ---------------------------------------------------------------------------------
def _extraction_options(p: argparse.ArgumentParser, kind: str) -> None:
    fne, regions = kind == "fne", kind == "regions"
    add_pipeline_arguments(p)
    p.add_argument("--data", metavar="DIR", default=None,
                   help="prepared dataset folder (written by `prep`); rows follow its image order")
    p.add_argument("--out", metavar="STORE.zarr", default=None, help="feature store to write (Zarr v3)")
    if regions:
        _region_options(p)
    else:
        p.add_argument("--cnn", metavar="NAME", default=None,
                       help="network: vgg16, vgg19 (fc7, 4096), resnet152 (pooled 2048), inception_resnet_v2 "
                            "(pooled 1536, 299 px) or any timm model name (its pooled features); default "
                            "vgg19" + (" (FNE: vgg16 in the paper)" if fne else ""))
        p.add_argument("--weights", metavar="imagenet|PATH|none", default=None,
                       help="imagenet: from the local torchvision/timm caches (never downloaded unless "
                            "--allow-download); PATH: a state dict file; none: random init, for tests")
    p.add_argument("--allow-download", action="store_true", default=None,
                   help="let torchvision/timm download missing pretrained weights")
    if not regions:
        p.add_argument("--crops", type=int, choices=(1, 10), default=None,
                       help="10: four corners and centre plus mirrors, averaged (the papers); 1: centre crop")
        p.add_argument("--resize", type=int, metavar="PX", default=None,
                       help="shorter side before cropping (default: the network's own, 256 for 224 px nets)")
    p.add_argument("--input-size", type=int, metavar="PX", default=None,
                   help="grid: the side the whole image is resized to (default: the network's input size); "
                        "fasterrcnn: the shorter side the detector sees (default 800, longer side at most "
                        "1333/800 of it)" if regions else "crop size (default: the network's input size)")
    p.add_argument("--batch-size", type=int, metavar="N", default=None,
                   help="images per forward pass on CUDA (on the CPU every image runs alone); default 32"
                   if regions else "images per forward pass (each is --crops crops); default 32")
    p.add_argument("--block-size", type=int, metavar="N", default=None,
                   help="rows per block: the unit of work, of resumption and of Zarr chunks; default 256")
    p.add_argument("--device", default=None, help=DEVICE_HELP)
    p.add_argument("--amp", action="store_true", default=None,
                   help="bf16 autocast on CUDA (faster; numbers differ slightly from fp32)")
    p.add_argument("--scheduler", metavar="none|local|tcp://HOST:PORT", default=None,
                   help="none (default): in this process; local: start a Dask LocalCluster of --workers "
                        "processes; tcp://HOST:PORT: a running `dask scheduler` whose workers share the "
                        "store's filesystem")
    p.add_argument("--workers", type=int, metavar="N", default=None,
                   help="worker processes of --scheduler local (default 2)")
    p.add_argument("--threads", type=int, metavar="N", default=None,
                   help="torch threads of the network on the CPU, in this process and in every Dask worker "
                        "(the same N gives bit-identical rows anywhere); default: all of torch's threads "
                        "in-process, the CPU cores divided among --workers for local, 1 on a remote cluster")
    p.add_argument("--on-error", choices=("record", "fail"), default=None,
                   help="record (default): unusable images are listed in the store and summary, their rows "
                        "NaN with valid=False; fail: stop at the first one")
    p.add_argument("--overwrite", action="store_true",
                   help="delete an existing store at --out and start over (default: resume it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--retry-failed", action="store_true",
                   help="recompute the blocks of every recorded failure (a re-run always retries failures "
                        "that may be transient: missing file, I/O error, truncated file)")
    if fne:
        p.add_argument("--threshold-low", type=float, metavar="X", default=None,
                       help="ternary threshold: standardised values below it map to -1 (default -0.25)")
        p.add_argument("--threshold-high", type=float, metavar="Y", default=None,
                       help="ternary threshold: standardised values above it map to 1 (default 0.15)")
        p.add_argument("--rethreshold", action="store_true",
                       help="only recompute fne/ternary of the finished store --out with the thresholds")


def _region_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--detector", metavar="grid|fasterrcnn", default=None,
                   help="grid (default): the cells of --cnn's last feature map are the regions (EfficientNet-"
                        "Lite0: 7x7 = 49 regions of 1280, real weights offline); fasterrcnn: torchvision's "
                        "fasterrcnn_resnet50_fpn, bottom-up-attention selection of its RPN boxes, 1024-d "
                        "RoI-pooled box-head features")
    p.add_argument("--cnn", metavar="NAME", default=None,
                   help="grid only: the network whose last feature map is cut into regions (default "
                        f"{GRID_CNN}; vgg16/vgg19: pool5 512 x 7x7; resnet152: layer4 2048 x 7x7; any "
                        "timm model name)")
    p.add_argument("--weights", metavar="imagenet|coco|PATH|none", default=None,
                   help="grid: imagenet (default, from the local caches); fasterrcnn: coco (default; the "
                        "torchvision COCO checkpoint from the local torch cache); PATH: a state dict file; "
                        "none: seeded random init, for tests")
    p.add_argument("--boxes", dest="fixed_boxes", type=int, metavar="K", default=None,
                   help="fasterrcnn: exactly K regions per image (default 36, BUTD's fixed K)")
    p.add_argument("--min-boxes", type=int, metavar="N", default=None,
                   help="fasterrcnn: adaptive regions, at least N (BUTD: 10); given without --boxes, the "
                        "count is adaptive")
    p.add_argument("--max-boxes", type=int, metavar="N", default=None,
                   help="fasterrcnn: adaptive regions, at most N (BUTD: 100; the store's k)")
    p.add_argument("--score-threshold", type=float, metavar="X", default=None,
                   help="fasterrcnn: keep boxes whose best class probability is at least X (default 0.2)")
    p.add_argument("--nms-threshold", type=float, metavar="IOU", default=None,
                   help="fasterrcnn: class-agnostic NMS IoU (default 0.3)")


def _export_and_import_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``features export`` and ``features import``."""
    p = sub.add_parser("export", help="write a store's features as VSE++/SCAN precomp .npy or HDF5",
                       description="Write a finished store's features for other codebases: VSE++/SCAN "
                                   "precomp ({split}_ims.npy, {split}_caps.txt, {split}_ids.json per split, "
                                   "dev = val; a 5,000-image test split as testall_* and its first 1,000 as "
                                   "test_*) or one HDF5 file (features, imgid, valid, split, filename, "
                                   "cocoid). Refuses a store made for another prepared dataset, and failed "
                                   "images unless --allow-invalid.")
    p.add_argument("--store", metavar="STORE.zarr[:KEY]", required=True,
                   help="feature store; KEY global, fne (ternary), fne_raw or regions (default: what it has)")
    p.add_argument("--data", metavar="DIR", required=True, help="the prepared dataset of the store")
    p.add_argument("--format", choices=("precomp", "hdf5", "butd-tsv"), required=True,
                   help="precomp: {train,dev,test}_ims.npy (dev = val, as VSE++/SCAN name it), (n, C) or, "
                        "for regions, SCAN's (n, k, D) with zero padding rows and {split}_counts.npy; hdf5: "
                        "one file (regions stores: also boxes, counts, image_size); butd-tsv: one "
                        "bottom-up-attention TSV of a region store (image_id, image_w, image_h, num_boxes, "
                        "base64 float32 boxes and features), failed images left out")
    p.add_argument("--out", metavar="DIR|FILE.h5|FILE.tsv", required=True,
                   help="output folder (precomp; other files in it are kept) or file (hdf5); never the store,"
                        " the prepared dataset or a place inside them or another store, dataset or run")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing files of the same names (the precomp files, or the hdf5 file)")
    p.add_argument("--split", choices=("train", "val", "test"), action="append", default=None,
                   help="only these splits (repeatable; default all with images)")
    p.add_argument("--allow-invalid", action="store_true",
                   help="write rows of failed images (NaN) instead of refusing")
    p.add_argument("--captions-per-image", type=int, default=None, metavar="K",
                   help="precomp: keep each image's first K captions, repeating them in order where it has "
                        "fewer (VSE++/SCAN pair caption i with image i // 5); needed when a split's images "
                        "do not all have 5 (or all 1) captions, which is refused otherwise")
    p = sub.add_parser("import", help="read VSE++/SCAN precomp .npy, HDF5 or bottom-up-attention TSV into a "
                                      "store",
                       description="Read features made elsewhere into a store of a prepared dataset. Rows "
                                   "the file lacks, and rows holding NaN or inf, are stored invalid and "
                                   "reported.")
    p.add_argument("--format", choices=("precomp", "scan-precomp", "butd-tsv", "hdf5"), default="precomp",
                   help="precomp (default): a VSE++ {split}_ims.npy of global features (n, C); scan-precomp: "
                        "SCAN's region {split}_ims.npy (n, k, D), e.g. (n, 36, 2048); butd-tsv: the "
                        "bottom-up-attention TSV (image_id, image_w, image_h, num_boxes, base64 boxes and "
                        "features), matched by image id; hdf5: a file as `features export --format hdf5` "
                        "writes it ('global', 'imgid', optionally 'valid', 'filename', 'cocoid'), rows "
                        "placed by imgid, filename/cocoid checked against --data")
    p.add_argument("--npy", metavar="FILE.npy", default=None,
                   help="precomp / scan-precomp: the split's array, rows in the split's image order")
    p.add_argument("--ids", metavar="FILE", default=None,
                   help="scan-precomp: one image id per row (e.g. SCAN's {split}_ids.txt): match rows by "
                        "id instead of by order")
    p.add_argument("--h5", metavar="FILE.h5", default=None, help="hdf5: the file to import")
    p.add_argument("--tsv", metavar="FILE", action="append", default=None,
                   help="butd-tsv: a TSV file (repeatable: BUTD ships trainval as .tsv.0 .. .tsv.3)")
    p.add_argument("--data", metavar="DIR", required=True, help="prepared dataset the rows belong to")
    p.add_argument("--split", choices=("train", "val", "test"), default=None,
                   help="split whose images the rows are (required for precomp and scan-precomp); "
                        "butd-tsv, hdf5: only this split (default: every image the file has)")
    p.add_argument("--out", metavar="STORE.zarr", required=True,
                   help="store to write; an existing imported store of the same dataset gains the split")
    p.add_argument("--overwrite", action="store_true", help="start a new store even if --out exists")


def build_parser() -> argparse.ArgumentParser:
    """The ``features`` argument parser with its subcommands."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Images of a prepared dataset -> a resumable Zarr feature store, in this "
                               "process or on a Dask cluster.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("cnn", help="10-crop averaged global CNN features -> 'global'",
                       description="10-crop averaged global CNN features (CHAIN-VSE 2.3, OECC 2.2) "
                                   "-> 'global'.")
    _extraction_options(p, "cnn")
    p = sub.add_parser("fne", help="Full-Network Embedding -> fne/raw, fne/mean, fne/std, fne/ternary",
                       description="Full-Network Embedding (FNE 3.1): average-pooled activations of every "
                                   "conv layer plus fc6/fc7, averaged over crops, standardised with "
                                   "train-split statistics and discretized to {-1, 0, 1}.")
    _extraction_options(p, "fne")
    p = sub.add_parser("regions", help="region features -> regions (N, k, D), boxes (N, k, 4), counts (N,)",
                       description="Region features for CLMR/LIWE: k regions of D features per image "
                                   "(zero rows after an image's real regions), their boxes in pixels, "
                                   "their count, and the image size.")
    _extraction_options(p, "regions")
    _export_and_import_parsers(sub)
    p = sub.add_parser("verify", help="check the finished blocks of a store (chunk files, finite valid rows)",
                       description="Check every block flagged done: its chunk files exist and decode, its "
                                   "valid rows are finite, and 'valid' is False exactly at its recorded "
                                   "failures. Exit status 0 when the store is complete and sound, 2 if not.")
    p.add_argument("store", metavar="STORE.zarr", help="the feature store to check (reads all of it)")
    p.add_argument("--data", metavar="DIR", default=None,
                   help="also check that the store was made for this prepared dataset")
    p.add_argument("--repair", action="store_true",
                   help="clear the done flag of damaged blocks (and mark the store incomplete) so that the "
                        "store's `features cnn|fne|regions` command recomputes them")
    add_common_options(parser)
    return parser


def _verify(args: argparse.Namespace) -> int:
    from features.verify import verify_store

    report = verify_store(args.store, args.data, repair=args.repair)
    for line in report.lines():
        print(line)
    if report.ok:
        return 0
    again = ("`features import` of the affected splits" if _kind(report.store) == "import"
             else "the store's `features cnn|fne|regions` command")
    if report.repaired:
        print(f"features verify: cleared {len(report.rows_damaged)} damaged block(s) and marked the store "
              f"incomplete; run {again} again to recompute them")
        return 0
    if report.blocks or report.store_problems:
        raise UserError(f"{report.store}: {len(report.blocks)} damaged block(s)"
                        f"{' and store problems' if report.store_problems else ''}; run `features verify "
                        f"{report.store} --repair`, then {again}")
    raise UserError(f"{report.store}: the store is incomplete ({report.done}/{report.n_blocks} blocks done); "
                    f"run {again} to finish it")


def _kind(path: Path) -> str:
    return str(FeatureStore(path).attrs.get("config", {}).get("kind", ""))


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (features.entry): one line, 130 or 143
        plain = "terminated" if exit_status(exc) == 143 else "interrupted"  # as run_cli says it
        print(f"{PROG}: {exc.args[0] if exc.args else plain}", file=sys.stderr)
        return exit_status(exc)


def _run(args: argparse.Namespace) -> int:
    if args.command in ("cnn", "fne", "regions"):
        settings = stage_settings("features", args, kind=args.command)
        if args.command == "regions" and args.fixed_boxes is None and (
                args.min_boxes is not None or args.max_boxes is not None):
            settings = settings.model_copy(update={"fixed_boxes": None})  # --min/--max-boxes: adaptive
        run_features(settings, overwrite=args.overwrite, rethreshold=getattr(args, "rethreshold", False),
                     progress=not args.no_progress, retry_failed=args.retry_failed)
        return 0

    if args.command == "export":
        from features.export import export_store

        written = export_store(args.store, args.data, args.format, args.out, splits=args.split,
                               allow_invalid=args.allow_invalid, overwrite=args.overwrite,
                               captions_per_image=args.captions_per_image)
        for path in written:
            print(f"features: wrote {path}")
        return 0
    if args.command == "verify":
        return _verify(args)
    return _import(args)


def _import(args: argparse.Namespace) -> int:
    from features import interop

    if args.format == "hdf5":
        if not args.h5 or args.npy or args.tsv:
            raise UserError("features import --format hdf5 reads --h5 FILE.h5, not --npy or --tsv")
        result = interop.import_hdf5(args.h5, args.data, args.out, split=args.split, overwrite=args.overwrite)
    elif args.format == "butd-tsv":
        if not args.tsv or args.npy:
            raise UserError("features import --format butd-tsv reads --tsv FILE (repeatable), not --npy")
        result = interop.import_regions(args.format, args.tsv, args.data, args.out, split=args.split,
                                        overwrite=args.overwrite)
    else:
        if not args.npy or args.tsv:
            raise UserError(f"features import --format {args.format} reads --npy FILE.npy, not --tsv")
        if args.split is None:
            raise UserError(f"features import --format {args.format}: --split is required (the split whose "
                            "images the rows are)")
        if args.format == "precomp":
            if args.ids:
                raise UserError("--ids matches region rows by id: it applies to --format scan-precomp")
            result = interop.import_npy(args.npy, args.data, args.split, args.out, overwrite=args.overwrite)
        else:
            result = interop.import_regions(args.format, [args.npy], args.data, args.out, split=args.split,
                                            ids=args.ids, overwrite=args.overwrite)
    what = f"the {args.split} rows" if args.split else "rows"
    print(f"features: imported {', '.join(map(str, result.files))} as {what} of {result.store} "
          f"({result.rows} rows)")
    if result.missing:
        print(f"features: {len(result.missing)} images of the dataset have no features in the file and are "
              f"stored invalid (imgid {_some(result.missing)})")
    if result.extra:
        print(f"features: {len(result.extra)} ids of the file match no image of the dataset (ignored; "
              f"e.g. {', '.join(result.extra[:3])})")
    if result.nonfinite:
        print(f"features: {len(result.nonfinite)} of {result.rows} imported rows hold NaN or inf and are "
              f"stored invalid (imgid {_some(result.nonfinite)})")
    return 0


def _some(ids: list[int], shown: int = 5) -> str:
    """The first ``shown`` ids, comma-separated, and how many more there are."""
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(str(i) for i in ids[:shown]) + more


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``features`` / ``python -m features`` (through :mod:`features.entry`)."""
    with signal_handlers():
        return run_cli(_main, argv, PROG)
