"""The schema of ``pipelines.yaml``: one validated entry per experiment, and the stage commands' defaults.

A pipeline has a section per stage: ``prep``, ``features``, ``train`` (or ``classify``) and
``evaluate``. Each section is a schema (pydantic, ``extra="forbid"``): an unknown key, a
wrong type or a missing required field is a :class:`~vsecore.errors.UserError` that names the file,
the pipeline and the key. The ``train`` section is the settings of its family: the common fields
(:class:`train.engine.settings.TrainSection`) + the family's own (its ``Family.config``,
:mod:`train.models.family`), so the keys a file may use are the union of the registered families'
settings, and a key of another family is an error that names its family. The families (and torch)
are imported only when a file is read, so ``prep`` and ``features`` start without them.

The schemas are also the single source of the stage commands' defaults. A stage command parses
its options with ``default=None`` and calls :func:`stage_settings`; the result is, key by key,
the explicit command-line value, else the pipeline's value (``--pipeline NAME``), else the
schema's default.

Paths in the YAML file are relative to the file's folder; ``${VAR}`` and ``${VAR:-default}``
are expanded from the environment as the shell does (e.g. ``${COCO_ROOT}``; the default also
replaces an empty variable, and an empty ``${VAR}`` without a default is an error).
Downstream inputs default to upstream outputs: ``features.data`` and ``train.engine.data`` to
``prep.out``, ``train.features`` to ``features.out`` with the key of the feature kind
(``:global`` or ``:fne``).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from features.extractors.registry import extractors_of_kind
from features.settings import FeaturesSection, features_settings, features_settings_class
from prep.settings import PrepSection
from train.engine.settings import ClassifySection, CompareSection, EvaluateSection, TrainSection
from vsecore.errors import UserError
from vsecore.io import read_text

# the --pipeline / --pipelines options are declared with the other shared options (light: `features --help`
# reads them without this module's stage settings); the stage commands take them from here too
from vsecore.options import add_pipeline_arguments, add_pipelines_file_argument  # noqa: F401
from vsecore.schema import Section


def _store_key(section: FeaturesSection) -> str:
    """The key a stage's store is read by: its kind's first (``global``, ``fne``, ``regions``)."""
    return extractors_of_kind(section.kind)[0].keys[0]


class Pipeline(BaseModel):
    """One named experiment: its description and the settings of each stage."""

    model_config = ConfigDict(extra="forbid")
    description: str
    paper: str | None = None
    prep: PrepSection
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
    _source: Path | None = PrivateAttr(default=None)

    @property
    def source(self) -> Path | None:
        """The pipelines file this pipeline was read from (None when built in code)."""
        return self._source

    @field_validator("features", "regions", mode="before")
    @classmethod
    def _features_settings(cls, value: Any) -> Any:
        """A ``features:`` (or ``regions:``) mapping is the stage's settings + the registered extractors'."""
        return features_settings(**value) if isinstance(value, dict) else value

    @field_validator("train", mode="before")
    @classmethod
    def _family_settings(cls, value: Any) -> Any:
        """A ``train:`` mapping is the settings of its family (``TrainSection`` + the family's own
        fields): any key of the union of the families' settings is known, and belongs to its family."""
        if not isinstance(value, dict):
            return value
        from train.models.family import train_settings  # the families (and torch) only once a file is read

        return train_settings(**value)

    @field_validator("classify", mode="before")
    @classmethod
    def _classify_settings(cls, value: Any) -> Any:
        """A ``classify:`` mapping is classification's settings + its encoder family's options."""
        if not isinstance(value, dict):
            return value
        from train.models.classifier import classify_settings  # start-up: families only once a file is read

        return classify_settings(**value)

    @model_validator(mode="after")
    def _chain_outputs(self) -> Pipeline:
        for stage in (self.features, self.regions):
            if stage is not None and stage.data is None:
                stage.data = self.prep.out
        if self.regions is not None and self.regions.kind != "regions":
            raise ValueError("'regions' is a feature stage of kind 'regions'")
        if self.train is not None:
            if self.train.data is None:
                self.train.data = self.prep.out
            if self.train.features is None and self.features is not None:
                self.train.features = f"{self.features.out}:{_store_key(self.features)}"
        if self.compare is not None:
            self._chain_compare(self.compare)
        if self.classify is not None:
            if self.train is not None:
                raise ValueError("a pipeline has a 'train' (retrieval) or a 'classify' section, not both")
            if self.classify.data is None:
                self.classify.data = self.prep.out
        if self.evaluate is not None and self.train is None and self.classify is None:
            raise ValueError("'evaluate' needs a 'train' section")
        return self

    def _chain_compare(self, compare: CompareSection) -> None:
        if self.train is not None or self.classify is not None:
            raise ValueError("a pipeline has a 'train', a 'classify' or a 'compare' section, not two")
        if compare.data is None:
            compare.data = self.prep.out
        for stage in (self.features, self.regions):
            if stage is None:
                continue
            key = _store_key(stage)
            if key == "regions" and compare.regions is None:
                compare.regions = f"{stage.out}:regions"
            elif key != "regions" and compare.features is None:
                compare.features = f"{stage.out}:{_store_key(stage)}"


