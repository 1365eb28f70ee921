"""The ``features`` command: parse the command line and call the library.

``features <kind>`` (``cnn``: 10-crop global CNN features; ``fne``: the Full-Network Embedding;
``regions``: grid cells of a CNN's feature map or Faster R-CNN boxes; and any registered extractor's kind)
runs :func:`features.run.run_features`, its options generated from the settings
(:mod:`features.cli.extraction`); ``features export`` / ``import`` / ``verify`` / ``recompress`` are the
store's and its interop's (:mod:`features.cli.store_commands`). Settings merge as everywhere: explicit
options > ``--pipeline`` (its ``features:`` section, :func:`features.settings.features_section`) > the
settings' defaults (:func:`vsecore.pipelines_file.settings_from`). The console entry point is
:mod:`features.entry` (signal handlers before this module's imports).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from features.cli.extraction import add_extraction_parser, run_extraction
from features.cli.store_commands import (
    add_interop_parsers,
    add_store_parsers,
    run_export,
    run_import,
    run_recompress,
    run_verify,
)
from features.extractors.registry import kinds
from features.signals import exit_status, signal_handlers
from vsecore import console
from vsecore.errors import add_common_options, run_cli

PROG = "features"
#: the subcommands that are not a kind of extractor, and what runs them
STORE_COMMANDS = {"export": run_export, "import": run_import, "verify": run_verify,
                  "recompress": run_recompress}


def build_parser() -> argparse.ArgumentParser:
    """The ``features`` argument parser with its subcommands: one per registered kind, then the store's."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Images of a prepared dataset -> a resumable Zarr feature store, in this "
                               "process or on a Dask cluster.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for kind in kinds():
        add_extraction_parser(sub, kind)
    add_interop_parsers(sub)
    add_store_parsers(sub)
    add_common_options(parser)
    return parser


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return STORE_COMMANDS.get(args.command, run_extraction)(args)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (features.entry): one line, 130 or 143
        plain = "terminated" if exit_status(exc) == 143 else "interrupted"  # as run_cli says it
        console.warning(f"{PROG}: {exc.args[0] if exc.args else plain}")
        return exit_status(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``features`` / ``python -m features`` (through :mod:`features.entry`)."""
    with signal_handlers():
        return run_cli(_main, argv, PROG)
