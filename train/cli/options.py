"""The options several ``train`` commands share, each declared here once: ``--run RUN_DIR`` or ``--pipeline
NAME`` (how the commands that read a run name it: ``train evaluate``, ``query``, ``export-embeddings``,
``export-model``, ``convert-checkpoints``, ``predict``; each says which runs it reads), ``--checkpoint``,
``--json PATH``; ``--device`` is :func:`vsecore.device.add_device_argument`, ``--out``, ``--overwrite`` and
``--pipeline``/``--pipelines`` are :mod:`vsecore.options`'. Nothing here imports torch: ``train --help``
builds every command's options."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from train.config.run import ACCEPT_CHANGED
from train.config.sections import run_folder
from vsecore.errors import UserError
from vsecore.options import add_pipeline_arguments
from vsecore.pipelines_file import PipelinesFile

#: what ``--run`` of a command that reads a retrieval run or a model folder accepts
RETRIEVAL_RUN = ("a run directory written by `train <family>`, or a model folder written by `train "
                 "export-model`")


def add_run_arguments(parser: Any, runs: str) -> None:
    """``--run RUN_DIR`` (``runs``: which runs the command reads) or ``--pipeline NAME`` (its ``train.out``,
    or ``classify.out``), for the commands that read a run."""
    parser.add_argument("--run", metavar="RUN_DIR", help=runs)
    add_pipeline_arguments(parser)
    parser.add_argument(ACCEPT_CHANGED, dest="accept_changed", action="store_true",
                        help="use the run even when its prepared dataset or feature store changed since it "
                             "was trained (a warning instead of an error; the numbers may be meaningless)")


def run_from_arguments(args: Any, required: bool = True) -> Path | None:
    """The run directory that ``--run`` or ``--pipeline`` names (a :class:`UserError` for both/neither)."""
    if args.pipeline:
        if args.run:
            raise UserError("give --run or --pipeline, not both")
        return Path(run_folder(PipelinesFile.read(args.pipelines).entry(args.pipeline)))
    if args.run:
        return Path(args.run)
    if required:
        raise UserError("give --run RUN_DIR or --pipeline NAME")
    return None


def add_checkpoint_argument(parser: argparse._ActionsContainer,
                            help: str = "checkpoint (default %(default)s)") -> None:
    """``--checkpoint best|last`` (default ``best``)."""
    parser.add_argument("--checkpoint", default="best", choices=("best", "last"), help=help)


def add_json_argument(parser: argparse._ActionsContainer, help: str) -> None:
    """``--json PATH``: also write the command's result as JSON there."""
    parser.add_argument("--json", metavar="PATH", default=None, help=help)


def take_resumed_settings(args: argparse.Namespace, stored: Mapping[str, Any]) -> None:
    """``--resume``: the options not given again (``None``) are those the run was started with (its
    ``config.json`` settings ``stored``); where it writes (``out``) and its family stay as given."""
    for key, value in stored.items():
        if key not in ("out", "family") and hasattr(args, key) and getattr(args, key) is None:
            setattr(args, key, value)
