"""Command-line options generated from settings fields, and the options several commands share, each
declared here once.

:func:`field_option` adds the option of one field of a settings class, so that a stage's ``--help``, its
``pipelines.yaml`` section and the values a run records read one declaration (``prep <dataset>``,
``features <kind>``, ``train <family>``, ``train classify``). A field says how its option looks in its
``json_schema_extra``: ``metavar``; ``option``, the flag when it is not ``--`` + the field's name
(``fixed_boxes`` is ``--boxes``); ``action: "store_true"`` for a switch that is only ever turned on
(``--amp``; other booleans get ``--name/--no-name``); ``nargs`` for a list given as separate words (``--flat
TRAIN.json VAL.json``; other lists are comma-separated); ``choices`` for the values a list's items take.
:func:`show_defaults` writes each option's "(default ...)" from the settings, so no help text restates one.

The shared options: ``--out`` where it is no setting (:func:`add_out_option`), ``--overwrite``
(:func:`add_overwrite_option`, with the words of what each command replaces), ``--pipeline NAME`` and
``--pipelines FILE`` (:func:`add_pipeline_arguments`; what they mean: :func:`vsecore.pipelines_file.
settings_from`); ``-q``, ``-v`` and ``--traceback`` are :func:`vsecore.errors.add_common_options`.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Collection, Mapping
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
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
    so a value not given comes from the pipeline or the settings (:func:`vsecore.pipelines_file.
    settings_from`)."""
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
        item = get_args(kind)[0]
        if get_origin(item) is Literal:
            kwargs["choices"] = get_args(item)
            item = type(get_args(item)[0])
        if "nargs" in extra:  # words of their own: --flat TRAIN.json VAL.json
            kwargs.update(nargs=extra["nargs"], type=item)
        else:
            kwargs["type"] = _comma_list(item)
        if "choices" in extra:
            kwargs["choices"] = tuple(extra["choices"])
    elif kind in (int, float, str):
        kwargs["type"] = kind
    else:
        raise TypeError(f"setting {name!r}: no command-line option for the type {info.annotation!r}")
    group.add_argument(option_flag(name, info), **kwargs)


#: a help text's own "(default ...)" note at its end, replaced by the value the settings give
DEFAULT_NOTE = re.compile(r"\s*\(default[^()]*(?:\([^()]*\)[^()]*)*\)\s*$")


def shown(value: Any, sep: str = ",") -> str:
    """A setting as ``--help`` shows it: on/off, numbers as Python prints them, lists joined by ``sep``
    (a comma, or a space for an option that takes its items as words)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return sep.join(str(v) for v in value) if value else "none"
    return str(value)


def show_defaults(parser: argparse.ArgumentParser, resolved: BaseModel | Mapping[str, Any],
                  notes: Mapping[str, str] | None = None, skip: Collection[str] = ()) -> None:
    """Rewrite the "(default ...)" of each option that is a field of ``resolved`` (settings, or the
    defaults of a settings class, :func:`field_defaults`) with that field's value, so ``--help`` and what a
    run records read one source. ``notes``: option -> what its note adds; ``skip``: fields whose value is
    no default to show (where a command writes). A value of None, and a switch only ever turned on, keep
    their description as it is."""
    values = resolved if isinstance(resolved, Mapping) else {k: getattr(resolved, k)
                                                            for k in type(resolved).model_fields}
    notes = notes or {}
    for action in parser._actions:
        key = action.dest
        if key not in values or key in skip or isinstance(action, argparse._StoreTrueAction):
            continue
        value = values[key]
        if value is None:  # no value without data: the description's own note says what is used
            continue
        text = DEFAULT_NOTE.sub("", action.help or "")
        words = action.nargs not in (None, "?")  # items given as words: shown as words
        action.help = f"{text} (default {shown(value, ' ' if words else ',')}{notes.get(key, '')})"


def field_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Each field of ``model`` that has a default -> that default (what an option not given becomes)."""
    return {name: info.get_default(call_default_factory=True) for name, info in model.model_fields.items()
            if not info.is_required()}


def add_out_option(parser: argparse._ActionsContainer, help: str, metavar: str = "DIR",
                   required: bool = False) -> None:
    """``--out``, where a command writes (when it is no setting: a setting's ``--out`` is its field's
    option, :func:`field_option`)."""
    parser.add_argument("--out", metavar=metavar, default=None, required=required, help=help)


def add_overwrite_option(parser: argparse._ActionsContainer, replaces: str) -> None:
    """``--overwrite``, a switch; ``replaces`` says what this command replaces with it (and what never)."""
    parser.add_argument("--overwrite", action="store_true", help=replaces)


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