SECTIONS: dict[str, type[Section]] = {
    "prep": PrepSection,
    "features": FeaturesSection,
    "train": TrainSection,
    "classify": ClassifySection,
    "regions": FeaturesSection,
    "compare": CompareSection,
    "evaluate": EvaluateSection,
}

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def packaged_pipelines_file() -> Path:
    """The project's ``pipelines.yaml`` as installed: ``train/pipelines.yaml`` (a link to the
    project's file in a checkout, a copy in a wheel)."""
    return Path(__file__).resolve().parents[1] / "train" / "pipelines.yaml"


def default_pipelines_file() -> Path:
    """``$VSE_PIPELINES``, else ``./pipelines.yaml``, else the installed project's ``pipelines.yaml``."""
    env = os.environ.get("VSE_PIPELINES")
    if env:
        return Path(env)
    local = Path("pipelines.yaml")
    if local.is_file():
        return local
    return packaged_pipelines_file()


def _paths_base(path: Path) -> Path:
    """Where a pipelines file's relative paths start: its own folder, except for the installed copy
    (inside site-packages), whose outputs go under the current directory."""
    if path.absolute() == packaged_pipelines_file():
        return Path.cwd()
    return path.resolve().parent


def _expand(value: str, where: str, strict: bool) -> str:
    """``${VAR}`` and ``${VAR:-default}`` of ``value`` expanded as the shell does.

    ``${VAR:-default}`` gives ``default`` when VAR is unset or empty. ``${VAR}`` with VAR unset or
    empty is a :class:`UserError` naming it (``where`` names the file, pipeline and key) when
    ``strict`` (the pipeline about to run); otherwise it is left as written.
    """
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        value = os.environ.get(name, "")
        if value:
            return value
        if default is not None:
            return default
        if not strict:  # only the pipeline being run needs its variables
            return m.group(0)
        state = "is empty" if name in os.environ else "is not set"
        raise UserError(f"{where}: environment variable ${{{name}}} {state}")

    return _VAR.sub(sub, value)


def _resolve_paths(section: dict[str, Any], model: type[Section], base: Path, where: str,
                   strict: bool) -> None:
    for key in model.path_fields:
        value = section.get(key)
        if isinstance(value, str):
            section[key] = _resolve_one(value, base, f"{where}.{key}", strict)
        elif isinstance(value, list):
            section[key] = [_resolve_one(v, base, f"{where}.{key}", strict) if isinstance(v, str) else v
                            for v in value]


def _resolve_one(value: str, base: Path, where: str, strict: bool) -> str:
    value = _expand(value, where, strict)
    if not strict and _VAR.search(value):
        return value
    if value in ("imagenet", "none") or value.startswith(("tcp://", "tls://")):
        return value
    store, sep, key = value.partition(":") if ":" in value and not re.match(r"^[A-Za-z]:\\", value) else (
        value, "", "")
    p = Path(store).expanduser()
    if not p.is_absolute():
        p = base / p
    return f"{os.path.normpath(p)}{sep}{key}"


def _format_error(exc: ValidationError, file: Path, name: str) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        what = "unknown key"
    elif kind == "missing":
        what = "missing required key"
    else:
        what = err["msg"]
        if "input" in err and not isinstance(err["input"], dict | list):
            what += f" (got {err['input']!r})"
    more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{file}: pipeline '{name}': {loc}: {what}{more}"


#: the largest pipelines file read (the project's own is 22 KB)
MAX_PIPELINES_BYTES = 16 << 20


