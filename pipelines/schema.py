"""The schema of ``pipelines.yaml``: every pipeline of a file, each section validated by its stage.

A pipeline has a description, optionally a paper, and a section per stage: ``prep``, ``features`` (and
``regions``, a second feature stage of kind ``regions``), ``train`` (or ``classify``, or ``compare``) and
``evaluate``. Each section is read by its stage's own reader (:func:`prep.settings.prep_section`,
:func:`features.settings.features_section`, :mod:`train.config.sections`) through the small reader below
the stages (:mod:`vsecore.pipelines_file`: the file, ``${VAR}``, paths, one-line errors naming the file, the
pipeline and the key), so a stage command given ``--pipeline NAME`` reads its section exactly as the runner
does; downstream inputs default to upstream outputs there. This module adds what belongs to no stage: the
keys of a pipeline, which sections may go together, and the whole file at once (``train pipeline``,
``--list``).

The ``train`` section is the settings of its family (:class:`train.engine.settings.TrainSection` + the
family's own, :mod:`train.models.family`): the keys a file may use are the union of the registered
families' settings, and a key of another family is an error that names its family.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from features.settings import FeaturesSection, features_section
from prep.settings import PrepSection, prep_section
from train.config.sections import classify_section, compare_section, evaluate_section, train_section
from train.engine.settings import ClassifySection, CompareSection, EvaluateSection, TrainSection
from vsecore.errors import UserError
from vsecore.pipelines_file import Origin, PipelineEntry, PipelinesFile

#: each stage's section and its reader, in the order a pipeline runs them (the first error is reported)
SECTIONS: dict[str, Callable[[PipelineEntry], Any]] = {
    "prep": prep_section,
    "features": features_section,
    "train": train_section,
    "classify": classify_section,
    "regions": lambda entry: features_section(entry, "regions"),
    "compare": compare_section,
    "evaluate": evaluate_section,
}
#: a pipeline's keys that are no section
HEAD = ("description", "paper")


@dataclass
class Pipeline:
    """One named experiment: its description and the validated settings of each of its stages."""

    name: str
    description: str
    prep: PrepSection
    paper: str | None = None
    features: FeaturesSection | None = None
    train: TrainSection | None = None
    #: text classification (``train classify``), beside retrieval: a pipeline has train or classify
    classify: ClassifySection | None = None
    #: a second feature stage, the region store of a comparison's region families (``kind: regions``)
    regions: FeaturesSection | None = None
    #: ``train compare``: several families on this pipeline's dataset and stores
    compare: CompareSection | None = None
    evaluate: EvaluateSection | None = None
    #: the pipelines file this pipeline was read from (a comparison's pipeline entries come from it too)
    source: Path | None = None
    #: where its paths written with environment variables came from (a missing one names its variable)
    origins: dict[str, Origin] = field(default_factory=dict)


def _head(entry: PipelineEntry) -> dict[str, Any]:
    """The pipeline's keys that are no section, checked: ``description`` (a string, required), ``paper``."""
    where = f"{entry.file}: pipeline '{entry.name}'"
    unknown = [key for key in entry.body if key not in HEAD and key not in SECTIONS]
    if unknown:
        raise UserError(f"{where}: {unknown[0]}: unknown key")
    for key in ("description", "prep"):
        if key not in entry.body:
            raise UserError(f"{where}: {key}: missing required key")
    head = {key: entry.body.get(key) for key in HEAD}
    for key, value in head.items():
        if not isinstance(value, str) and not (key == "paper" and value is None):
            raise UserError(f"{where}: {key}: expected a string (got {value!r:.60})")
    return head


def read_pipeline(entry: PipelineEntry) -> Pipeline:
    """Pipeline ``entry``, every section validated by its stage's reader, then the rules of which sections go
    together (a :class:`UserError` naming the file and the pipeline)."""
    head = _head(entry)
    sections = {stage: read(entry) for stage, read in SECTIONS.items()}
    pipe = Pipeline(entry.name, **head, **sections, source=entry.file, origins=entry.origins)
    rule = _broken_rule(pipe)
    if rule:
        raise UserError(f"{entry.file}: pipeline '{entry.name}': {rule}")
    return pipe


def _broken_rule(pipe: Pipeline) -> str | None:
    """The first rule of a pipeline's sections that ``pipe`` breaks, or None."""
    if pipe.regions is not None and pipe.regions.kind != "regions":
        return "'regions' is a feature stage of kind 'regions'"
    if pipe.compare is not None and (pipe.train is not None or pipe.classify is not None):
        return "a pipeline has a 'train', a 'classify' or a 'compare' section, not two"
    if pipe.classify is not None and pipe.train is not None:
        return "a pipeline has a 'train' (retrieval) or a 'classify' section, not both"
    if pipe.evaluate is not None and pipe.train is None and pipe.classify is None:
        return "'evaluate' needs a 'train' section"
    return None


def load_pipelines(file: str | os.PathLike | None = None, expand: str | None = None) -> dict[str, Pipeline]:
    """Read and validate every pipeline of ``file`` (default: :func:`vsecore.pipelines_file.
    default_pipelines_file`).

    Every pipeline is checked against the schema; environment variables must be set only for the
    pipeline named by ``expand`` (the one about to run): elsewhere ``${VAR}`` is left as written.
    """
    return _read_all(PipelinesFile.read(file), expand)


def _read_all(pipelines: PipelinesFile, expand: str | None) -> dict[str, Pipeline]:
    return {name: read_pipeline(pipelines.entry(name, strict=name == expand)) for name in pipelines.names()}


def get_pipeline(name: str, file: str | os.PathLike | None = None) -> Pipeline:
    """The pipeline ``name``, with the whole file validated; a :class:`UserError` listing the known names if
    it is absent."""
    pipelines = PipelinesFile.read(file)
    pipelines.entry(name)  # an unknown name is the first error, whatever the file holds
    return _read_all(pipelines, expand=name)[name]
