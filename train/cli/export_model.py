"""``train export-model``: parses, then :func:`train.retrieval.model_folder.export_model` (imported, with
torch, when the command runs)."""

from __future__ import annotations

import argparse

from train.cli.options import add_checkpoint_argument, add_run_arguments, run_from_arguments
from vsecore import console
from vsecore.options import add_out_option, add_overwrite_option


# -- the command ---------------------------------------------------------------------------------------
def _command(args: argparse.Namespace) -> int:
    # start-up: the model folder's writer (torch, safetensors) only when the command runs
    from train.retrieval.model_folder import FEATURIZER, MODEL_JSON, WEIGHTS, export_model

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
    add_run_arguments(p, "a run directory written by `train <family>` (the run whose model is shared)")
    add_out_option(p, "the model folder to write", required=True)
    add_checkpoint_argument(p)
    add_overwrite_option(p, "replace a model folder already at --out")
    p.set_defaults(func=_command)
