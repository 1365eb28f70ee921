"""The schema of ``pipelines.yaml``: one validated entry per experiment, and the stage commands' defaults.

A pipeline has a section per stage: ``prep``, ``features``, ``train`` (or ``classify``) and
``evaluate``. Each section is a schema (pydantic, ``extra="forbid"``): an unknown key, a
wrong type or a missing required field is a :class:`~vsecore.errors.UserError` that names the file,
the pipeline and the key. The ``train`` section is the settings of its family: the common fields
(:class:`train.settings.TrainSection`) + the family's own (its ``Family.config``,
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
Downstream inputs default to upstream outputs: ``features.data`` and ``train.data`` to
``prep.out``, ``train.features`` to ``features.out`` with the key of the feature kind
(``:global`` or ``:fne``).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from train.settings import TrainSection
from vsecore.errors import UserError
from vsecore.io import read_text
from vsecore.schema import Section

DATASETS = ("coco", "f8k", "f30k", "multi30k", "yjcaptions", "synthetic", "karpathy", "textcls")
PROTOCOLS = ("1k", "5cv", "5k", "all")


class PrepSection(Section):
    """Options of ``prep <dataset>``."""

    path_fields: ClassVar[tuple[str, ...]] = (
        "out", "karpathy", "annotations", "split_file", "images", "token_file", "split_dir",
        "root", "yj", "coco_karpathy", "flat", "train_file", "test_file", "classes_file",
    )
    dataset: Literal["coco", "f8k", "f30k", "multi30k", "yjcaptions", "synthetic", "karpathy", "textcls"]
    out: str
    #: karpathy: the dataset's name (default: the file's "dataset" field) and its captions' language
    name: str | None = None
    lang: Literal["en", "de", "ja"] = "en"
    # coco / f8k / f30k inputs
    karpathy: str | None = None
    annotations: list[str] | None = None
    split_file: str | None = None
    flat: list[str] | None = None
    flat_val_images: int = 100
    images: str | None = None
    restval: bool = True
    #: coco: keep every caption of an image instead of the first ``captions_per_image``
    all_captions: bool = False
    token_file: str | None = None
    split_dir: str | None = None
    # multi30k
    root: str | None = None
    # yjcaptions
    yj: str | None = None
    coco_karpathy: str | None = None
    val_images: int = 1000
    test_images: int = 1000
    # synthetic
    num_images: int = 1200
    image_size: int = 128
    #: synthetic: captions drawn per image and language (1..5); coco: the first K kept per image
    #: (the VSE++/SCAN protocol: 5; Karpathy's file gives a few images 6 or 7)
    captions_per_image: int = Field(5, ge=1)
    languages: list[str] = Field(default_factory=lambda: ["en", "de", "ja"])
    # textcls (text classification, prep.textcls): Zhang et al. CSV (train/test + classes.txt) or a
    # generic CSV/TSV with a header; val carved from train (stratified, seeded); test_fraction splits a
    # single file
    text_format: Literal["zhang", "csv", "tsv"] = "zhang"
    train_file: str | None = None
    test_file: str | None = None
    classes_file: str | None = None
    label_col: str | None = None
    text_cols: list[str] | None = None
    lang_col: str | None = None
    val_fraction: float = Field(0.05, gt=0, lt=1)
    test_fraction: float | None = Field(None, gt=0, lt=1)
    # common
    seed: int = 0
    strict: bool = False
    lowercase: bool = True
    #: a token / character of the train split enters the vocabulary when seen at least this often
    min_word_count: int = Field(1, ge=1)
    min_char_count: int = Field(1, ge=1)


class FeaturesSection(Section):
    """Options of ``features cnn|fne|regions``."""

    path_fields: ClassVar[tuple[str, ...]] = ("data", "out", "weights")
    kind: Literal["cnn", "fne", "regions"] = "cnn"
    data: str | None = None
    out: str
    cnn: str = "vgg19"
    weights: str = "imagenet"
    allow_download: bool = False
    crops: Literal[1, 10] = 10
    resize: int | None = None
    input_size: int | None = None
    batch_size: int = 32
    block_size: int = 256
    device: str = "auto"
    amp: bool = False
    scheduler: str = "none"
    workers: int = 2
    threads: int | None = None
    on_error: Literal["record", "fail"] = "record"
    threshold_low: float = -0.25
    threshold_high: float = 0.15
    # regions: grid (cells of the cnn's last feature map; cnn defaults to efficientnet_lite0 there) or
    # fasterrcnn (torchvision's fasterrcnn_resnet50_fpn, also accepted by that name), then the
    # bottom-up-attention selection rules of fasterrcnn; fixed_boxes K (null: min..max_boxes)
    detector: str = "grid"
    score_threshold: float = 0.2
    nms_threshold: float = 0.3
    min_boxes: int = 10
    max_boxes: int = 100
    fixed_boxes: int | None = 36


#: ``train classify --encoder``: the registered text encoders a classifier can read texts with
CLASSIFY_ENCODERS = ("chain", "oecc", "seam", "gru")


class ClassifySection(Section):
    """Options of ``train classify`` (CHAIN-VSE section 5): a registered text encoder + a softmax head.

    The encoder's options are those of its retrieval family (``version``/``p`` of chain, ``arch`` of
    oecc, ``variant``/``hops``/``penalty``/``gru_units`` of seam; ``gru``: word embedding + GRU of
    ``gru_units`` units, the UVS encoder); the loop is the retrieval trainer's, with the validation
    accuracy in place of the rsum.
    """

    path_fields: ClassVar[tuple[str, ...]] = ("data", "out")
    #: keys only some encoders accept
    encoder_keys: ClassVar[dict[str, tuple[str, ...]]] = {
        "version": ("chain",), "p": ("chain",), "arch": ("oecc",), "variant": ("seam",), "hops": ("seam",),
        "penalty": ("seam",), "word_dim": ("gru",),
    }
    #: what the shared trainer reads of a retrieval run's settings: every text once per epoch; one phase
    captions_per_epoch: ClassVar[str] = "all"
    finetune_lr: ClassVar[None] = None
    encoder: Literal["chain", "oecc", "seam", "gru"] = "chain"
    data: str | None = None
    out: str
    version: Literal["v1", "v2"] = "v1"
    p: float = Field(1.0, gt=0)
    arch: Literal["A", "B", "C", "D"] = "D"
    variant: Literal["E", "C", "G"] = "E"
    hops: int | None = Field(None, ge=1)
    penalty: float = Field(0.0, ge=0)
    #: GRU units of seam G and of the gru encoder
    gru_units: int = Field(512, ge=1)
    #: word embedding size of the gru encoder
    word_dim: int = Field(300, ge=1)
    #: dropout before the softmax layer
    dropout: float = Field(0.5, ge=0, lt=1)
    #: character encoders read at most this many characters (Zhang et al.'s 1014)
    max_chars: int = Field(1014, ge=1)
    max_words: int = Field(200, ge=1)
    min_word_count: int = Field(1, ge=1)
    #: language of new texts given to a word encoder (predict, noise); the dataset's rows carry their own
    lang: str = "en"
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0)
    lr_schedule: Literal["plateau", "step", "constant"] = "plateau"
    lr_decay_patience: int = Field(2, ge=1)
    lr_step: int = Field(15, ge=1)
    early_stop: int = Field(4, ge=1)
    epochs: int = Field(20, ge=1)
    grad_clip: float | None = Field(5.0, ge=0)
    checkpoint_every: int = Field(200, ge=1)
    seed: int = 0
    device: str = "auto"
    amp: bool = False
    workers: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _encoder_keys(self) -> ClassifySection:
        for key, encoders in self.encoder_keys.items():
            if key in self.model_fields_set and self.encoder not in encoders:
                raise ValueError(f"'{key}' applies to encoder {'/'.join(encoders)}, not '{self.encoder}'")
        return self


class EvaluateSection(Section):
    """Options of the final evaluation of a pipeline's run."""

    split: Literal["val", "test"] = "test"
    protocols: list[Literal["1k", "5cv", "5k", "all"]] = Field(default_factory=lambda: ["all"])
    noise: str | None = None
    length_analysis: bool = False


