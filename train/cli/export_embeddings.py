"""``train export-embeddings``: parses, then :func:`train.retrieval.embeddings.export_embeddings`."""

from __future__ import annotations

import argparse

from train.cli.options import add_checkpoint_argument, add_run_arguments, run_from_arguments
from train.retrieval import embeddings
from train.retrieval.embeddings import export_embeddings
from vsecore import console
from vsecore.device import add_device_argument


def _command(args: argparse.Namespace) -> int:
    splits = args.split or ["test"]
    written = export_embeddings(run_from_arguments(args), args.out, splits, args.checkpoint, args.device,
                                overwrite=args.overwrite, accept_changed=args.accept_changed)
    console.result(f"wrote {len(written)} files to {args.out}: " + ", ".join(p.name for p in written))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train export-embeddings``."""
    p = sub.add_parser("export-embeddings", help="write a run's image and caption embeddings as .npy",
                       description=embeddings.__doc__.split("\n\n")[1].replace("\n", " "))
    add_run_arguments(p)
    p.add_argument("--out", metavar="DIR", required=True, help="folder to write the files into (its other "
                   "files are kept)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace files of the same names already in --out")
    p.add_argument("--split", action="append", choices=("train", "val", "test"),
                   help="split to export (repeatable; default test)")
    add_checkpoint_argument(p)
    add_device_argument(p)
    p.set_defaults(func=_command)
