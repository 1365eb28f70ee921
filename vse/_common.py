"""What every function of the API shares: the console verbosity of one call (``quiet``), and a stage's
settings built the way its command builds them (:func:`vsecore.pipelines_file.settings_from`: the keyword
arguments > a pipeline's section > the settings' defaults, validated by the same pydantic class)."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, TypeVar

from vsecore import console
from vsecore.errors import UserError
from vsecore.pipelines_file import PipelineEntry, PipelineSettings, pipeline_settings, settings_from
from vsecore.schema import Section

S = TypeVar("S", bound=Section)


@contextlib.contextmanager
def verbosity(quiet: bool | None) -> Iterator[None]:
    """While the context is open: ``quiet=True`` prints results and warnings only (a command's ``-q``),
    ``False`` every message, ``None`` leaves the verbosity as it is; the previous one comes back after."""
    previous = console.verbosity()
    if quiet is not None:
        console.set_verbosity(console.QUIET if quiet else console.NORMAL)
    try:
        yield
    finally:
        console.set_verbosity(previous)


def stage_settings(model: type[S], stage: str, values: Mapping[str, Any], fixed: Mapping[str, Any],
                   read: Callable[[PipelineEntry], Section | None], pipeline: str | None = None,
                   pipelines: str | None = None, allowed: Collection[str] | None = None
                   ) -> tuple[S, PipelineSettings | None]:
    """The settings ``model`` of ``stage`` from keyword ``values`` (``None``: not given) over the section of
    pipeline ``pipeline`` (read by ``read`` from ``pipelines``, else the default file) over the defaults;
    ``fixed`` pins what the subcommand names (``dataset``, ``kind``, ``family``). ``allowed``: the keys a
    caller may give (default: ``model``'s fields); another is a :class:`UserError`, as an unknown option is
    for the command (settings_from reads only the model's fields, so a misspelt key would be ignored)."""
    allowed = set(model.model_fields if allowed is None else allowed) - set(fixed)
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise UserError(f"{stage}: unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                        f"(expected some of: {', '.join(sorted(allowed))})")
    # the command's parsed options, as argparse would hold them: one attribute per setting given
    args = argparse.Namespace(**values, pipeline=pipeline, pipelines=pipelines)
    found = pipeline_settings(args, stage, read)
    return settings_from(model, stage, args, fixed, found), found


def given(settings: Mapping[str, Any], **named: Any) -> dict[str, Any]:
    """The settings a call gives (``named``: its named arguments, kept when not ``None``), path-like values
    as strings (the settings hold paths as ``str``, as the command line gives them)."""
    values = {**settings, **{k: v for k, v in named.items() if v is not None}}
    return {key: _plain(value) for key, value in values.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
