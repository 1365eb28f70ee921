"""``--run RUN_DIR`` or ``--pipeline NAME``: how the commands that read a run name it (``train evaluate``,
``query``, ``export-embeddings``, ``export-model``, ``convert-checkpoints``, and ``train evaluate`` of a
classification run). A command module, so it may read ``pipelines.yaml``; :mod:`train.runs` reads the
run itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.schema import add_pipeline_arguments, get_pipeline
from train.runs import ACCEPT_CHANGED
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
