"""One ``FeatureSpec`` parser and one mapper builder for extraction and query-time featurisation.

The query featuriser rebuilds a store's mapper from the store's recorded ``config``; these tests fail
when a mapper option reaches the extraction's mapper but not the one rebuilt from the store (for
``cnn``, ``fne`` and ``regions`` stores made with options other than the defaults). Random weights,
64-pixel inputs, a few real COCO images, one torch thread.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import make_image_dataset

import features.run
from features.cli import main
from features.extractors.recipe import SPEED_KEYS, ImageMapperFactory
from features.featurize import Featurizer
from features.store.core import FeatureStore
from features.store.read import parse_spec
from features.store.spec import FeatureSpec
from train.config.run import store_path
from train.engine.data import feature_spec
from vsecore.errors import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COMMON = ["--weights", "none", "--input-size", "64", "--block-size", "8", "--device", "cpu", "--no-progress",
          "--threads", "1"]
CROPS = ["--cnn", "efficientnet_lite0", "--crops", "1", "--resize", "72"]
EXTRACTIONS = {
    "cnn": ["cnn", *CROPS],
    "fne": ["fne", *CROPS, "--threshold-low", "-0.3", "--threshold-high", "0.2"],
    "regions": ["regions"],
}


def test_feature_spec_parse_and_text():
    assert FeatureSpec.parse("/a/s.zarr:fne_raw") == FeatureSpec(Path("/a/s.zarr"), "fne_raw")
    assert FeatureSpec.parse("/a/b:c.zarr") == FeatureSpec(Path("/a/b:c.zarr"), None)  # a colon in a name
    assert FeatureSpec.parse("/a/b:c.zarr:global").store == Path("/a/b:c.zarr")
    assert FeatureSpec.parse(":global") == FeatureSpec(Path(":global"), None)  # no store: not a key
    assert FeatureSpec.parse("s.zarr:other").key is None
    for text in ("s.zarr", "s.zarr:global", "s.zarr:fne", "s.zarr:fne_raw", "s.zarr:regions"):
        assert str(FeatureSpec.parse(text)) == text
        assert parse_spec(text) == (FeatureSpec.parse(text).store, FeatureSpec.parse(text).key)
    assert FeatureSpec.parse("s.zarr:regions").is_regions
    assert not FeatureSpec.parse("s.zarr").is_regions
    assert store_path("/a/s.zarr:fne") == "/a/s.zarr"


def test_one_default_key_rule():
    def has(*names: str):
        return lambda name: name in names

    bare = FeatureSpec.parse("s.zarr")
    assert bare.key_in(has("global", "fne/raw")) == "global"
    assert bare.key_in(has("fne/raw", "fne/ternary")) == "fne"
    assert bare.key_in(has("regions", "counts")) == "regions"
    assert bare.key_in(has()) == "global"
    assert FeatureSpec.parse("s.zarr:fne_raw").key_in(has("fne/ternary")) == "fne_raw"


def test_training_spec_check_uses_the_parser():
    assert feature_spec("f.zarr:regions", regions=True) == "f.zarr:regions"
    with pytest.raises(UserError):
        feature_spec("/x/b:regions.zarr", regions=True)  # a store named '...:regions.zarr', no key
    with pytest.raises(UserError):
        feature_spec("f.zarr:regions")


@pytest.fixture(scope="module")
def data(coco_sample, tmp_path_factory) -> Path:
    return make_image_dataset(tmp_path_factory.mktemp("prep"), coco_sample, 6)


def _without_speed(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in SPEED_KEYS}


@pytest.mark.parametrize("kind", list(EXTRACTIONS))
def test_query_mapper_is_the_extraction_mapper(kind, data, tmp_path, monkeypatch):
    built = []
    real = features.run.cached_mapper

    def recording(factory):
        mapper = real(factory)
        built.append((factory, mapper))
        return mapper

    monkeypatch.setattr(features.run, "cached_mapper", recording)
    out = tmp_path / f"{kind}.zarr"
    assert main([*EXTRACTIONS[kind], "--data", str(data), "--out", str(out), *COMMON]) == 0
    ((factory, mapper),) = built  # in-process: the driver's mapper is the one that computed
    extraction = factory.config
    recorded = FeatureStore(out).attrs["config"]
    query = ImageMapperFactory.from_store(recorded, device="cpu", batch_size=extraction["batch_size"],
                                          threads=extraction["threads"]).config
    # every option the extraction's mapper got, the mapper rebuilt from the store gets, with its value
    # (a size left to the network's default is recorded resolved)
    assert set(extraction) <= set(query), set(extraction) - set(query)
    assert {k: v for k, v in extraction.items() if v is not None} == {
        k: query[k] for k, v in extraction.items() if v is not None}
    # and the mappers themselves are equal (their config is what rebuilds an equal mapper)
    if kind == "regions":  # not queryable with images (Featurizer refuses it): the builder alone
        again = ImageMapperFactory.from_store(recorded).build()
    else:
        featurizer = Featurizer.from_store(f"{out}:{'global' if kind == 'cnn' else 'fne'}")
        assert featurizer.recipe == ImageMapperFactory.from_store(recorded)
        again = featurizer.mapper
    assert _without_speed(again.config) == _without_speed(mapper.config)
