"""``features <kind>``: the extraction subcommands, one per kind of extractor, their options generated from
the settings (:func:`vsecore.options.field_option`): the stage's own fields (:class:`features.settings.
FeaturesSection`) and each of the kind's extractors' (:mod:`features.extractors`), so ``--help``, the
``features:`` section of ``pipelines.yaml`` and the store's record read one declaration."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from pydantic.fields import FieldInfo

from features.extractors.registry import Extractor, extractors_of_kind
from features.run import run_features
from features.settings import FeaturesSection, features_section, features_settings_class, implied_settings
from vsecore.options import add_overwrite_option, add_pipeline_arguments, field_option, option_extra
from vsecore.pipelines_file import explain_origins, pipeline_settings, settings_from

#: the stage's settings offered after the extractor's, in ``--help`` order (``data`` and ``out`` first)
STAGE_OPTIONS = ("allow_download", "batch_size", "block_size", "device", "amp", "scheduler", "workers",
                 "threads", "decode_threads", "read_ahead", "on_error")


def _parts(text: str, sep: str) -> list[str]:
    """``text`` split at each ``sep`` outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
    return [*parts, text[start:]]


def merged(texts: Iterable[str | None], sep: str) -> str | None:
    """What several extractors of a kind say of one option, each part once: the parts only some of them say
    first, in order, then those all of them say (``grid: imagenet ...; PATH: ...`` and ``fasterrcnn: coco
    ...; PATH: ...`` -> ``grid: imagenet ...; fasterrcnn: coco ...; PATH: ...``; metavars alike with ``|``).
    None when none says anything."""
    said = [_parts(t, sep) for t in dict.fromkeys(t for t in texts if t)]
    if not said:
        return None
    common = [p for p in said[0] if all(p in parts for parts in said)]
    own = [p for parts in said for p in parts if p not in common]
    return sep.join(dict.fromkeys([*own, *common]))


def extractor_fields(extractors: Iterable[Extractor]) -> dict[str, list[FieldInfo]]:
    """Each setting of the extractors of a kind (in declaration order, each once) and its declarations."""
    fields: dict[str, list[FieldInfo]] = {}
    for extractor in extractors:
        for name, info in extractor.config.model_fields.items():
            fields.setdefault(name, []).append(info)
    return fields


def add_extraction_parser(sub: argparse._SubParsersAction, kind: str) -> None:
    """Add ``features <kind>``: ``--pipeline``, ``--data``, ``--out``, one option per setting of the kind's
    extractors (a setting several declare: their help texts joined, each once), the stage's settings (with
    the help the kind gives them), the run's switches and the extractors' own."""
    extractors = extractors_of_kind(kind)
    first = extractors[0]
    p = sub.add_parser(kind, help=first.summary, description=first.description)
    add_pipeline_arguments(p)
    stage = FeaturesSection.model_fields
    for name in ("data", "out"):
        field_option(p, name, stage[name])
    for name, infos in extractor_fields(extractors).items():
        help_text = merged((i.description for i in infos), "; ")
        field_option(p, name, infos[0], help_text=help_text,
                     metavar=merged((option_extra(i).get("metavar") for i in infos), "|"))
    for name in STAGE_OPTIONS:
        given_help = merged((e.option_help.get(name) for e in extractors), "; ")
        field_option(p, name, stage[name], help_text=given_help)
    add_overwrite_option(p, "delete an existing store at --out and start over (default: resume it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--retry-failed", action="store_true",
                   help="recompute the blocks of every recorded failure (a re-run always retries failures "
                        "that may be transient: missing file, I/O error, truncated file)")
    for flag, text in {f: t for e in extractors for f, t in e.flags.items()}.items():
        p.add_argument(flag, action="store_true", help=text)


def run_extraction(args: argparse.Namespace) -> int:
    """``features <kind>``: the settings (options > ``--pipeline`` > defaults, and what the command line
    implies, :attr:`features.extractors.registry.Extractor.command_line`), then the library."""
    pipeline = pipeline_settings(args, "features", features_section)
    settings = settings_from(features_settings_class(), "features", args, {"kind": args.command}, pipeline)
    settings = implied_settings(settings, {key for key, value in vars(args).items() if value is not None})
    rethreshold = bool(getattr(args, "rethreshold", False))
    with explain_origins(pipeline):
        run_features(settings, overwrite=args.overwrite, rethreshold=rethreshold,
                     progress=not args.no_progress, retry_failed=args.retry_failed)
    return 0
