"""Command-line options generated from settings fields: one option per field of a settings class, so that a
stage's ``--help``, its ``pipelines.yaml`` section and the values a run records read one declaration.

:func:`field_option` is the generator ``train <family>`` (:mod:`train.cli.fit_options`) and ``features
<kind>`` (:mod:`features.cli`) use. A field says how its option looks in its ``json_schema_extra``:
``metavar``; ``option``, the flag when it is not ``--`` + the field's name (``fixed_boxes`` is ``--boxes``);
``action: "store_true"`` for a switch that is only ever turned on (``--amp``; other booleans get
``--name/--no-name``). And the options every stage command shares to read its settings from a pipelines
file: ``--pipeline NAME`` and ``--pipelines FILE`` (:func:`add_pipeline_arguments`; what they mean:
:func:`pipelines.schema.stage_settings`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo


def _comma_list(kind: type) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            return [kind(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None

    return parse


def option_extra(info: FieldInfo) -> dict[str, Any]:
    """The ``json_schema_extra`` of a field as a dict (empty when it has none)."""
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def option_flag(name: str, info: FieldInfo) -> str:
    """The flag of the option of field ``name``: its ``option`` extra, else ``--`` + the name with dashes."""
    return str(option_extra(info).get("option", "--" + name.replace("_", "-")))


def field_option(group: argparse._ActionsContainer, name: str, info: FieldInfo, *,
                 help_text: str | None = None, metavar: str | None = None) -> None:
    """Add the option of the settings field ``name``: its type and choices from the annotation, its help
    from the description (or ``help_text``), its metavar from the field (or ``metavar``); ``default=None``,
    so a value not given comes from the pipeline or the schema (:func:`pipelines.schema.stage_settings`)."""
    text = info.description if help_text is None else help_text
    kwargs: dict[str, Any] = {"dest": name, "default": None,
                              "help": (text or "").replace("%", "%%")}  # argparse formats the help with %
    extra = option_extra(info)
    if metavar or "metavar" in extra:
        kwargs["metavar"] = metavar or extra["metavar"]
    kind = info.annotation
    if get_origin(kind) in (Union, UnionType):  # X | None: an option of type X
        kinds = [a for a in get_args(kind) if a is not type(None)]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind is bool:
        switch = extra.get("action") == "store_true"
        kwargs["action"] = "store_true" if switch else argparse.BooleanOptionalAction
    elif get_origin(kind) is Literal:
        kwargs["choices"] = get_args(kind)
        kwargs["type"] = type(get_args(kind)[0])
    elif get_origin(kind) is list:
        kwargs["type"] = _comma_list(get_args(kind)[0])
    elif kind in (int, float, str):
        kwargs["type"] = kind
    else:
        raise TypeError(f"setting {name!r}: no command-line option for the type {info.annotation!r}")
    group.add_argument(option_flag(name, info), **kwargs)


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--pipeline NAME`` and ``--pipelines FILE`` to a stage command's parser."""
    parser.add_argument("--pipeline", metavar="NAME", default=None,
                        help="take this stage's settings from the named pipeline in pipelines.yaml; "
                             "options given explicitly override them")
    add_pipelines_file_argument(parser)


def add_pipelines_file_argument(parser: argparse._ActionsContainer) -> None:
    """``--pipelines FILE``: the pipelines file a ``--pipeline`` (or a pipeline name) is looked up in."""
    parser.add_argument("--pipelines", metavar="FILE", default=None,
                        help="pipelines file (default: $VSE_PIPELINES, ./pipelines.yaml, or the project's)")
