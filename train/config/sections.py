"""The train stage's sections of a pipelines file: ``train`` (a family's settings), ``classify``, ``compare``
and ``evaluate``, each read through the small reader below the stages (:mod:`vsecore.pipelines_file`) and
validated with train's own settings; the train stage's commands (``train <family> --pipeline NAME``, the
commands that read a run) and the pipeline schema read them here.

Their inputs default to the upstream stages' outputs (the one place of that rule for the train stage):
``data`` to ``prep.out``; ``train.features`` to ``features.out`` with the key of its kind (``:global``,
``:fne``, ``:regions``: :func:`features.settings.store_key`); ``compare.features`` and ``compare.regions``
to the ``features`` and ``regions`` stages' stores, by their kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from features.settings import features_section, store_key
from prep.settings import prep_section
from train.engine.settings import ClassifySection, CompareSection, EvaluateSection, TrainSection
from train.models.classifier import classify_settings
from train.models.family import train_settings
from vsecore.errors import UserError
from vsecore.pipelines_file import PipelineEntry


def _prepared(entry: PipelineEntry) -> Callable[[], str | None]:
    """The ``prep`` stage's output, when asked for."""
    def out() -> str | None:
        prep = prep_section(entry)
        return prep.out if prep is not None else None

    return out


def _stores(entry: PipelineEntry) -> dict[str, str]:
    """``{"features": STORE:KEY, "regions": STORE:regions}`` of the pipeline's feature stages (``features``,
    then ``regions``), each by the key of its kind."""
    stores: dict[str, str] = {}
    for stage in ("features", "regions"):
        section = features_section(entry, stage)
        if section is None:
            continue
        key = store_key(section.kind)
        stores.setdefault("regions" if key == "regions" else "features", f"{section.out}:{key}")
    return stores


def train_section(entry: PipelineEntry) -> TrainSection | None:
    """The ``train`` section: the settings of its family; ``data`` is ``prep.out`` and ``features`` the
    ``features`` stage's store with its kind's key, unless given."""
    def store() -> str | None:
        section = features_section(entry)
        return f"{section.out}:{store_key(section.kind)}" if section is not None else None

    return entry.section("train", train_settings, TrainSection.path_fields,
                         {"data": _prepared(entry), "features": store})


def classify_section(entry: PipelineEntry) -> ClassifySection | None:
    """The ``classify`` section: classification's settings + its encoder family's; ``data`` is ``prep.out``
    unless given."""
    return entry.section("classify", classify_settings, ClassifySection.path_fields,
                         {"data": _prepared(entry)})


def compare_section(entry: PipelineEntry) -> CompareSection | None:
    """The ``compare`` section; ``data``, ``features`` and ``regions`` from the upstream stages unless
    given."""
    def stored(kind: str) -> Callable[[], str | None]:
        return lambda: _stores(entry).get(kind)

    return entry.section("compare", CompareSection, CompareSection.path_fields,
                         {"data": _prepared(entry), "features": stored("features"),
                          "regions": stored("regions")})


def evaluate_section(entry: PipelineEntry) -> EvaluateSection | None:
    """The ``evaluate`` section (the final evaluation of the pipeline's run)."""
    return entry.section("evaluate", EvaluateSection, ())


def run_folder(entry: PipelineEntry) -> str:
    """The run a pipeline trains: ``train.out``, or ``classify.out`` for text classification (a
    :class:`UserError` when it has neither)."""
    section = train_section(entry) or classify_section(entry)
    if section is None:
        raise UserError(f"pipeline '{entry.name}' has no train section, so no run")
    return section.out


def train_values(entry: PipelineEntry) -> dict[str, Any]:
    """The keys the ``train`` section sets, validated (what ``train compare`` trains a pipeline entry with;
    a :class:`UserError` when there is no section)."""
    settings = entry.section("train", train_settings, ())
    if settings is None:
        raise UserError(f"pipeline '{entry.name}' has no train section")
    return settings.model_dump(include=settings.model_fields_set)
