"""Deprecated, kept for one release (CHANGELOG): the old home of opening a run. New code imports
:func:`train.retrieval.open.load_run` (a retrieval run or a model folder) or
:func:`train.classification.run.load_classification_run` (a ``train classify`` run)."""

from __future__ import annotations

import os

from train.classification.run import ClassificationRun, is_classification_run, load_classification_run
from train.retrieval.loaded import Embeddings, LoadedRun, embed_split, encode_texts
from train.retrieval.model_folder import is_model_folder
from train.retrieval.open import load_run as load_retrieval_run
from train.retrieval.open import run_inputs
from train.run.config import ACCEPT_CHANGED, read_config

__all__ = ["ACCEPT_CHANGED", "ClassificationRun", "Embeddings", "LoadedRun", "embed_split", "encode_texts",
           "is_model_folder", "load_run", "read_config", "run_inputs"]


def load_run(run_dir: str | os.PathLike, checkpoint: str = "best", device: str = "auto"
             ) -> LoadedRun | ClassificationRun:
    """The run of ``run_dir``, whichever task: a :class:`LoadedRun` (a retrieval run or a model folder) or
    a :class:`ClassificationRun`."""
    if is_classification_run(run_dir):
        return load_classification_run(run_dir, checkpoint, device)
    return load_retrieval_run(run_dir, checkpoint, device)
