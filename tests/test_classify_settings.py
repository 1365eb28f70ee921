"""``train classify``'s settings are composed from the families: an encoder's options are its family config's
fields (type, bounds, help), the options are generated from the settings, and a family that declares a
classifier encoder is offered by ``--encoder`` with its options, in the command and in ``pipelines.yaml``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field, ValidationError

from pipelines.schema import load_pipelines
from train.cli import build_parser
from train.cli import main as train_main
from train.engine.settings import ClassifySection, FamilyConfig
from train.models import family as family_registry
from train.models.chain import ChainConfig
from train.models.classifier import classify_settings, classify_settings_class, encoder_keys, encoder_spec
from train.models.family import ClassifierEncoder, Family, get_family
from train.models.registry import ModelSpec
from train.models.seam import SeamConfig


def _classify_help() -> str:
    commands, = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices["classify"].format_help()


def test_an_encoder_option_is_its_family_config_field() -> None:
    fields = classify_settings_class().model_fields
    for config, name in ((ChainConfig, "version"), (ChainConfig, "p"), (SeamConfig, "hops"),
                         (SeamConfig, "gru_units")):
        theirs = config.model_fields[name]
        assert (fields[name].annotation, fields[name].metadata) == (theirs.annotation, theirs.metadata)
        assert fields[name].description.endswith(theirs.description)
    # the classifier's own default where its declaration gives one (vse's word_dim is the --kind preset's)
    assert fields["word_dim"].default == get_family("vse").classifier.defaults["word_dim"] == 300
    assert encoder_keys()["gru_units"] == ("seam", "gru")
    with pytest.raises(ValidationError, match="greater than 0"):  # ChainConfig's bound, not a copy of it
        classify_settings(out="x", p=0)


def test_a_key_of_another_encoder_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="'arch' applies to encoder oecc, not 'chain'"):
        classify_settings(out="x", encoder="chain", arch="A")
    body = ("pipelines:\n  p:\n    description: d\n    prep: {dataset: synthetic, out: data}\n"
            "    classify: {%s}\n")
    (tmp_path / "ok.yaml").write_text(body % "encoder: seam, variant: G, gru_units: 64, out: run")
    section = load_pipelines(tmp_path / "ok.yaml")["p"].classify
    assert (section.encoder, section.variant, section.gru_units) == ("seam", "G", 64)
    (tmp_path / "bad.yaml").write_text(body % "encoder: gru, version: v2, out: run")
    with pytest.raises(Exception, match="'version' applies to encoder chain, not 'gru'"):
        load_pipelines(tmp_path / "bad.yaml")


def test_classification_fields_alone_are_no_settings() -> None:
    with pytest.raises(TypeError, match="classify_settings"):
        ClassifySection(out="x")


def test_every_setting_is_an_option_with_its_default() -> None:
    text = _classify_help()
    resolved = classify_settings(out="RUN_DIR")
    for name in classify_settings_class().model_fields:
        assert f"--{name.replace('_', '-')}" in text, name
    assert "(default 300)" in text and "(default 1014)" in text and resolved.word_dim == 300
    assert "gru (vse's)" in text and "seam/gru: GRU units of SEAM-G" in " ".join(text.split())


class WideConfig(FamilyConfig):
    """A family whose text encoder is CHAIN-VSE v1 of width ``q``."""

    q: float = Field(0.5, gt=0, description="width of the encoder (default 0.5)")


def _wide_spec(settings: Any) -> ModelSpec:
    return ModelSpec("chain_v1", {"p": settings.q}, text_input="chars")


@pytest.fixture
def wide_family(monkeypatch: pytest.MonkeyPatch) -> Family:
    """A family with a classifier encoder ``wide``, registered for the test (the registry restored after)."""
    for name in ("_FAMILIES", "_SETTINGS"):
        monkeypatch.setattr(family_registry, name, dict(getattr(family_registry, name)))
    family = Family("wide", "Wide: CHAIN-VSE of another width", WideConfig, _wide_spec,
                    classifier=ClassifierEncoder("wide", ("q",), defaults={"q": 0.25}))
    return family_registry.register_family(family)


def test_a_family_with_a_classifier_encoder_is_offered(wide_family: Family,
                                                       capsys: pytest.CaptureFixture) -> None:
    settings = classify_settings(out="x", encoder="wide")
    assert settings.q == 0.25 and encoder_spec(settings) == ModelSpec("chain_v1", {"p": 0.25},
                                                                      text_input="chars")
    assert "{chain,oecc,seam,gru,wide}" in _classify_help() and "--q Q" in _classify_help()
    sizes = []
    for q in ("0.25", "0.5"):
        capsys.readouterr()
        assert train_main(["classify", "--encoder", "wide", "--q", q, "--dry-run", "--vocab-size", "40",
                           "--classes", "3", "--device", "cpu"]) == 0
        sizes.append(capsys.readouterr().out)
    assert sizes[0] != sizes[1]  # the option reached the encoder
    with pytest.raises(ValidationError, match="'q' applies to encoder wide, not 'chain'"):
        classify_settings(out="x", q=1.0)


def test_two_families_cannot_share_a_classifier_name(wide_family: Family) -> None:
    from train.models.classifier import classifier_families

    family_registry.register_family(Family("wide2", "x", type("W2", (FamilyConfig,), {}), _wide_spec,
                                           classifier=ClassifierEncoder("wide", ())))
    with pytest.raises(ValueError, match="both declare the classifier encoder 'wide'"):
        classifier_families()