class CompareSection(Section):
    """Options of ``train compare`` as a pipeline stage (:mod:`train.compare`).

    ``data`` defaults to ``prep.out``, ``features`` to the ``features`` stage's store and ``regions`` to
    the ``regions`` stage's (a second feature stage, of kind ``regions``, for the region families).
    """

    path_fields: ClassVar[tuple[str, ...]] = ("data", "features", "regions", "out")
    #: family names (their defaults) or pipeline names of the same file; None: every registered family
    families: list[str] | None = Field(None, min_length=1)
    epochs: int | None = Field(None, ge=1)
    seed: int = 0
    seeds: int = Field(1, ge=1)
    noise: str = "0.05:0.25:0.05"
    device: str = "auto"
    data: str | None = None
    features: str | None = None
    regions: str | None = None
    out: str


def _store_key(section: FeaturesSection) -> str:
    """The array a stage's store is read by: ``fne``, ``regions`` or ``global``."""
    return "fne" if section.kind == "fne" else ("regions" if section.kind == "regions" else "global")


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

    @field_validator("train", mode="before")
    @classmethod
    def _family_settings(cls, value: Any) -> Any:
        """A ``train:`` mapping is the settings of its family (``TrainSection`` + the family's own
        fields): any key of the union of the families' settings is known, and belongs to its family."""
        if not isinstance(value, dict):
            return value
        from train.models.family import train_settings  # the families (and torch) only once a file is read

        return train_settings(**value)

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
            if stage.kind == "regions" and compare.regions is None:
                compare.regions = f"{stage.out}:regions"
            elif stage.kind != "regions" and compare.features is None:
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


