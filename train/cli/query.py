"""``train query``: parses, then :func:`train.retrieval.query.search` (imported, with torch, when the command
runs) and prints the hits."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from train.cli.options import (
    RETRIEVAL_RUN,
    add_checkpoint_argument,
    add_json_argument,
    add_run_arguments,
    run_from_arguments,
)
from train.config.run import store_path
from vsecore import console
from vsecore.device import add_device_argument
from vsecore.errors import UserError
from vsecore.io import write_json_atomic
from vsecore.options import add_overwrite_option
from vsecore.outputs import check_output_file


def _command(args: argparse.Namespace) -> int:
    # start-up: the model and the search (torch) only when the command runs, not for --help or a bad option
    from train.retrieval.open import load_run, run_inputs
    from train.retrieval.query import format_hits, search  # start-up: (as above)

    if not args.text and not args.image:
        raise UserError("give --text TEXT or --image PATH (repeatable)")
    if args.text and args.image:
        raise UserError("give --text or --image, not both")
    for text in args.text or []:
        if not text.strip():
            raise UserError(f"--text {text!r}: an empty query; give some words")
    run_dir = run_from_arguments(args)
    if args.json:  # not an input (the run, its data and store, the query images), not inside an artifact
        inputs = [run_dir, *run_inputs(run_dir), args.data,
                  store_path(args.features), *(args.image or [])]
        check_output_file(args.json, inputs=inputs, overwrite=args.overwrite, option="--json")
    run = load_run(run_dir, args.checkpoint, args.device)
    run.accept_changed = args.accept_changed
    split = None if args.split == "all" else args.split
    if args.data and args.split == "test" and not args.split_given:
        split = None  # another collection: all its images unless --split says otherwise
    queries = args.text or args.image
    results = search(run, text=args.text or None, image=args.image or None, top=args.top, split=split,
                     data=args.data, features=args.features)
    for query, hits in zip(queries, results, strict=True):
        console.result(format_hits(query, hits))
    if args.json:
        write_json_atomic(args.json, [{"query": q, "hits": [asdict(h) for h in hits]}
                                      for q, hits in zip(queries, results, strict=True)])
        console.info(f"wrote {args.json}")
    return 0


class _SplitAction(argparse.Action):
    """``--split``, remembering that it was given (its default differs with --data)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.split_given = True


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train query``."""
    p = sub.add_parser(
        "query", help="retrieve images for a text or captions for an image with a trained run",
        description="Text -> image or image -> text retrieval with a trained run, over one split of its "
        "prepared dataset, or over the images of another prepared dataset and its feature store (--data, "
        "--features). Image queries are featurized exactly as the run's feature store was (same "
        "network, weights, crops; FNE statistics and thresholds of the store). The candidates (the images "
        "for a text query, the captions for an image query) are embedded once and kept in the query cache "
        "($VSE_QUERY_CACHE, default ~/.cache/vse-toolkit/query; VSE_QUERY_CACHE=0: none), checked and "
        "rebuilt when the model, the store or the data change; later queries embed only themselves.")
    add_run_arguments(p, RETRIEVAL_RUN)
    p.add_argument("--text", action="append", metavar="TEXT", help="a query text (repeatable)")
    p.add_argument("--image", action="append", metavar="PATH", help="a query image (repeatable)")
    p.add_argument("--top", type=int, default=5, help="hits per query (default %(default)s)")
    p.add_argument("--split", default="test", choices=("train", "val", "test", "all"),
                   action=_SplitAction,
                   help="candidates: images or captions of this split, or all (default: test of the run's "
                        "dataset, all of --data)")
    p.add_argument("--data", metavar="DIR", default=None,
                   help="search this prepared dataset's images and captions instead of the run's (with "
                        "--features)")
    p.add_argument("--features", metavar="STORE.zarr[:KEY]", default=None,
                   help="the feature store of --data, extracted with the run's store's settings")
    add_checkpoint_argument(p)
    add_device_argument(p)
    add_json_argument(p, "also write the hits as JSON: per query, each hit's rank, score, imgid, image path, "
                      "and its caption (image queries) or the image's first captions (text queries)")
    add_overwrite_option(p, "replace an existing --json file")
    p.set_defaults(func=_command, split_given=False)
