"""``train``: train a model family, evaluate embeddings, or run a whole pipeline.

Each subcommand lives in its own module, which exposes ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

from vsecore.errors import add_common_options, run_cli

#: modules that register subcommands, in --help order
COMMAND_MODULES = ("train.fit_cli", "train.classify_cli", "train.evaluate.cli", "train.query",
                   "train.summary", "train.compare", "train.export", "train.model_export",
                   "train.checkpoint_cli", "pipelines.runner")


def build_parser() -> argparse.ArgumentParser:
    """The ``train`` argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="train",
        description="Train visual-semantic embedding models from prepared datasets and feature stores, "
        "evaluate them with the papers' protocols, or run a named pipeline end to end.",
        epilog="Add --traceback to any command to see the full traceback of an error.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    add_common_options(parser)
    return parser


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``train``."""
    return run_cli(_main, argv, "train")