def load_pipelines(file: str | os.PathLike | None = None, expand: str | None = None) -> dict[str, Pipeline]:
    """Read and validate every pipeline of ``file`` (see :func:`default_pipelines_file`).

    Every pipeline is checked against the schema; environment variables must be set only for the
    pipeline named by ``expand`` (the one about to run): elsewhere ``${VAR}`` is left as written.
    """
    path = Path(file) if file is not None else default_pipelines_file()
    text = read_text(path, "a pipelines YAML file", missing=f"{path}: no such pipelines file")
    try:
        raw = yaml.safe_load(text)
    except RecursionError:
        raise UserError(f"{path}: YAML nested too deeply to read; not a pipelines file") from None
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
        for sec, model in SECTIONS.items():
            if isinstance(body.get(sec), dict):
                body[sec] = dict(body[sec])
                _resolve_paths(body[sec], model, base, f"{path}: pipeline '{name}': {sec}",
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


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--pipeline NAME`` and ``--pipelines FILE`` to a stage command's parser."""
    parser.add_argument("--pipeline", metavar="NAME", default=None,
                        help="take this stage's settings from the named pipeline in pipelines.yaml; "
                             "options given explicitly override them")
    parser.add_argument("--pipelines", metavar="FILE", default=None,
                        help="pipelines file (default: $VSE_PIPELINES, ./pipelines.yaml, or the project's)")


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
    """The schema of a stage's section: for ``train``, the settings class of its family."""
    if stage == "train" and "family" in values:
        from train.models.family import settings_class

        return settings_class(values["family"])
    return SECTIONS[stage]


def _given(args: argparse.Namespace) -> set[str]:
    return {k for k, v in vars(args).items() if v is not None}


def _lower_first(text: str) -> str:
    text = text.removeprefix("Value error, ")
    text = text[:1].lower() + text[1:]
    return text.replace("input should be", "must be", 1)
