"""Model families: what ``train <family>`` trains, declared in one :class:`Family` object per family file.

A family file (``train/models/chain.py``, ..., or a file of one's own) holds one ``Family``: its name and
one-line summary, its settings (a pydantic :class:`~train.engine.settings.FamilyConfig` submodel: fields
with defaults, help text and validators), its own defaults (a paper's settings, presets that depend on the
dataset), how it builds its :class:`~train.models.spec.ModelSpec`, and its objective. A built-in family's
file imports no torch: its networks are a module of their own, named after the paper's model
(``chain_vse``, ``ctt``, ``self_attention``, ``uvs``, ``language_agnostic``), which its ``spec`` imports
when a model is built, so ``train --help`` and ``pipelines.yaml`` read the declarations alone (a plugin's
one file may hold both). Everything else is derived here: the family's settings class (``TrainSection`` +
its submodel), its command-line options (:mod:`train.cli.fit_options`), the ``train:`` section of
``pipelines.yaml`` (:mod:`train.config.sections`).

:func:`register_family` adds a family; ``train/models/__init__.py`` imports every built-in family file
and registers its ``FAMILY`` explicitly. A family of one's own is one file: import it and pass its
``Family`` to :func:`register_family` (``docs/ARCHITECTURE.md``, "How to add a family").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import create_model, model_validator

from train.engine.settings import FamilyConfig, TrainSection
from train.models.spec import ModelSpec

if TYPE_CHECKING:
    from train.engine.objectives import Objective


def contrastive_objective(settings: Any) -> Objective:
    """Every family's default objective: the contrastive loss of its ``measure``, ``margin`` and ``loss``
    (+ the text encoder's penalty, if any)."""
    from train.engine.objectives import ContrastiveObjective  # start-up: torch only when a run trains

    return ContrastiveObjective(settings.measure, settings.margin, settings.loss, settings.order_sqrt)


def no_defaults(settings: Any, dataset_name: str | None) -> dict[str, Any]:
    """A family whose defaults are the schema's."""
    return {}


def no_spec_settings(settings: Any) -> dict[str, Any]:
    """A classifier encoder whose family spec reads only its options."""
    return {}


@dataclass(frozen=True)
class ClassifierEncoder:
    """A family's text encoder as ``train classify --encoder NAME`` builds it alone, before a softmax
    layer (CHAIN-VSE section 5). The classifier's settings are composed from these declarations
    (:mod:`train.models.classifier`).

    Attributes:
        name: the ``--encoder`` value.
        options: the settings the encoder reads: fields of this family's config, or of another classifier
            encoder's family config (vse's GRU takes seam's ``gru_units``); their type, bounds and help are
            that config's.
        defaults: the classifier's defaults where they differ from the field's (a text-classification
            setting, not retrieval's).
        spec_settings: ``(classify settings) -> {key: value}``: the retrieval settings the family's
            :attr:`Family.spec` reads that a classifier sets its own way (vse: the GRU's units ``d`` from
            ``gru_units``, no ``|.|``).
    """

    name: str
    options: tuple[str, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    spec_settings: Callable[[Any], dict[str, Any]] = no_spec_settings


@dataclass(frozen=True)
class Family:
    """One model family, declared beside its model.

    Attributes:
        name: the subcommand (``train <name>``) and the ``family`` of its settings.
        summary: one line for ``train --help`` and the start of ``train <name> --help``.
        config: the family's own settings; ``TrainSection`` + it is the family's settings class.
        spec: ``(settings) -> ModelSpec``: the registered encoders and the joint-space maps it builds.
        defaults: ``(settings, dataset_name) -> {key: value}``, the family's defaults for keys not set
            explicitly (a paper's settings; presets by dataset, ``dataset_name`` being the prepared
            dataset's ``dataset`` field, or ``None`` without data).
        objective: ``(settings) -> Objective``, the loss the trainer minimises.
        data_defaults: ``(settings, dataset) -> {key: value}``, settings computed from the prepared dataset
            (a :class:`prep.dataset.PreparedDataset`) when a run starts, recorded in its ``config.json``:
            only the keys the rule resolves (liwe: ``word_length`` from the train split's words when not
            given); ``None``: the family has none.
        common_options: common fields (of ``TrainSection``) offered in this family's own option group
            (seam and vse: ``max_words``, ``min_word_count``).
        help_notes: option -> what its "(default ...)" in ``--help`` adds (a preset that depends on data).
        classifier: its text encoder as ``train classify`` builds it alone; ``None``: not offered.
    """

    name: str
    summary: str
    config: type[FamilyConfig]
    spec: Callable[[Any], ModelSpec]
    defaults: Callable[[Any, str | None], dict[str, Any]] = no_defaults
    objective: Callable[[Any], Objective] = contrastive_objective
    data_defaults: Callable[[Any, Any], dict[str, Any]] | None = None
    common_options: tuple[str, ...] = ()
    help_notes: Mapping[str, str] = field(default_factory=dict)
    classifier: ClassifierEncoder | None = None


#: name -> declaration, in registration order (the order of ``train --help``)
_FAMILIES: dict[str, Family] = {}
#: name -> settings class (TrainSection + the family's config)
_SETTINGS: dict[str, type[TrainSection]] = {}


def register_family(family: Family) -> Family:
    """Add ``family`` (its name must be new, and its fields must not redefine a common one); returns it."""
    if family.name in _FAMILIES and _FAMILIES[family.name] is not family:
        raise ValueError(f"family {family.name!r} is already registered")
    clash = set(family.config.model_fields) & set(TrainSection.model_fields)
    if clash:
        raise ValueError(f"family {family.name!r} redefines the common setting(s) {', '.join(sorted(clash))}")
    _FAMILIES[family.name] = family
    _SETTINGS[family.name] = create_model(
        f"{family.config.__name__.removesuffix('Config')}Settings", __base__=(family.config, TrainSection),
        __module__=family.config.__module__, family=(Literal[family.name], ...),
        __validators__={"_keys_of_other_families": model_validator(mode="before")(_keys_of_other_families)})
    return family


def _keys_of_other_families(cls: type[TrainSection], data: Any) -> Any:
    """A key of another family's settings is named as such, not as an unknown key."""
    if isinstance(data, Mapping):
        for key in data:
            owners = families_with_key(str(key))
            if key not in cls.model_fields and owners:
                raise ValueError(f"'{key}' applies to family {'/'.join(owners)}, not '{data.get('family')}'")
    return data


def family_names() -> tuple[str, ...]:
    """The registered families, in registration order (the built-in ones first)."""
    return tuple(_FAMILIES)


def get_family(name: str) -> Family:
    """The declaration of family ``name`` (a ``KeyError`` listing the registered ones)."""
    if name not in _FAMILIES:
        raise KeyError(f"no model is registered for family {name!r} (available: {', '.join(_FAMILIES)})")
    return _FAMILIES[name]


def families_with_key(key: str) -> tuple[str, ...]:
    """The families whose own settings have ``key`` (empty for a common key or an unknown one)."""
    return tuple(name for name, fam in _FAMILIES.items() if key in fam.config.model_fields)


def settings_class(name: str) -> type[TrainSection]:
    """The settings class of family ``name``: ``TrainSection`` + its config, ``family: Literal[name]``."""
    get_family(name)
    return _SETTINGS[name]


def train_settings(**values: Any) -> TrainSection:
    """Validate ``values`` as the settings of ``values["family"]`` (a pydantic ``ValidationError``, a
    ``ValueError``, for a bad or missing family: its allowed values are the registered families)."""
    name = values.get("family")
    if name not in _FAMILIES:
        create_model("TrainSection", family=(Literal[family_names()], ...)).model_validate(values)
    return settings_class(name).model_validate(values)


def with_family_defaults(settings: Any, dataset_name: str | None = None) -> Any:
    """``settings`` with its family's defaults for every key not set explicitly.

    ``dataset_name`` is the prepared dataset's ``dataset`` field (``coco``, ``f8k``, ...), or ``None``
    without data. Keys set explicitly (command line, pipeline, a resumed run's config) always win.
    The result has every defaulted key marked as set, so a run's ``config.json`` records it.
    """
    rule = get_family(settings.family).defaults
    defaults = {k: v for k, v in rule(settings, dataset_name).items() if k not in settings.model_fields_set}
    return _with_values(settings, defaults)


def _with_values(settings: Any, values: dict[str, Any]) -> Any:
    """``settings`` validated again with ``values`` set explicitly (``settings`` itself without any)."""
    if not values:
        return settings
    given = settings.model_dump(include=settings.model_fields_set)
    return type(settings).model_validate({**given, **values})


def with_data_defaults(settings: Any, dataset: Any) -> Any:
    """``settings`` with the settings its family computes from the prepared ``dataset``
    (:attr:`Family.data_defaults`), each marked as set so that a run's ``config.json`` records it."""
    rule = get_family(settings.family).data_defaults
    resolved = rule(settings, dataset) if rule is not None else {}
    return _with_values(settings, resolved)


def model_spec(settings: Any) -> ModelSpec:
    """The :class:`ModelSpec` of ``settings.family`` (any object with the family's fields)."""
    return get_family(settings.family).spec(settings)


def build_objective(settings: Any) -> Objective:
    """The objective the family of ``settings`` trains with (:attr:`Family.objective`)."""
    return get_family(settings.family).objective(settings)
