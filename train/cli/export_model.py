"""``train export-model``: parses, then :func:`train.retrieval.model_folder.export_model`."""

from __future__ import annotations

import argparse

from train.cli.options import add_checkpoint_argument, add_run_arguments, run_from_arguments
from train.retrieval.model_folder import FEATURIZER, MODEL_JSON, WEIGHTS, export_model
from vsecore import console


# -- the command ---------------------------------------------------------------------------------------
def _command(args: argparse.Namespace) -> int:
    out = export_model(run_from_arguments(args), args.out, args.checkpoint, args.overwrite)
    console.result(f"wrote the model to {out}: {MODEL_JSON}, {WEIGHTS}"
                   + (f", {FEATURIZER}" if (out / FEATURIZER).is_file() else "")
                   + f" (open it with --run {out}: evaluation and queries)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train export-model``."""
    p = sub.add_parser(
        "export-model", help="write a run's model as a folder for sharing (safetensors + model.json)",
        description="Write the model of a run's checkpoint as a folder made for sharing: the weights as "
        "safetensors and a model.json with what rebuilds the model and featurizes texts and images "
        "(family, settings, vocabulary, feature spec, toolkit version, SHA-256 of the weights). It holds "
        "no pickle, so opening it runs no code. `train query`, `train evaluate` and `export-embeddings` "
        "accept the folder as --run (evaluation and queries only: no optimiser, no random states).")
    add_run_arguments(p)
    p.add_argument("--out", metavar="DIR", required=True, help="the model folder to write")
    add_checkpoint_argument(p)
    p.add_argument("--overwrite", action="store_true", help="replace a model folder already at --out")
    p.set_defaults(func=_command)
