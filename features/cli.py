"""The ``features`` command: parse the command line and call the library.

``features cnn`` (10-crop global CNN features), ``features fne`` (the Full-Network Embedding),
``features regions`` (grid cells of a CNN's feature map, or Faster R-CNN boxes: :mod:`features.regions`)
run :func:`features.run.run_features`; ``features export`` / ``features import`` (VSE++/SCAN precomp
``.npy``, SCAN region precomp, bottom-up-attention TSV, HDF5) :mod:`features.export` and
:mod:`features.interop`; ``features verify`` (integrity of a store's finished blocks)
:mod:`features.verify`. Settings merge as everywhere: explicit options > ``--pipeline`` > the schema
defaults in :mod:`pipelines.schema`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from features.recipe import GRID_CNN
from features.run import run_features
from features.signals import exit_status, signal_handlers
from features.store import FeatureStore
from features.store_layout import ROW_CODECS
from pipelines.schema import add_pipeline_arguments, stage_settings
from vsecore.device import add_device_argument
from vsecore.errors import UserError, add_common_options, run_cli

PROG = "features"


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
    add_device_argument(p, None)
    p.add_argument("--amp", action="store_true", default=None,
                   help="bf16 autocast on CUDA (faster; numbers differ slightly from fp32)")
    _run_options(p)
    if fne:
        p.add_argument("--threshold-low", type=float, metavar="X", default=None,
                       help="ternary threshold: standardised values below it map to -1 (default -0.25)")
        p.add_argument("--threshold-high", type=float, metavar="Y", default=None,
                       help="ternary threshold: standardised values above it map to 1 (default 0.15)")
        p.add_argument("--rethreshold", action="store_true",
                       help="only recompute fne/ternary of the finished store --out with the thresholds")


def _run_options(p: argparse.ArgumentParser) -> None:
    """Where blocks run (scheduler, workers, threads), what an unusable image does, resume and retry."""
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
    p.add_argument("--codec", choices=ROW_CODECS, default=None,
                   help="compression of the region rows: zstd (default, the smallest files) or lz4 (Blosc "
                        "LZ4HC, byte shuffle: about 2.6x faster to decompress while training, about 1.3x "
                        "the bytes); `features recompress` converts a finished store")


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
    p = sub.add_parser("recompress", help="copy a finished store with its region rows in another codec",
                       description="Write a copy of a finished store whose arrays stored one chunk per row "
                                   "(region features) are compressed by --codec: the same rows bit for bit, "
                                   "the same record, so runs and their fingerprints accept it. zstd is the "
                                   "default and the smallest; lz4 (Blosc LZ4HC, byte shuffle) decompresses "
                                   "about 2.6x faster for about 1.3x the bytes (docs/features.md). The "
                                   "source is only read; an interrupted copy resumes.")
    p.add_argument("store", metavar="STORE.zarr", help="the finished feature store to copy")
    p.add_argument("--codec", choices=ROW_CODECS, required=True, help="the codec of the copy's row arrays")
    p.add_argument("--out", metavar="STORE.zarr", required=True, help="the copy to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at --out")
    add_common_options(parser)
    return parser


def _recompress(args: argparse.Namespace) -> int:
    from features.recompress import recompress_store

    s = recompress_store(args.store, args.out, args.codec, overwrite=args.overwrite)
    kept = s.blocks - s.blocks_written
    print(f"features: wrote {s.store} ({', '.join(s.row_arrays)} in {s.codec}: {s.bytes_before / 1e9:.2f} GB "
          f"-> {s.bytes_after / 1e9:.2f} GB; {s.blocks_written} blocks in {s.seconds:.1f} s"
          + (f", {kept} kept from the interrupted copy)" if kept else ")"))
    return 0


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
    if args.command == "recompress":
        return _recompress(args)
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
