"""The pipelines file (``pipelines.yaml``) as every stage reads it: the small reader below the stages.

A stage command that takes ``--pipeline NAME`` reads its own section of pipeline NAME here and validates it
with its own settings (``prep.settings``, ``features.settings``, ``train.config.sections``); only the
orchestrator (:mod:`pipelines`) reads every section of every pipeline. This module knows no stage: it
finds the file, reads it (bounded), expands ``${VAR}`` and ``${VAR:-default}``, resolves the relative
paths of the keys a settings class names as path fields, turns a settings class's validation error into
one line naming the file, the pipeline and the key, and merges a command's explicit options over a
pipeline's values over the settings' defaults (:func:`settings_from`).

Which file: ``--pipelines FILE`` when given, else ``$VSE_PIPELINES``, else ``./pipelines.yaml``, else the
installed project's copy. Relative paths start at the file's folder (the installed copy's at the current
directory). ``${VAR:-default}`` gives ``default`` when VAR is unset or empty; ``${VAR}`` unset or empty is
an error naming it for the pipeline about to run, and left as written elsewhere (only the pipeline you run
needs its variables). A path that came from a variable keeps its origin (:class:`Origin`): a stage's "no
such file" for it names the variable and the pipeline (:func:`explain_origins`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from vsecore.errors import UserError
from vsecore.io import read_text
from vsecore.options import option_flag
from vsecore.schema import Section

#: the largest pipelines file read (the project's own is 22 KB)
MAX_PIPELINES_BYTES = 16 << 20
#: ``${NAME}`` or ``${NAME:-default}``
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
#: path values that name no file (weights, a Dask scheduler's address)
_NOT_PATHS = ("imagenet", "none")
_ADDRESSES = ("tcp://", "tls://")

S = TypeVar("S", bound=Section)


def packaged_pipelines_file() -> Path:
    """The project's ``pipelines.yaml`` as installed: ``train/pipelines.yaml`` (a link to the project's file
    in a checkout, a copy in a wheel: the package data every install carries)."""
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


@dataclass(frozen=True)
class Origin:
    """Where a path of a pipeline came from when it was written with environment variables.

    Attributes:
        pipeline: the pipeline's name.
        key: ``stage.key`` (``prep.flat``).
        text: the value as written (``${VSE_SHARED_DATA:-../shared/data}/coco_sample/train.json``).
        variables: the variables it names, in order.
    """

    pipeline: str
    key: str
    text: str
    variables: tuple[str, ...]

    def explanation(self) -> str:
        """``from ${VAR:-default} in pipeline 'NAME': set VAR to the folder holding REST`` (what a missing
        path's message adds)."""
        first = _VAR.search(self.text)
        written = first.group(0) if first else self.text
        rest = self.text[first.end():].lstrip("/") if first else ""
        name = self.variables[0]
        value = os.environ.get(name)
        now = f" (now {value})" if value else ""
        target = f"the folder holding {rest}" if rest else "an existing path"
        return f"from {written} in pipeline '{self.pipeline}': set {name} to {target}{now}"


def _expand(value: str, where: str, strict: bool) -> str:
    """``${VAR}`` and ``${VAR:-default}`` of ``value`` expanded as the shell does (see the module doc);
    ``where`` names the file, pipeline and key in the error of a missing variable."""
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


def _resolve_path(value: str, base: Path) -> str:
    """A path value made absolute against ``base`` (a ``STORE:key`` keeps its key); weights names and
    scheduler addresses unchanged."""
    if value in _NOT_PATHS or value.startswith(_ADDRESSES):
        return value
    windows_drive = re.match(r"^[A-Za-z]:\\", value)
    store, sep, key = value.partition(":") if ":" in value and not windows_drive else (value, "", "")
    p = Path(store).expanduser()
    if not p.is_absolute():
        p = base / p
    return f"{os.path.normpath(p)}{sep}{key}"


def format_validation_error(exc: ValidationError, where: str) -> str:
    """One line for a settings class's validation error: ``WHERE.KEY: what is wrong (+N more)``; ``where``
    is ``FILE: pipeline 'NAME': STAGE``."""
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
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
    return f"{where}{'.' + loc if loc else ''}: {what}{more}"


@dataclass
class PipelineEntry:
    """One pipeline of a file, as written: its sections read one at a time (expanded, paths resolved,
    validated by the settings class the reader gives). ``strict``: its variables must be set (the pipeline
    about to run)."""

    file: Path
    name: str
    body: dict[str, Any]
    base: Path
    strict: bool = True
    #: the resolved path (without a ``:key``) -> where it came from, for every path written with variables
    origins: dict[str, Origin] = field(default_factory=dict)

    def where(self, stage: str) -> str:
        """``FILE: pipeline 'NAME': STAGE``: the start of an error about a section."""
        return f"{self.file}: pipeline '{self.name}': {stage}"

    def has(self, stage: str) -> bool:
        """Whether the pipeline has a ``stage`` section."""
        return self.body.get(stage) is not None

    def values(self, stage: str, path_fields: Sequence[str]) -> dict[str, Any] | None:
        """The ``stage`` section as written, its variables expanded and the paths of ``path_fields`` made
        absolute (None without the section; a :class:`UserError` when it is not a mapping)."""
        raw = self.body.get(stage)
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise UserError(f"{self.where(stage)}: expected a mapping (got {raw!r:.60})")
        values = dict(raw)
        for key in path_fields:
            value = values.get(key)
            if isinstance(value, str):
                values[key] = self._path(value, f"{stage}.{key}")
            elif isinstance(value, list):
                values[key] = [self._path(v, f"{stage}.{key}") if isinstance(v, str) else v for v in value]
        return values

    def _path(self, value: str, key: str) -> str:
        expanded = _expand(value, f"{self.file}: pipeline '{self.name}': {key}", self.strict)
        if _VAR.search(expanded):  # left as written: a variable of a pipeline not being run
            return expanded
        resolved = _resolve_path(expanded, self.base)
        if expanded != value:
            names = tuple(m.group(1) for m in _VAR.finditer(value))
            store = resolved.rpartition(":")[0] if ":" in Path(resolved).name else resolved
            self.origins[store] = Origin(self.name, key, value, names)
        return resolved

    def section(self, stage: str, build: Callable[..., S], path_fields: Sequence[str],
                inputs: Mapping[str, Callable[[], Any]] | None = None) -> S | None:
        """The ``stage`` section validated by ``build(**values)`` (a settings class or its factory); each
        key of ``inputs`` not written takes the value its function gives (an upstream stage's output). A
        validation error is one line naming the file, the pipeline and the key."""
        values = self.values(stage, path_fields)
        if values is None:
            return None
        for key, upstream in (inputs or {}).items():
            if values.get(key) is None and (value := upstream()) is not None:
                values[key] = value
        try:
            return build(**values)
        except ValidationError as exc:
            raise UserError(format_validation_error(exc, self.where(stage))) from None


class PipelinesFile:
    """A pipelines file read once: its pipelines as written (:meth:`entry` reads one)."""

    def __init__(self, path: Path, pipelines: dict[str, Any]) -> None:
        self.path = path
        self.pipelines = pipelines
        self.base = _paths_base(path)

    @classmethod
    def read(cls, file: str | os.PathLike | None = None) -> PipelinesFile:
        """Read ``file`` (default :func:`default_pipelines_file`): a bounded YAML read, the top level
        checked; every failure one line naming the file."""
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
        return cls(path, {str(name): body for name, body in raw["pipelines"].items()})

    def names(self) -> list[str]:
        """The pipelines' names, in the file's order."""
        return list(self.pipelines)

    def entry(self, name: str, strict: bool = True) -> PipelineEntry:
        """Pipeline ``name`` (a :class:`UserError` listing the known names when absent)."""
        if name not in self.pipelines:
            raise UserError(f"unknown pipeline '{name}' (known: {', '.join(sorted(self.pipelines))})")
        body = self.pipelines[name]
        if not isinstance(body, dict):
            raise UserError(f"{self.path}: pipeline '{name}': expected a mapping, got {type(body).__name__}")
        return PipelineEntry(self.path, name, body, self.base, strict)


# -- a stage command's settings: explicit options > --pipeline > the settings' defaults ---------------------


@dataclass(frozen=True)
class PipelineSettings:
    """What ``--pipeline NAME`` gives a stage command: the keys its section sets (with the inputs it takes
    from upstream stages), and where the paths written with variables came from."""

    name: str
    stage: str
    values: dict[str, Any]
    origins: dict[str, Origin]


def pipeline_settings(args: argparse.Namespace, stage: str,
                      read: Callable[[PipelineEntry], Section | None]) -> PipelineSettings | None:
    """The section ``stage`` of the pipeline ``args.pipeline`` names (in ``args.pipelines``, else the
    default file), read and validated by ``read`` (the stage's own reader); None without ``--pipeline``."""
    name = getattr(args, "pipeline", None)
    if not name:
        return None
    entry = PipelinesFile.read(getattr(args, "pipelines", None)).entry(name)
    section = read(entry)
    if section is None:
        raise UserError(f"pipeline '{name}' has no '{stage}' section")
    return PipelineSettings(name, stage, section.model_dump(exclude_unset=True), entry.origins)


def settings_from(model: type[S], stage: str, args: argparse.Namespace,
                  fixed: Mapping[str, Any] | None = None, pipeline: PipelineSettings | None = None) -> S:
    """A stage's settings, key by key: the explicit command-line value, else the pipeline's
    (:func:`pipeline_settings`), else the default of ``model``.

    ``args`` holds the parsed options (``None`` when not given), named as ``model``'s fields; ``fixed`` pins
    keys the subcommand gives (``dataset=...``, ``kind=...``, ``family=...``), which a pipeline that sets
    them must agree with. Every error is one line naming the option as typed.
    """
    fixed = dict(fixed or {})
    values: dict[str, Any] = {}
    if pipeline is not None:
        values.update(pipeline.values)
        for key, val in fixed.items():
            if key in values and values[key] != val:
                raise UserError(f"pipeline '{pipeline.name}' is a {stage} of {key} '{values[key]}', not "
                                f"'{val}'")
    values.update(fixed)
    given = {key for key, val in vars(args).items() if val is not None}
    for key in model.model_fields:
        if key in given and key not in fixed:
            values[key] = getattr(args, key)
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise UserError(_option_error(exc, model, stage, pipeline, given)) from None


def _option_error(exc: ValidationError, model: type[Section], stage: str, pipeline: PipelineSettings | None,
                  given: set[str]) -> str:
    """The one line of a settings error, naming the option as typed (and the pipeline when the value was
    its)."""
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    info = model.model_fields.get(loc)
    opt = option_flag(loc, info) if info is not None else "--" + loc.replace("_", "-")
    if err["type"] == "missing":
        return f"{stage}: {opt} is required (give it or use --pipeline)"
    if info is not None and "input" in err:
        source = f" (from pipeline '{pipeline.name}')" if pipeline and loc not in given else ""
        value = err["input"]
        shown = ",".join(map(str, value)) if isinstance(value, list) else repr(value)
        return f"{opt} {shown}{source}: {_lower_first(err['msg'])}"
    where = f"pipeline '{pipeline.name}' with the command line" if pipeline else "command line"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{stage} ({where}): {loc + ': ' if loc else ''}{msg}"


def _lower_first(text: str) -> str:
    text = text.removeprefix("Value error, ")
    text = text[:1].lower() + text[1:]
    return text.replace("input should be", "must be", 1)


# -- a missing path that came from a variable ----------------------------------------------------------------

#: how a stage says that a path it was given does not exist
_MISSING = re.compile(r"^(?P<path>.+?): no such (?:file|folder)\b")


def explained(message: str, origins: Mapping[str, Origin]) -> str:
    """``message`` with the origin of its path added when it says a path that came from a variable (or lies
    under one) does not exist: ``PATH: no such file (given by --flat, from ${VAR:-d} in pipeline 'P': set
    VAR to the folder holding REST)``; else ``message`` unchanged."""
    missing = _MISSING.match(message)
    if missing is None or not origins:
        return message
    path = Path(missing.group("path"))
    for written, origin in origins.items():
        if path == Path(written) or Path(written) in path.parents:
            hint = origin.explanation()
            if message.endswith(")") and "(given by " in message:
                return f"{message[:-1]}, {hint})"
            return f"{message} ({hint})"
    return message


@contextlib.contextmanager
def explain_origins(origins: Mapping[str, Origin] | PipelineSettings | None) -> Iterator[None]:
    """Around a stage's work: a :class:`UserError` saying that a path written with variables does not
    exist names the variable and the pipeline (:func:`explained`)."""
    if isinstance(origins, PipelineSettings):
        origins = origins.origins
    try:
        yield
    except UserError as exc:
        # the same exception, so its type, hint and traceback stay; only its words gain the origin
        exc.args = (explained(str(exc), origins or {}), *exc.args[1:])
        raise
