"""Opening what a retrieval command reads: a run directory of ``train <family>`` or a model folder of
``train export-model`` (:func:`load_run`), and what either reads (:func:`run_inputs`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from train.config.run import read_config, store_path
from train.retrieval.loaded import LoadedRun, load_run_directory
from train.retrieval.model_folder import is_model_folder, load_model_folder, read_model_json
from vsecore.errors import UserError


def load_run(run_dir: str | os.PathLike, checkpoint: str = "best", device: str = "auto") -> LoadedRun:
    """Rebuild the model of a run directory (``checkpoints/<checkpoint>.pt``, ``best`` or ``last``) or of a
    model folder (``train export-model``).

    The run's dataset and features are checked against the fingerprints of its ``config.json`` when
    first read: a change is a :class:`UserError` naming it, or a warning once ``accept_changed`` is set
    on the returned run. A ``train classify`` run is opened by
    :func:`train.classification.run.load_classification_run` (here a :class:`UserError`).
    """
    run_dir = Path(run_dir)
    if is_model_folder(run_dir):  # a model made for sharing (train export-model)
        return load_model_folder(run_dir, checkpoint, device)
    if read_config(run_dir).get("task") == "classify":
        raise UserError(f"{run_dir} is a text classification run (train classify): open it with "
                        "train.classification.run.load_classification_run")
    return load_run_directory(run_dir, checkpoint, device)


def run_inputs(run_dir: str | os.PathLike, config: dict[str, Any] | None = None) -> list[str]:
    """What a reader of the run reads, which its outputs may not replace: the run's prepared dataset
    and feature store (its ``config.json`` and checkpoints:
    :meth:`train.run.layout.RunDir.check_eval_output`).
    ``run_dir`` may be a model folder of ``train export-model`` (its ``model.json`` names them)."""
    if config is None and is_model_folder(run_dir):
        config = read_model_json(Path(run_dir))
    if config is None:
        try:
            config = read_config(run_dir)
        except UserError:  # not a run: loading it says so
            return []
    settings = config.get("settings", {})
    features = settings.get("features")
    store = store_path(features) if isinstance(features, str) else None
    return [v for v in (settings.get("data"), store) if v]
