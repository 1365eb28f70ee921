"""``train export-embeddings``: parses, then :func:`train.retrieval.embeddings.export_embeddings` (imported,
with torch, when the command runs)."""

from __future__ import annotations

import argparse

from train.cli.options import RETRIEVAL_RUN, add_checkpoint_argument, add_run_arguments, run_from_arguments
from vsecore import console
from vsecore.device import add_device_argument
from vsecore.options import add_out_option, add_overwrite_option

#: what the command writes (as :mod:`train.retrieval.embeddings` writes it; its module text, which the help
#: showed while it was imported to build the parser)
DESCRIPTION = (
    "For each split asked for, in the layout other codebases evaluate (VSE++/SCAN): {split}_img.npy (N, "
    "d) one row per image in the split's image order, {split}_cap.npy (M, d) the captions grouped by "
    "image in the same order, {split}_caption_image.npy (M,) the row of each caption's image, and "
    "{split}_ids.json (each image's prepared imgid, COCO id where known and file; each caption's text). "
    "`train evaluate --img-emb {split}_img.npy --cap-emb {split}_cap.npy` reads them back, with the "
    "caption-image file found beside them, to exactly the run's own numbers for any number of captions "
    "per image (a ragged split such as the COCO sample's test split included).")


def _command(args: argparse.Namespace) -> int:
    from train.retrieval.embeddings import export_embeddings  # start-up: torch only when the command runs

    splits = args.split or ["test"]
    written = export_embeddings(run_from_arguments(args), args.out, splits, args.checkpoint, args.device,
                                overwrite=args.overwrite, accept_changed=args.accept_changed)
    console.result(f"wrote {len(written)} files to {args.out}: " + ", ".join(p.name for p in written))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train export-embeddings``."""
    p = sub.add_parser("export-embeddings", help="write a run's image and caption embeddings as .npy",
                       description=DESCRIPTION)
    add_run_arguments(p, RETRIEVAL_RUN)
    add_out_option(p, "folder to write the files into (its other files are kept)", required=True)
    add_overwrite_option(p, "replace files of the same names already in --out")
    p.add_argument("--split", action="append", choices=("train", "val", "test"),
                   help="split to export (repeatable; default test)")
    add_checkpoint_argument(p)
    add_device_argument(p)
    p.set_defaults(func=_command)
