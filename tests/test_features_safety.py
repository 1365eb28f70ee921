"""Faults a feature store must survive (issues 16 and 22): images that cost too much, thresholds that are
not numbers, planted lock files, damaged stores given to training, images folders that vanish, readers
racing a rewrite, signals, read-only stores.

Real COCO images of ``coco_sample``; ``features cnn`` with EfficientNet-Lite0, random weights, 64 px.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from test_features_cli import BASE
from test_features_store import make_prepared

from features.cli import main
from features.images import ImageError, load_image
from features.store import FeatureStore, read_matrix

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("features: error:") and "\n" not in err, err
    return err


@pytest.fixture(scope="module")
def data(coco_sample, tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("prep") / "a", coco_sample, 8)


def cnn(data: Path, out: Path, *extra: str) -> int:
    return main(["cnn", "--data", str(data), "--out", str(out), *BASE, "--block-size", "2", *extra])


# -- issue 16 item 1: one image kills extraction -------------------------------------------------------
def strip_png(path: Path, width: int = 20000, height: int = 2) -> Path:
    Image.new("RGB", (width, height), (200, 10, 10)).save(path)
    return path


def test_pixel_strip_is_refused_from_its_header(tmp_path):
    strip = strip_png(tmp_path / "strip.png")
    assert strip.stat().st_size < 1000
    with pytest.raises(ImageError, match="aspect ratio 20000x2 is 10000:1"):
        load_image(strip)
    wide = strip_png(tmp_path / "wide.png", 3000, 100)  # 30:1 passes the aspect bound ...
    assert load_image(wide).size == (3000, 100)
    with pytest.raises(ImageError, match="would have .* pixels"):  # ... not a large resize of it
        load_image(wide, resize=1024)


def test_strip_is_recorded_invalid_and_input_size_is_bounded(coco_sample, tmp_path, capsys):
    strip = strip_png(tmp_path / "strip.png", 6000, 2)
    data = make_prepared(tmp_path / "prep", coco_sample, 4, extra={3: strip})
    out = tmp_path / "s.zarr"
    assert cnn(data, out) == 0
    assert "failed imgid 3" in capsys.readouterr().out
    x, valid = read_matrix(str(out))
    assert valid.tolist() == [True, True, True, False]
    assert "aspect ratio" in FeatureStore(out).attrs["failures"][0]["reason"]
    for size in ("0", "100000"):
        assert main(["cnn", "--data", str(data), "--out", str(tmp_path / "x.zarr"), *BASE,
                     "--input-size", size]) == 2
        assert f"--input-size {size}: must be between" in one_line_error(capsys)
    assert not (tmp_path / "x.zarr").exists()


def test_query_featurizer_refuses_the_strip_in_one_line(data, tmp_path):
    from features.featurize import StoreFeaturizer

    out = tmp_path / "q.zarr"
    assert cnn(data, out) == 0
    rows, failures = StoreFeaturizer(str(out))([strip_png(tmp_path / "strip.png")])
    assert rows.shape[0] == 0 and "aspect ratio" in failures[0]["reason"]
