"""``train``: train a model family, evaluate embeddings, or run a whole pipeline.

Each subcommand lives in its own module of this package, which exposes ``register(subparsers)``, parses,
and calls a library function of the task packages. The options are declared without torch (the families'
declarations, the settings); a command imports its library, and torch, when it runs, so ``train --help``
and an argument error answer at once. ``train pipeline`` is the orchestrator's (:mod:`pipelines.cli`, above
every stage): the ``train`` console command is :func:`pipelines.cli.main`, this parser with it added.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from train.cli import (
    checkpoint,
    classify_options,
    compare,
    evaluate,
    export_embeddings,
    export_model,
    fit,
    query,
    report,
)
from vsecore.errors import add_common_options, run_cli

#: the modules that register subcommands, in --help order
COMMANDS = (fit, classify_options, evaluate, query, report, compare, export_embeddings, export_model,
            checkpoint)


#: a function that adds subcommands to the ``train`` parser
Registrar = Callable[[argparse._SubParsersAction], None]


def build_parser(more: Sequence[Registrar] = ()) -> argparse.ArgumentParser:
    """The ``train`` argument parser with every registered subcommand, then those ``more`` registers (the
    orchestrator's ``train pipeline``)."""
    parser = argparse.ArgumentParser(
        prog="train",
        description="Train visual-semantic embedding models from prepared datasets and feature stores, "
        "evaluate them with the papers' protocols, or run a named pipeline end to end.",
        epilog="Add --traceback to any command to see the full traceback of an error.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    for register in more:
        register(sub)
    add_common_options(parser)
    return parser


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv`` with ``parser`` and run the command it names."""
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """``train`` without ``train pipeline`` (the console command, :func:`pipelines.cli.main`, adds it)."""
    return run_cli(lambda args: run(build_parser(), args), argv, "train")
