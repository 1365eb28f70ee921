"""A new family plugs in by adding a file: a toy family written into a temporary file, imported by its path
and registered, gets its ``train toy`` options from its config, validates in ``pipelines.yaml``, trains
through the same function as every family and is evaluated from its run directory."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from helpers import make_prepared, make_store

from train.cli import main as train_main
from train.models import family as family_registry
from train.models import registry as encoder_registry
from vsecore.errors import UserError

TOY_FAMILY = '''
"""Toy: a caption is the mean of its character embeddings."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import nn

from train.models.family import Family
from train.models.registry import ModelSpec, TextEncoder, register_text_encoder
from train.engine.settings import FamilyConfig


class MeanOfCharacters(TextEncoder):
    """``chars (B, T) long, lengths (B,) long -> (B, char_dim)``: the mean of the real positions'
    embeddings."""

    def __init__(self, alphabet_size: int, char_dim: int = 16) -> None:
        super().__init__()
        self.embedding = nn.Embedding(alphabet_size, char_dim, padding_idx=0)
        self.output_dim = char_dim

    def forward(self, chars: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        mask = torch.arange(chars.shape[1], device=chars.device)[None, :] < lengths[:, None]
        summed = (self.embedding(chars) * mask[..., None]).sum(dim=1)
        return summed / lengths.clamp_min(1)[:, None].to(summed.dtype)


@register_text_encoder("toy_mean_of_characters")
def toy_mean_of_characters(alphabet_size: int, char_dim: int = 16) -> MeanOfCharacters:
    """The toy encoder."""
    return MeanOfCharacters(alphabet_size, char_dim)


class ToyConfig(FamilyConfig):
    """The toy family's own settings."""

    char_dim: int = Field(16, ge=1, description="size of the character embeddings (default 16)")


def toy_spec(settings: Any) -> ModelSpec:
    """Characters in, ``W_t`` mean-of-characters and ``W_i x``, cosine space (no ``|.|``)."""
    return ModelSpec("toy_mean_of_characters", {"char_dim": settings.char_dim}, text_input="chars",
                     absolute=False)


def toy_defaults(settings: Any, dataset_name: str | None) -> dict[str, Any]:
    """The toy's paper: cosine, margin 0.2."""
    return {"measure": "cosine", "margin": 0.2}


FAMILY = Family("toy", "Toy: mean of character embeddings", ToyConfig, toy_spec, defaults=toy_defaults)
'''


@pytest.fixture
def toy_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The toy family's file, imported by its path and registered; the registries are restored after."""
    for module, name in ((encoder_registry, "_TEXT_ENCODERS"), (family_registry, "_FAMILIES"),
                         (family_registry, "_SETTINGS")):
        monkeypatch.setattr(module, name, dict(getattr(module, name)))
    path = tmp_path / "toy_family.py"
    path.write_text(TOY_FAMILY)
    spec = importlib.util.spec_from_file_location("toy_family", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    family_registry.register_family(module.FAMILY)
    return module


def test_a_family_in_a_file_of_its_own_trains_and_evaluates(toy_family: ModuleType, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    from train.cli import build_parser

    commands, = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    toy_help = commands.choices["toy"].format_help()
    assert "--char-dim CHAR_DIM" in toy_help and "(default 16)" in toy_help
    assert "(default cosine)" in toy_help  # the family's own default, as --help shows it

    prepared = make_prepared(tmp_path / "data", n_train=12, n_val=4, n_test=4)
    store = make_store(tmp_path / "f.zarr", prepared)
    out = tmp_path / "run"
    assert train_main(["toy", "--data", str(prepared), "--features", f"{store}:global", "--out", str(out),
                       "--char-dim", "8", "--d", "16", "--epochs", "2", "--batch-size", "4",
                       "--device", "cpu", "-q"]) == 0
    config = json.loads((out / "config.json").read_text())
    settings = config["settings"]
    assert (settings["family"], settings["char_dim"], settings["measure"], settings["margin"]) == \
        ("toy", 8, "cosine", 0.2)
    assert config["parameters"]["text_encoder"] == config["vocab_size"] * 8
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "eval" / "test.json").read_text())["images"] == 4

    capsys.readouterr()
    assert train_main(["evaluate", "--run", str(out), "--device", "cpu"]) == 0  # rebuilt from the run
    assert "rsum" in capsys.readouterr().out


def test_a_family_of_its_own_in_pipelines_yaml(toy_family: ModuleType, tmp_path: Path) -> None:
    from pipelines.schema import load_pipelines

    body = ("pipelines:\n  p:\n    description: d\n    prep: {dataset: synthetic, out: data}\n"
            "    train: {%s}\n")
    (tmp_path / "ok.yaml").write_text(body % "family: toy, char_dim: 4, out: run")
    train = load_pipelines(tmp_path / "ok.yaml")["p"].train
    assert (train.family, train.char_dim) == ("toy", 4)
    (tmp_path / "typo.yaml").write_text(body % "family: toy, char_dims: 4, out: run")
    with pytest.raises(UserError, match=r"pipeline 'p': train.char_dims: unknown key$"):
        load_pipelines(tmp_path / "typo.yaml")
    (tmp_path / "other.yaml").write_text(body % "family: chain, char_dim: 4, out: run")
    with pytest.raises(UserError, match="'char_dim' applies to family toy, not 'chain'"):
        load_pipelines(tmp_path / "other.yaml")
