"""The settings of ``train classify``: classification's own fields (:class:`ClassifySection`) + the options of
every registered classifier encoder, composed from the families' declarations.

A family offers its text encoder to the classifier with :attr:`Family.classifier`
(:class:`~train.models.family.ClassifierEncoder`): its ``--encoder`` name and the settings it reads. Those
settings are the family config's own fields (type, bounds, help), so ``train classify --version`` is the
field ``train chain --version`` is, with the classifier's defaults where the declaration gives its own;
``encoder`` is narrowed to the registered names, and a key of another encoder is an error that names it.
The composed class is built from the registry when first asked for (a family registered later is in the
next one).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal

from pydantic import Field, create_model, model_validator
from pydantic.fields import FieldInfo

from train.engine.settings import ClassifySection, FamilyConfig
from train.models.family import Family, family_names, get_family, model_spec
from train.models.spec import ModelSpec

#: the vocabulary the paper gives its word-level peers on DBPedia and Tweets (section 5): a word encoder's
#: ``--dry-run`` without data (``train classify --help`` shows it, so it is declared here, without torch)
PAPER_WORD_VOCABULARY = 200_000
#: the composed class of each set of registered classifier encoders (the registry's, in order)
_CLASSES: dict[tuple[tuple[str, int], ...], tuple[tuple[Family, ...], type[ClassifySection]]] = {}


def classifier_families() -> dict[str, Family]:
    """``--encoder`` name -> the family whose text encoder it is, in registration order."""
    found: dict[str, Family] = {}
    for name in family_names():
        family = get_family(name)
        if family.classifier is None:
            continue
        if family.classifier.name in found:
            raise ValueError(f"families {found[family.classifier.name].name!r} and {name!r} both declare the "
                             f"classifier encoder {family.classifier.name!r}")
        found[family.classifier.name] = family
    return found


def encoder_keys() -> dict[str, tuple[str, ...]]:
    """Each encoder option -> the ``--encoder`` names that read it (``gru_units``: seam and gru)."""
    keys: dict[str, tuple[str, ...]] = {}
    for encoder, family in classifier_families().items():
        for option in family.classifier.options:  # type: ignore[union-attr]
            keys[option] = (*keys.get(option, ()), encoder)
    return keys


def _option_field(option: str, owner: Family, families: dict[str, Family]) -> tuple[type, FieldInfo]:
    """The field ``option`` of ``owner``'s config, else of another classifier family's config."""
    configs: list[type[FamilyConfig]] = [owner.config, *(f.config for f in families.values())]
    for config in configs:
        if option in config.model_fields:
            info = config.model_fields[option]
            return info.annotation, info  # type: ignore[return-value]
    name = owner.classifier.name if owner.classifier else owner.name
    raise ValueError(f"classifier encoder {name!r} reads {option!r}, a field of no classifier family's "
                     "config")


def _composed_fields() -> dict[str, Any]:
    families = classifier_families()
    keys = encoder_keys()
    fields: dict[str, Any] = {}
    defaults: dict[str, tuple[str, Any]] = {}
    for encoder, family in families.items():
        declared = family.classifier
        assert declared is not None
        for option in declared.options:
            if option in ClassifySection.model_fields:
                raise ValueError(f"classifier encoder {encoder!r} redefines classification's setting "
                                 f"{option!r}")
            if option in declared.defaults:
                seen = defaults.setdefault(option, (encoder, declared.defaults[option]))
                if seen[1] != declared.defaults[option]:
                    raise ValueError(f"classifier encoders {seen[0]!r} and {encoder!r} give {option!r} two "
                                     "defaults")
            if option in fields:
                continue
            annotation, info = _option_field(option, family, families)
            fields[option] = (annotation, FieldInfo.merge_field_infos(
                info, description=f"{'/'.join(keys[option])}: {info.description or ''}"))
    for option, (_, value) in defaults.items():
        annotation, info = fields[option]
        fields[option] = (annotation, FieldInfo.merge_field_infos(info, default=value))
    names = tuple(families)
    if not names:
        raise ValueError("no registered family declares a classifier encoder")
    base = ClassifySection.model_fields["encoder"]
    spelled = ", ".join(n if n == families[n].name else f"{n} ({families[n].name}'s)" for n in names)
    fields["encoder"] = (Literal[names], Field(names[0], description=f"{base.description}: {spelled}"))
    return fields


def _other_encoders_keys(self: ClassifySection) -> ClassifySection:
    """A key given for another encoder is named as such (``'arch' applies to encoder oecc, not 'chain'``)."""
    for key, encoders in encoder_keys().items():
        if key in self.model_fields_set and self.encoder not in encoders:
            raise ValueError(f"'{key}' applies to encoder {'/'.join(encoders)}, not '{self.encoder}'")
    return self


def classify_settings_class() -> type[ClassifySection]:
    """:class:`ClassifySection` + the options of every registered classifier encoder (built once per set of
    registered encoders)."""
    families = classifier_families()
    key = tuple((name, id(family.classifier)) for name, family in families.items())
    if key not in _CLASSES:  # the families are kept with their class, so that their ids stay theirs
        _CLASSES[key] = (tuple(families.values()), create_model(
            "ClassifySettings", __base__=ClassifySection, __module__=__name__, **_composed_fields(),
            __validators__={"_other_encoders_keys": model_validator(mode="after")(_other_encoders_keys)}))
    return _CLASSES[key][1]


def classify_settings(**values: Any) -> ClassifySection:
    """Validate ``values`` as ``train classify``'s settings (a pydantic ``ValidationError`` when invalid)."""
    return classify_settings_class().model_validate(values)


def encoder_family(settings: ClassifySection) -> Family:
    """The family whose text encoder ``settings.encoder`` is."""
    return classifier_families()[settings.encoder]


def encoder_spec(settings: ClassifySection) -> ModelSpec:
    """The :class:`ModelSpec` the encoder's family builds from the classifier's settings (its registered text
    encoder and kwargs; the image side is unused)."""
    family = encoder_family(settings)
    declared = family.classifier
    assert declared is not None
    view = SimpleNamespace(**settings.model_dump(), **declared.spec_settings(settings))
    view.family = family.name
    return model_spec(view)
