"""The stages as Python functions: :func:`prep`, :func:`extract` and :func:`train` build the settings their
commands build (``prep <dataset>``, ``features <kind>``, ``train <family>``) and call the library function
those commands call (:func:`prep.run.run_prep`, :func:`features.run.run_features`,
:func:`train.retrieval.fit.run_training`). Each stage's library is imported when the function runs (start-up:
``import vse`` loads neither torch nor a network)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vse._common import given, stage_settings, verbosity
from vsecore.pipelines_file import explain_origins

PathArg = str | os.PathLike


def prep(dataset: str, out: PathArg | None = None, *, overwrite: bool = False, pipeline: str | None = None,
         pipelines: PathArg | None = None, quiet: bool | None = None, **settings: Any) -> Path:
    """Prepare ``dataset`` (``coco``, ``f8k``, ``f30k``, ``multi30k``, ``yjcaptions``, ``karpathy``,
    ``synthetic``, ``textcls``) into the folder ``out``, as ``prep DATASET --out OUT`` does.

    Args:
        dataset: the source's kind (the subcommand of ``prep``).
        out: the prepared dataset's folder (new or empty; with ``overwrite`` a prepared dataset).
        overwrite: replace a prepared dataset at ``out`` (``--overwrite``).
        pipeline: take the settings not given here from this pipeline's ``prep:`` section (``--pipeline``),
            of the file ``pipelines`` (default: as the commands find it).
        quiet: results and warnings only (``-q``); ``None`` keeps the current verbosity.
        **settings: the fields of :class:`prep.settings.PrepSection` (``num_images=48``, ``karpathy=...``),
            validated as the command validates its options (a :class:`vsecore.errors.UserError` naming the
            option).

    Returns:
        The prepared dataset's folder (``dataset.json``, ``chars.json``, ``words.json``, ``prep.json``).
    """
    from prep.run import run_prep  # start-up: the stage's library only when it runs
    from prep.settings import PrepSection, absolute_paths, prep_section  # start-up: (as above)

    # relative paths mean the working directory, as a shell's do (what the command records)
    with verbosity(quiet):
        values, found = stage_settings(PrepSection, "prep", absolute_paths(given(settings, out=out)),
                                       {"dataset": dataset}, prep_section,
                                       pipeline, _path(pipelines))
        with explain_origins(found):
            return run_prep(values, overwrite=overwrite)


def extract(kind: str, data: PathArg | None = None, out: PathArg | None = None, *, overwrite: bool = False,
            progress: bool = True, retry_failed: bool = False, rethreshold: bool = False,
            pipeline: str | None = None, pipelines: PathArg | None = None, quiet: bool | None = None,
            **settings: Any) -> Path:
    """Extract the features of kind ``kind`` (``cnn``, ``fne``, ``regions``, or a registered extractor's) of
    the prepared dataset ``data`` into the Zarr store ``out``, as ``features KIND --data DATA --out OUT``.

    Rows follow the dataset's image order: ``global`` (N, C) float32 for ``cnn``; the FNE (N, F) int8 and
    its raw (N, F) float32 for ``fne``; ``regions`` (N, k, D), ``boxes`` (N, k, 4), ``counts`` (N,) for
    ``regions``. A killed extraction resumes with the same call.

    Args:
        kind: the kind of extractor (the subcommand of ``features``).
        data: the prepared dataset folder (written by :func:`prep`).
        out: the feature store to write (a store made with the same settings is resumed).
        overwrite: delete a store at ``out`` and start over; ``retry_failed``: recompute every recorded
            failure; ``rethreshold``: (fne) rewrite only the ternary array.
        progress: show the progress bar (``False``: ``--no-progress``).
        pipeline, pipelines, quiet: as for :func:`prep` (the pipeline's ``features:`` section).
        **settings: the stage's fields (:class:`features.settings.FeaturesSection`: ``batch_size``,
            ``device``, ...) and those of the kind's extractors (``cnn="efficientnet_lite0"``, ``crops=1``).

    Returns:
        The store's path (open it with :class:`features.store.core.FeatureStore`).
    """
    from features.extractors.registry import extractors_of_kind  # start-up: (as above)
    from features.run import run_features  # start-up: (as above)
    from features.settings import (  # start-up: (as above)
        FeaturesSection,
        features_section,
        features_settings_class,
        implied_settings,
    )

    values = given(settings, data=data, out=out)
    own = (name for extractor in extractors_of_kind(kind) for name in extractor.config.model_fields)
    allowed = {*FeaturesSection.model_fields, *own}  # what `features KIND` offers, and the pipeline keys
    with verbosity(quiet):
        resolved, found = stage_settings(features_settings_class(), "features", values, {"kind": kind},
                                         features_section, pipeline, _path(pipelines), allowed)
        resolved = implied_settings(resolved, set(values))
        with explain_origins(found):
            return run_features(resolved, overwrite=overwrite, rethreshold=rethreshold, progress=progress,
                                retry_failed=retry_failed)


def train(family: str, data: PathArg | None = None, features: str | os.PathLike | None = None,
          out: PathArg | None = None, *, resume: bool = False, overwrite: bool = False,
          on_epoch: Callable[[dict[str, Any]], None] | None = None, pipeline: str | None = None,
          pipelines: PathArg | None = None, quiet: bool | None = None, **settings: Any) -> Path:
    """Train a model of ``family`` (``chain``, ``oecc``, ``seam``, ``vse``, ``clmr``, ``liwe``, or a
    registered family) on the prepared dataset ``data`` and the features ``features`` into the run directory
    ``out``, as ``train FAMILY --data DATA --features FEATURES --out OUT``; then evaluate its best checkpoint
    on the test split (``eval/test.json``, the table printed).

    Args:
        family: the model family (the subcommand of ``train``).
        data: the prepared dataset folder.
        features: ``STORE.zarr[:KEY]``, the feature store and its array (``global``, ``fne``, ``regions``).
        out: the run directory (``config.json``, ``checkpoints/best.pt`` and ``last.pt``, ``metrics.jsonl``).
        resume: continue the run at ``out`` from its newest checkpoint; give the settings it was started
            with (a setting that differs is a :class:`vsecore.errors.UserError` naming it).
        overwrite: start over in an ``out`` that holds a run.
        on_epoch: called after each epoch with the epoch's ``metrics.jsonl`` record (a dict: ``epoch``,
            ``loss``, ``lr``, ``rsum``, ``best_rsum``, ``improved``, ``val``, timings), once its checkpoints
            and metrics are written (:class:`train.engine.trainer.Trainer`'s epoch hook).
        pipeline, pipelines, quiet: as for :func:`prep` (the pipeline's ``train:`` section).
        **settings: the fields of the family's settings (:func:`train.models.family.settings_class`:
            ``epochs=2``, ``d=512``, ``batch_size=128``, ``device="cpu"``, the family's own such as ``p``).

    Returns:
        The run directory (read it back with :func:`vse.load_run`).
    """
    from train.config.sections import train_section  # start-up: (as above)
    from train.models.family import settings_class  # start-up: (as above)
    from train.retrieval.fit import run_training  # start-up: (as above)

    values = given(settings, data=data, features=features, out=out)
    with verbosity(quiet):
        resolved, found = stage_settings(settings_class(family), "train", values, {"family": family},
                                         train_section, pipeline, _path(pipelines))
        with explain_origins(found):
            return run_training(resolved, resume=resume, overwrite=overwrite, on_epoch=on_epoch)


def _path(value: PathArg | None) -> str | None:
    return None if value is None else os.fspath(value)
