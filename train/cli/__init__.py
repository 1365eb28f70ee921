"""``train``: train a model family, evaluate embeddings, or run a whole pipeline.

Each subcommand lives in its own module of this package, which exposes ``register(subparsers)``, parses,
and calls a library function of the task packages. The options are declared without torch (the families'
declarations, the settings); a command imports its library, and torch, when it runs, so ``train --help``
and an argument error answer at once. A package above train adds its own subcommands through the entry
points of :data:`COMMAND_PLUGINS` (``pyproject.toml``): ``train pipeline`` is the orchestrator's
(:func:`pipelines.cli.register`), so train never imports the orchestrator.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

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
#: the entry-point group of the registrars of packages above train (``train pipeline``: ``pipelines.cli``)
COMMAND_PLUGINS = "vse_toolkit.train_commands"


def plugin_commands() -> list[Registrar]:
    """The registrars installed under :data:`COMMAND_PLUGINS`, in name order (each loaded: its module
    imported)."""
    return [ep.load() for ep in sorted(entry_points(group=COMMAND_PLUGINS), key=lambda ep: ep.name)]


def build_parser(more: Sequence[Registrar] | None = None) -> argparse.ArgumentParser:
    """The ``train`` argument parser with every subcommand of this package, then those ``more`` registers
    (default: :func:`plugin_commands`, the orchestrator's ``train pipeline``)."""
    parser = argparse.ArgumentParser(
        prog="train",
        description="Train visual-semantic embedding models from prepared datasets and feature stores, "
        "evaluate them with the papers' protocols, or run a named pipeline end to end.",
        epilog="Add --traceback to any command to see the full traceback of an error.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    for register in plugin_commands() if more is None else more:
        register(sub)
    add_common_options(parser)
    return parser


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv`` with ``parser`` and run the command it names."""
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``train`` (and ``python -m train``): every command, the plugins' too."""
    return run_cli(lambda args: run(build_parser(), args), argv, "train")