def load_pipelines(file: str | os.PathLike | None = None, expand: str | None = None) -> dict[str, Pipeline]:
    """Read and validate every pipeline of ``file`` (see :func:`default_pipelines_file`).

    Every pipeline is checked against the schema; environment variables must be set only for the
    pipeline named by ``expand`` (the one about to run): elsewhere ``${VAR}`` is left as written.
    """
    path = Path(file) if file is not None else default_pipelines_file()
    text = read_text(path, "a pipelines YAML file", missing=f"{path}: no such pipelines file",
                     most=MAX_PIPELINES_BYTES)
    try:
        raw = yaml.safe_load(text)
    except RecursionError:
        raise UserError(f"{path}: YAML nested too deeply to read; not a pipelines file") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts (4,300)
        raise UserError(f"{path}: a value cannot be read: {' '.join(str(exc).split())[:120]}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise UserError(f"{path}: {where}invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("pipelines"), dict):
        raise UserError(f"{path}: expected a mapping with a 'pipelines' mapping at the top level")
    unknown = set(raw) - {"pipelines"}
    if unknown:
        raise UserError(f"{path}: unknown top-level key '{sorted(unknown)[0]}'")
    base = _paths_base(path)
    out: dict[str, Pipeline] = {}
    for name, body in raw["pipelines"].items():
        if not isinstance(body, dict):
            raise UserError(f"{path}: pipeline '{name}': expected a mapping, got {type(body).__name__}")
        body = dict(body)
        for sec in SECTIONS:
            if isinstance(body.get(sec), dict):
                body[sec] = dict(body[sec])
                _resolve_paths(body[sec], _section_class(sec), base, f"{path}: pipeline '{name}': {sec}",
                               strict=(name == expand))
        try:
            out[str(name)] = Pipeline.model_validate(body)
            out[str(name)]._source = path
        except ValidationError as exc:
            raise UserError(_format_error(exc, path, str(name))) from None
    return out


def get_pipeline(name: str, file: str | os.PathLike | None = None) -> Pipeline:
    """The pipeline ``name``; a :class:`UserError` listing the known names if it is absent."""
    pipelines = load_pipelines(file, expand=name)
    if name not in pipelines:
        raise UserError(f"unknown pipeline '{name}' (known: {', '.join(sorted(pipelines))})")
    return pipelines[name]


def stage_settings(stage: str, args: argparse.Namespace, **fixed: Any) -> Section:
    """Merge explicit options over the pipeline's section over the schema defaults.

    ``args`` is the parsed command line (options default to ``None`` when not given); its
    attribute names equal the section's keys. ``fixed`` pins keys given by the subcommand
    (``dataset=...``, ``kind=...``, ``family=...``).
    """
    values: dict[str, Any] = {}
    name = getattr(args, "pipeline", None)
    where = "command line"
    if name:
        pipe = get_pipeline(name, getattr(args, "pipelines", None))
        section = getattr(pipe, stage)
        if section is None:
            raise UserError(f"pipeline '{name}' has no '{stage}' section")
        values.update(section.model_dump(exclude_unset=True))
        where = f"pipeline '{name}' with the command line"
        for key, val in fixed.items():
            if key in values and values[key] != val and key in section.model_fields_set:
                raise UserError(f"pipeline '{name}' is a {stage} of {key} '{values[key]}', not '{val}'")
    values.update(fixed)
    model = _section_model(stage, values)
    for key in model.model_fields:
        val = getattr(args, key, None)
        if val is not None and key not in fixed:
            values[key] = val
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        opt = "--" + loc.replace("_", "-")
        if err["type"] == "missing":
            raise UserError(f"{stage}: {opt} is required (give it or use --pipeline)") from None
        if loc and loc in model.model_fields and "input" in err:
            # an option's own value: name the option as typed, with the rule it broke
            source = f" (from pipeline '{name}')" if name and loc not in _given(args) else ""
            given = err["input"]
            shown = ",".join(map(str, given)) if isinstance(given, list) else repr(given)
            raise UserError(f"{opt} {shown}{source}: {_lower_first(err['msg'])}") from None
        msg = err["msg"].removeprefix("Value error, ")
        raise UserError(f"{stage} ({where}): {loc + ': ' if loc else ''}{msg}") from None


def _section_model(stage: str, values: dict[str, Any]) -> type[Section]:
    """The schema of a stage's section: for ``train``, the settings class of its family; for ``classify``,
    classification's settings + the encoder families' options."""
    if stage == "train" and "family" in values:
        from train.models.family import settings_class  # start-up: the families (and torch) only when read

        return settings_class(values["family"])
    if stage == "classify":
        from train.models.classifier import classify_settings_class  # start-up: the families only when read

        return classify_settings_class()
    return _section_class(stage)


def _section_class(stage: str) -> type[Section]:
    """The schema of a stage's section without a family: a feature stage's is the stage's settings + the
    registered extractors' (:func:`features.settings.features_settings_class`)."""
    return features_settings_class() if stage in ("features", "regions") else SECTIONS[stage]


def _given(args: argparse.Namespace) -> set[str]:
    return {k for k, v in vars(args).items() if v is not None}


def _lower_first(text: str) -> str:
    text = text.removeprefix("Value error, ")
    text = text[:1].lower() + text[1:]
    return text.replace("input should be", "must be", 1)
