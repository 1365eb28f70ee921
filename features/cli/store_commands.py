"""The ``features`` subcommands of the store and its interop: ``export`` and ``import`` (VSE++/SCAN precomp
``.npy``, SCAN region precomp, bottom-up-attention TSV, HDF5: :mod:`features.interop`), ``verify``
(integrity of a store's finished blocks: :mod:`features.store.verify`) and ``recompress``
(:mod:`features.store.recompress`): their options, and what they print."""

from __future__ import annotations

import argparse
from pathlib import Path

from features.extractors.registry import kinds
from features.store.codecs import ROW_CODECS
from features.store.core import FeatureStore
from vsecore import console
from vsecore.errors import UserError
from vsecore.options import add_out_option, add_overwrite_option


def add_interop_parsers(sub: argparse._SubParsersAction) -> None:
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
    add_out_option(p, "output folder (precomp; other files in it are kept) or file (hdf5); never the store, "
                      "the prepared dataset or a place inside them or another store, dataset or run",
                   metavar="DIR|FILE.h5|FILE.tsv", required=True)
    add_overwrite_option(p, "replace existing files of the same names (the precomp files, or the hdf5 file)")
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
    add_out_option(p, "store to write; an existing imported store of the same dataset gains the split",
                   metavar="STORE.zarr", required=True)
    add_overwrite_option(p, "start a new store even if --out exists")


def add_store_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``features verify`` and ``features recompress``."""
    p = sub.add_parser("verify", help="check the finished blocks of a store (chunk files, finite valid rows)",
                       description="Check every block flagged done: its chunk files exist and decode, its "
                                   "valid rows are finite, and 'valid' is False exactly at its recorded "
                                   "failures. Exit status 0 when the store is complete and sound, 2 if not.")
    p.add_argument("store", metavar="STORE.zarr", help="the feature store to check (reads all of it)")
    p.add_argument("--data", metavar="DIR", default=None,
                   help="also check that the store was made for this prepared dataset")
    p.add_argument("--repair", action="store_true",
                   help="clear the done flag of damaged blocks (and mark the store incomplete) so that the "
                        "store's `features <kind>` command recomputes them")
    p = sub.add_parser("recompress", help="copy a finished store with its region rows in another codec",
                       description="Write a copy of a finished store whose arrays stored one chunk per row "
                                   "(region features) are compressed by --codec: the same rows bit for bit, "
                                   "the same record, so runs and their fingerprints accept it. zstd is the "
                                   "default and the smallest; lz4 (Blosc LZ4HC, byte shuffle) decompresses "
                                   "about 2.6x faster for about 1.3x the bytes (docs/features.md). The "
                                   "source is only read; an interrupted copy resumes.")
    p.add_argument("store", metavar="STORE.zarr", help="the finished feature store to copy")
    p.add_argument("--codec", choices=ROW_CODECS, required=True, help="the codec of the copy's row arrays")
    add_out_option(p, "the copy to write", metavar="STORE.zarr", required=True)
    add_overwrite_option(p, "replace an existing store at --out")


def run_recompress(args: argparse.Namespace) -> int:
    """``features recompress``: the copy, then one line of what it wrote."""
    from features.store.recompress import recompress_store

    s = recompress_store(args.store, args.out, args.codec, overwrite=args.overwrite)
    kept = s.blocks - s.blocks_written
    tail = f", {kept} kept from the interrupted copy)" if kept else ")"
    console.result(f"features: wrote {s.store} ({', '.join(s.row_arrays)} in {s.codec}: "
                   f"{s.bytes_before / 1e9:.2f} GB -> {s.bytes_after / 1e9:.2f} GB; "
                   f"{s.blocks_written} blocks in {s.seconds:.1f} s{tail}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """``features verify``: the report; exit status 0 for a sound store (or one just repaired)."""
    from features.store.verify import verify_store

    report = verify_store(args.store, args.data, repair=args.repair)
    for line in report.lines():
        console.result(line)
    if report.ok:
        return 0
    again = ("`features import` of the affected splits" if _kind(report.store) == "import"
             else f"the store's `features {'|'.join(kinds())}` command")
    if report.repaired:
        console.result(f"features verify: cleared {len(report.rows_damaged)} damaged block(s) and marked the "
                       f"store incomplete; run {again} again to recompute them")
        return 0
    if report.blocks or report.store_problems:
        raise UserError(f"{report.store}: {len(report.blocks)} damaged block(s)"
                        f"{' and store problems' if report.store_problems else ''}; run `features verify "
                        f"{report.store} --repair`, then {again}")
    raise UserError(f"{report.store}: the store is incomplete ({report.done}/{report.n_blocks} blocks done); "
                    f"run {again} to finish it")


def _kind(path: Path) -> str:
    return str(FeatureStore(path).attrs.get("config", {}).get("kind", ""))


def run_export(args: argparse.Namespace) -> int:
    """``features export``: the files, one line each."""
    from features.interop.export import export_store

    written = export_store(args.store, args.data, args.format, args.out, splits=args.split,
                           allow_invalid=args.allow_invalid, overwrite=args.overwrite,
                           captions_per_image=args.captions_per_image)
    for path in written:
        console.result(f"features: wrote {path}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    """``features import``: the rows, then what the file lacked, had beyond the dataset, or held unusable."""
    from features.interop import imports

    if args.format == "hdf5":
        if not args.h5 or args.npy or args.tsv:
            raise UserError("features import --format hdf5 reads --h5 FILE.h5, not --npy or --tsv")
        result = imports.import_hdf5(args.h5, args.data, args.out, split=args.split, overwrite=args.overwrite)
    elif args.format == "butd-tsv":
        if not args.tsv or args.npy:
            raise UserError("features import --format butd-tsv reads --tsv FILE (repeatable), not --npy")
        result = imports.import_regions(args.format, args.tsv, args.data, args.out, split=args.split,
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
            result = imports.import_npy(args.npy, args.data, args.split, args.out, overwrite=args.overwrite)
        else:
            result = imports.import_regions(args.format, [args.npy], args.data, args.out, split=args.split,
                                            ids=args.ids, overwrite=args.overwrite)
    what = f"the {args.split} rows" if args.split else "rows"
    console.result(f"features: imported {', '.join(map(str, result.files))} as {what} of {result.store} "
                   f"({result.rows} rows)")
    if result.missing:
        console.result(f"features: {len(result.missing)} images of the dataset have no features in the file "
                       f"and are stored invalid (imgid {_some(result.missing)})")
    if result.extra:
        console.result(f"features: {len(result.extra)} ids of the file match no image of the dataset "
                       f"(ignored; e.g. {', '.join(result.extra[:3])})")
    if result.nonfinite:
        console.result(f"features: {len(result.nonfinite)} of {result.rows} imported rows hold NaN or inf "
                       f"and are stored invalid (imgid {_some(result.nonfinite)})")
    return 0


def _some(ids: list[int], shown: int = 5) -> str:
    """The first ``shown`` ids, comma-separated, and how many more there are."""
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(str(i) for i in ids[:shown]) + more
