"""``train``: train a model family, evaluate embeddings, or run a whole pipeline.

Each subcommand lives in its own module of this package, which exposes ``register(subparsers)``, parses,
and calls a library function of the task packages (or of :mod:`pipelines.runner`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from train.cli import (
    checkpoint,
    classify,
    compare,
    evaluate,
    export_embeddings,
    export_model,
    fit,
    pipeline,
    query,
    report,
)
from vsecore.errors import add_common_options, run_cli

#: the modules that register subcommands, in --help order
COMMANDS = (fit, classify, evaluate, query, report, compare, export_embeddings, export_model, checkpoint,
            pipeline)


def build_parser() -> argparse.ArgumentParser:
    """The ``train`` argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="train",
        description="Train visual-semantic embedding models from prepared datasets and feature stores, "
        "evaluate them with the papers' protocols, or run a named pipeline end to end.",
        epilog="Add --traceback to any command to see the full traceback of an error.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    add_common_options(parser)
    return parser


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``train``."""
    return run_cli(_main, argv, "train")
