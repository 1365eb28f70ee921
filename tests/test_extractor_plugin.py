"""A new kind of extractor plugs in by adding a file: a toy extractor written into a temporary file, imported
by its path and registered, gets its ``features toy`` options from its settings, validates in
``pipelines.yaml``, extracts through the same stage as every extractor (its command and a pipeline), and
featurizes the query images of a run trained on its store (``train query --image``)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from features.cli import build_parser
from features.cli import main as features_main
from features.extractors import registry
from features.extractors.images import load_image
from features.settings import features_settings, features_settings_class
from features.store.core import FeatureStore
from features.store.read import read_matrix
from pipelines.schema import load_pipelines
from prep.dataset import PreparedDataset
from train.cli import main as train_main  # every train command, train pipeline too
from vsecore.errors import UserError

TOY_EXTRACTOR = '''
"""Toy: an image's feature is its colour histogram (``bins`` bins per channel, as fractions of its pixels)."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from features.extractors.registry import Extractor, ExtractorConfig


class ToyConfig(ExtractorConfig):
    """The toy's own settings."""

    bins: int = Field(4, ge=1, le=64, json_schema_extra={"metavar": "B"},
                      description="histogram bins per colour channel (default 4)")


class ColourHistogram:
    """Images -> ``{"global": (B, 3 * bins) float32}``: each channel's histogram, fractions of the pixels."""

    def __init__(self, bins: int) -> None:
        self.bins = bins
        self.outputs = {"global": 3 * bins}
        self.provenance = {"network": "colour histogram", "bins": bins, "weights_sha256": None}

    def __call__(self, images: list[Any]) -> dict[str, np.ndarray]:
        rows = []
        for image in images:
            levels = np.asarray(image.convert("RGB"), dtype=np.int64) * self.bins // 256
            counts = [np.bincount(levels[..., c].ravel(), minlength=self.bins) for c in range(3)]
            rows.append(np.concatenate(counts) / levels[..., 0].size)
        return {"global": np.asarray(rows, dtype=np.float32)}


def toy_recipe(settings: Any) -> dict[str, Any]:
    """What determines the rows: the number of bins."""
    return {"kind": settings.kind, "bins": settings.bins}


def build_toy(config: dict[str, Any]) -> ColourHistogram:
    """The histogram of a config (the recipe, or a store's record)."""
    return ColourHistogram(int(config["bins"]))


EXTRACTOR = Extractor(name="toy", kind="toy", summary="toy colour histograms -> 'global'",
                      description="A colour histogram per image, computed without a network.",
                      config=ToyConfig, recipe=toy_recipe, build=build_toy)
'''

PIPELINES = """
pipelines:
  toy-demo:
    description: the toy extractor through every stage
    prep: {{dataset: synthetic, out: data, num_images: 48, image_size: 32, languages: [en], seed: 0}}
    features: {{kind: toy, bins: {bins}, block_size: 16, out: toy.zarr}}
    train: {{family: chain, version: v1, p: 0.25, d: 32, epochs: 1, batch_size: 8, max_chars: 60, seed: 0,
            device: cpu, out: run}}
"""


@pytest.fixture
def toy_extractor(tmp_path: Path) -> ModuleType:
    """The toy extractor's file, imported by its path and registered; unregistered after the test."""
    path = tmp_path / "toy_extractor.py"
    path.write_text(TOY_EXTRACTOR)
    spec = importlib.util.spec_from_file_location("toy_extractor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registry.register_extractor(module.EXTRACTOR)
    yield module
    registry.unregister_extractor("toy")


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    action, = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_a_kind_of_extractor_in_a_file_of_its_own(toy_extractor: ModuleType, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    toy_help = _subcommands()["toy"].format_help()
    assert "--bins B" in toy_help and "histogram bins per colour channel (default 4)" in toy_help
    assert "--cnn" not in toy_help and "--scheduler" in toy_help  # its own settings and the stage's

    path = tmp_path / "pipelines.yaml"
    path.write_text(PIPELINES.format(bins=4))
    assert train_main(["pipeline", "toy-demo", "--pipelines", str(path), "--until", "features"]) == 0
    store = FeatureStore(tmp_path / "toy.zarr")
    assert (store.attrs["config"]["kind"], store.attrs["config"]["bins"]) == ("toy", 4)
    dataset = PreparedDataset.load(tmp_path / "data")
    x, valid = read_matrix(str(tmp_path / "toy.zarr"))
    images = [load_image(p) for p in dataset.image_paths()[:3]]
    np.testing.assert_array_equal(x[:3], toy_extractor.ColourHistogram(4)(images)["global"])
    assert valid.all() and x.shape == (48, 12)

    # the command, its options generated from the toy's settings
    out = tmp_path / "toy8.zarr"
    assert features_main(["toy", "--data", str(tmp_path / "data"), "--out", str(out), "--bins", "8",
                          "--no-progress", "-q"]) == 0
    assert read_matrix(str(out))[0].shape == (48, 24)
    capsys.readouterr()
    assert features_main(["toy", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "bad.zarr"),
                          "--bins", "0"]) == 2
    assert "--bins 0: " in capsys.readouterr().err

    # the whole pipeline: a run trained from the toy store (the features stage is up to date), then a query
    # image featurized as the store's rows were
    assert train_main(["pipeline", "toy-demo", "--pipelines", str(path)]) == 0
    assert "features: up to date" in capsys.readouterr().out
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["settings"]["features"] == f"{tmp_path / 'toy.zarr'}:global"
    image = str(dataset.image_paths()[0])
    assert train_main(["query", "--run", str(tmp_path / "run"), "--image", image, "--top", "3",
                       "--device", "cpu"]) == 0
    shown = capsys.readouterr().out
    assert f"query: {image}" in shown and len([line for line in shown.splitlines() if "imgid" in line]) == 3


def test_a_kind_of_extractor_of_its_own_in_pipelines_yaml(toy_extractor: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "pipelines.yaml"
    path.write_text(PIPELINES.format(bins=6))
    features = load_pipelines(path)["toy-demo"].features
    assert (features.kind, features.bins) == ("toy", 6)
    # a section records the toy's settings only when it is the toy's (the fingerprint of a pipeline's stage)
    assert features.model_dump()["bins"] == 6
    assert "bins" not in features_settings(kind="cnn", out="s.zarr").model_dump()
    path.write_text(PIPELINES.format(bins=6).replace("bins: 6", "binz: 6"))
    with pytest.raises(UserError, match=r"pipeline 'toy-demo': features.binz: unknown key$"):
        load_pipelines(path)
    path.write_text(PIPELINES.format(bins=100))
    with pytest.raises(UserError, match=r"pipeline 'toy-demo': features.bins"):
        load_pipelines(path)


def test_an_unregistered_kind_is_gone(toy_extractor: ModuleType) -> None:
    assert "toy" in _subcommands() and "bins" in features_settings_class().model_fields
    registry.unregister_extractor("toy")
    assert "toy" not in _subcommands() and "bins" not in features_settings_class().model_fields
    registry.register_extractor(toy_extractor.EXTRACTOR)  # as the fixture left it, for its own clean-up
