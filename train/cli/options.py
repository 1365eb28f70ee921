"""The options several commands share, each declared here once: ``--run RUN_DIR`` or ``--pipeline NAME``
(how the commands that read a run name it: ``train evaluate``, ``query``, ``export-embeddings``,
``export-model``, ``convert-checkpoints``, ``predict``), ``--checkpoint``, ``--json PATH``; ``--device`` is
:func:`vsecore.device.add_device_argument`,
``--pipeline``/``--pipelines`` are :func:`pipelines.schema.add_pipeline_arguments`'s."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines.schema import add_pipeline_arguments, get_pipeline
from train.run.config import ACCEPT_CHANGED
from vsecore.errors import UserError


def add_run_arguments(parser: Any) -> None:
    """``--run RUN_DIR`` or ``--pipeline NAME`` (its ``train.out``), for the commands that read a run."""
    parser.add_argument("--run", metavar="RUN_DIR", help="a run directory written by `train <family>` (or a "
                        "model folder written by `train export-model`, for evaluation and queries)")
    add_pipeline_arguments(parser)
    parser.add_argument(ACCEPT_CHANGED, dest="accept_changed", action="store_true",
                        help="use the run even when its prepared dataset or feature store changed since it "
                             "was trained (a warning instead of an error; the numbers may be meaningless)")


def run_from_arguments(args: Any, required: bool = True) -> Path | None:
    """The run directory that ``--run`` or ``--pipeline`` names (a :class:`UserError` for both/neither)."""
    if args.pipeline:
        if args.run:
            raise UserError("give --run or --pipeline, not both")
        pipe = get_pipeline(args.pipeline, args.pipelines)
        if pipe.train is None and pipe.classify is not None:  # a text classification pipeline
            return Path(pipe.classify.out)
        if pipe.train is None:
            raise UserError(f"pipeline '{args.pipeline}' has no train section, so no run")
        return Path(pipe.train.out)
    if args.run:
        return Path(args.run)
    if required:
        raise UserError("give --run RUN_DIR or --pipeline NAME")
    return None


def add_checkpoint_argument(parser: argparse._ActionsContainer,
                            help: str = "checkpoint (default best)") -> None:
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
