"""Extractors: what ``features <kind>`` computes, declared in one :class:`Extractor` object per kind file.

An extractor file (``features/extractors/cnn.py``, ``fne.py``, ``grid.py``, ``detector.py``, or a file of
one's own) declares its settings (an :class:`ExtractorConfig`: fields with defaults, help text, metavar), its
recipe (the settings -> what its mapper must compute, shaped like the store's recorded ``config``), and how a
mapper is built from a plain config in any process (the driver, a Dask worker, a query). Everything else is
derived: the stage's settings (:class:`~features.settings.FeaturesSection` + the union of the extractors'
fields, :mod:`features.settings`), the options and ``--help`` of ``features <kind>`` (:mod:`features.cli`),
the ``features:`` section of ``pipelines.yaml`` (:mod:`pipelines.schema`), the rebuilding of a store's
mapper (:mod:`features.extractors.recipe`) and the featurizing of query images (:mod:`features.featurize`).

Several extractors may share a kind (one ``features`` subcommand, one ``kind:`` of a pipeline): ``regions``
holds ``grid`` and ``fasterrcnn``, chosen by the setting their :attr:`Extractor.selector` names
(``--detector``). :func:`register_extractor` adds an extractor; ``features/extractors/__init__.py`` imports
the built-in files and registers theirs explicitly. An extractor of one's own is one file: import it and
pass its ``Extractor`` to :func:`register_extractor` (``tests/test_extractor_plugin.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from vsecore.errors import UserError


class ExtractorConfig(BaseModel):
    """The base of an extractor's own settings: fields only (with their defaults, ``description`` as the
    option's help, ``json_schema_extra`` for its metavar or flag, see :func:`vsecore.options.field_option`).

    A field several extractors declare is one setting of the stage: it must have the same type and default
    in each (its help may differ: each kind's ``--help`` shows its own). ``path_fields``: fields holding
    paths, resolved against a pipelines file's folder.
    """

    model_config = ConfigDict(extra="forbid")
    path_fields: ClassVar[tuple[str, ...]] = ()


def default_record(settings: Any, mapper: Any, store: dict[str, Any]) -> dict[str, Any]:
    """A store's ``config`` for an extractor without its own rule: its recipe, the SHA-256 of the mapper's
    weights (its provenance's ``weights_sha256``), then the store's own keys ``store``."""
    recipe = get_extractor_of(settings).recipe(settings)
    return {**recipe, "weights_sha256": mapper.provenance.get("weights_sha256"), **store}


def no_check(settings: Any) -> None:
    """An extractor whose settings need no check beyond their types."""


@dataclass(frozen=True)
class Extractor:
    """One extractor, declared beside its settings.

    Attributes:
        name: its registry name; under a :attr:`selector`, the value that chooses it (``grid``).
        kind: the ``features`` subcommand, the ``kind`` of its settings and of its stores' ``config``.
        summary: one line for ``features --help`` (the first extractor of a kind speaks for it).
        description: the start of ``features <kind> --help``.
        config: its own settings; the stage's settings are the common ones + every extractor's.
        recipe: ``(settings) -> {key: value}``: what determines its rows, shaped like a store's ``config``
            (``kind`` included; sizes not given stay ``None``). A store's mapper is rebuilt from this record
            (:func:`features.extractors.recipe.mapper_config`), at extraction as for a query.
        build: ``(config) -> mapper``: the mapper of a plain config (the recipe or a store's record, with the
            speed keys ``batch_size``, ``device`` (resolved), ``threads``, ``allow_download``), in any
            process.
        keys: the ``STORE:key`` names its rows are read by, the first the default (a pipeline's
            ``train.features``).
        selector: the setting that chooses among the extractors of its kind (``detector``); None: alone.
        aliases: other values of the selector that name it (``fasterrcnn_resnet50_fpn``).
        record: ``(settings, mapper, store keys) -> config``: the store's recorded ``config`` (what a
            resumed run must match, what a query rebuilds the mapper from).
        check: ``(settings) -> None``: one-line errors for settings that cannot work, before any work.
        finish: ``(store, dataset, settings) -> None``: run once every block is in (the FNE statistics).
        hints: a ``config`` key -> what to say when a store's recorded value differs from the run's.
        option_help: a common setting -> its help in this kind's ``--help`` (``--batch-size`` here).
        flags: ``--flag`` -> help: switches of its command that are not settings (fne's ``--rethreshold``).
        command_line: ``(settings, options given) -> {key: value}``: settings the command line implies
            beyond its options (``--min-boxes`` without ``--boxes``: adaptive counts); None: none.
        explain: ``(selector value) -> message | None``: why a value it knows of is not an extractor
            (``detectron2``: the way round it).
        queryable: whether new images can be featurized as its rows were (a query image).
    """

    name: str
    kind: str
    summary: str
    description: str
    config: type[ExtractorConfig]
    recipe: Callable[[Any], dict[str, Any]]
    build: Callable[[dict[str, Any]], Any]
    keys: tuple[str, ...] = ("global",)
    selector: str | None = None
    aliases: tuple[str, ...] = ()
    record: Callable[[Any, Any, dict[str, Any]], dict[str, Any]] = default_record
    check: Callable[[Any], None] = no_check
    finish: Callable[[Any, Any, Any], None] | None = None
    hints: Mapping[str, str] = field(default_factory=dict)
    option_help: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, str] = field(default_factory=dict)
    command_line: Callable[[Any, Collection[str]], dict[str, Any]] | None = None
    explain: Callable[[str], str | None] | None = None
    queryable: bool = True


#: mapper settings that change speed, not the stored numbers (left out of a store's config)
SPEED_KEYS = ("batch_size", "device", "threads", "allow_download")
#: name -> declaration, in registration order (the order of ``features --help``)
_EXTRACTORS: dict[str, Extractor] = {}


def register_extractor(extractor: Extractor) -> Extractor:
    """Add ``extractor`` (its name must be new; a field it shares with another extractor must have the same
    type and default there; a second extractor of a kind needs a selector); returns it."""
    if extractor.name in _EXTRACTORS and _EXTRACTORS[extractor.name] is not extractor:
        raise ValueError(f"extractor {extractor.name!r} is already registered")
    same_kind = [e for e in _EXTRACTORS.values() if e.kind == extractor.kind and e.name != extractor.name]
    if same_kind and (extractor.selector is None or any(e.selector != extractor.selector for e in same_kind)):
        raise ValueError(f"extractor {extractor.name!r}: the kind {extractor.kind!r} has several "
                         "extractors, so each names the same selector")
    for other in _EXTRACTORS.values():
        for key, info in extractor.config.model_fields.items():
            theirs = other.config.model_fields.get(key)
            if theirs is not None and (theirs.annotation, theirs.default) != (info.annotation, info.default):
                raise ValueError(f"extractor {extractor.name!r}: setting {key!r} differs from extractor "
                                 f"{other.name!r}'s (type {info.annotation}, default {info.default!r})")
    _EXTRACTORS[extractor.name] = extractor
    return extractor


def unregister_extractor(name: str) -> None:
    """Remove the extractor ``name`` (a plugin's, e.g. at the end of a test)."""
    _EXTRACTORS.pop(name, None)


def extractors() -> tuple[Extractor, ...]:
    """The registered extractors, in registration order (the built-in ones first)."""
    return tuple(_EXTRACTORS.values())


def kinds() -> tuple[str, ...]:
    """The kinds of the registered extractors (the ``features`` subcommands), in registration order."""
    return tuple(dict.fromkeys(e.kind for e in _EXTRACTORS.values()))


def extractors_of_kind(kind: str) -> tuple[Extractor, ...]:
    """The extractors of ``kind``, the default first (empty for an unknown kind)."""
    return tuple(e for e in _EXTRACTORS.values() if e.kind == kind)


def get_extractor(kind: str, choice: str | None = None, option: bool = True) -> Extractor:
    """The extractor of ``kind`` (a one-line :class:`UserError` for an unknown one); under a selector, the
    one ``choice`` names (its name or an alias; ``None``: the kind's default). ``option``: a bad ``choice``
    is named as the option (``--detector 'yolo'``), else as a recorded value (``unknown detector``)."""
    candidates = extractors_of_kind(kind)
    if not candidates:
        raise UserError(f"unknown feature kind {kind!r}: use one of {', '.join(kinds())}")
    if choice is None or candidates[0].selector is None:
        return candidates[0]
    for extractor in candidates:
        if choice == extractor.name or choice in extractor.aliases:
            return extractor
    for extractor in candidates:
        reason = extractor.explain(choice) if extractor.explain else None
        if reason:
            raise UserError(reason)
    selector = candidates[0].selector
    said = f"--{selector.replace('_', '-')} {choice!r}:" if option else f"unknown {selector} {choice!r}:"
    raise UserError(f"{said} use one of {', '.join(e.name for e in candidates)}")


def get_extractor_of(settings: Any) -> Extractor:
    """The extractor the stage's ``settings`` ask for (their ``kind``, and the selector's value)."""
    selector = next((e.selector for e in extractors_of_kind(settings.kind)), None)
    return get_extractor(settings.kind, getattr(settings, selector) if selector else None)


def get_extractor_of_config(config: Mapping[str, Any]) -> Extractor:
    """The extractor that made a store whose recorded ``config`` this is (a store written before the
    selector was recorded: the kind's default)."""
    kind = config.get("kind")
    selector = next((e.selector for e in extractors_of_kind(str(kind))), None)
    return get_extractor(str(kind), config.get(selector) if selector else None, option=False)
