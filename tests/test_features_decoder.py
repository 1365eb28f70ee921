"""Issue 44.1: ``--decoder torchvision`` (JPEGs decoded and resized where the network runs), checked on the
CPU (libjpeg-turbo through torchvision; on CUDA the same code calls nvjpeg).

Its pixels differ from PIL's, so a store records the decoder, refuses a resumption with another one in one
line, and a query image is read with the store's decoder. EXIF orientation is applied as PIL applies it,
unusable files fail as with PIL, and other formats go through PIL."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_image_dataset, paths_of
from PIL import Image

from features.cli import main
from features.extractors.decode import decode_jpegs, orient, read_encoded
from features.extractors.images import load_image
from features.featurize import Featurizer
from features.store.core import FeatureStore

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = ["--cnn", "efficientnet_lite0", "--weights", "none", "--crops", "10", "--input-size", "64",
        "--block-size", "4", "--device", "cpu", "--threads", "1", "--no-progress"]


def jpeg_with_orientation(path: Path, orientation: int) -> Path:
    """A 40 x 24 JPEG of a gradient with the EXIF orientation tag ``orientation``."""
    y, x = np.mgrid[0:24, 0:40]
    pixels = np.stack([x * 6, y * 10, (x + y) * 3], axis=-1).astype(np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(pixels).save(path, quality=95, exif=exif.tobytes())
    return path


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_as_pil_applies_it(tmp_path, orientation) -> None:
    """The device path's :func:`orient` (nvjpeg applies no EXIF) turns the decoded pixels exactly as
    torchvision's CPU decoder with ``apply_exif_orientation``, and into PIL's displayed size."""
    from torchvision.io import ImageReadMode, decode_jpeg

    path = jpeg_with_orientation(tmp_path / f"o{orientation}.jpg", orientation)
    encoded = read_encoded(path)
    (mine,) = decode_jpegs([encoded], torch.device("cpu"))
    theirs = decode_jpeg(encoded.data, mode=ImageReadMode.RGB, apply_exif_orientation=True)
    assert torch.equal(mine, theirs)
    pil = load_image(path)
    assert encoded.size == pil.size == (mine.shape[2], mine.shape[1])
    # the same libjpeg-turbo pixels
    assert torch.equal(mine, torch.from_numpy(np.array(pil)).permute(2, 0, 1))
    assert torch.equal(orient(theirs, 1), theirs)


@pytest.fixture(scope="module")
def data(coco_sample, tmp_path_factory) -> Path:
    """8 COCO images; row 2 is a truncated JPEG, row 5 a PNG."""
    root = tmp_path_factory.mktemp("decoder")
    images = sorted((coco_sample / "images").iterdir())
    (root / "cut.jpg").write_bytes(images[2].read_bytes()[:3000])
    Image.open(images[5]).save(root / "five.png")
    extra = {2: root / "cut.jpg", 5: root / "five.png"}
    return make_image_dataset(root / "prep", coco_sample, 8, extra=extra)


@pytest.fixture(scope="module")
def stores(data, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stores")
    out = {}
    for decoder in ("pil", "torchvision"):
        out[decoder] = root / f"{decoder}.zarr"
        args = ["cnn", "--data", str(data), "--out", str(out[decoder]), *BASE, "--decoder", decoder]
        assert main(args) == 0
    return out


def test_the_store_records_its_decoder_and_rows_differ_a_little(stores) -> None:
    pil, tv = FeatureStore(stores["pil"]), FeatureStore(stores["torchvision"])
    assert "decoder" not in pil.attrs["config"] and pil.attrs["provenance"]["decoder"] == "pil"
    assert tv.attrs["config"]["decoder"] == tv.attrs["provenance"]["decoder"] == "torchvision-cpu"
    for store in (pil, tv):
        failed = {f["imgid"]: f["reason"] for f in store.block_failures()}
        assert list(failed) == [2] and failed[2] == "truncated file"
    a, b = pil.array("global")[:], tv.array("global")[:]
    valid = pil.array("valid")[:]
    assert (valid == tv.array("valid")[:]).all()
    np.testing.assert_array_equal(a[5], b[5])  # the PNG goes through PIL with either decoder
    rel = np.linalg.norm(a[valid] - b[valid], axis=1) / np.linalg.norm(a[valid], axis=1)
    assert 0 < rel.max() < 0.05, rel


def test_a_store_never_mixes_decoders(data, stores, capsys) -> None:
    out = str(stores["torchvision"])
    capsys.readouterr()
    assert main(["cnn", "--data", str(data), "--out", out, *BASE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "made with decoder='torchvision-cpu', this run asks for decoder=None" in err[0]
    assert "a store never mixes JPEG decoders" in err[0]
    args = ["cnn", "--data", str(data), "--out", str(stores["pil"]), *BASE, "--decoder", "torchvision"]
    assert main(args) == 2
    assert "decoder=None, this run asks for decoder='torchvision-cpu'" in capsys.readouterr().err
    # the same decoder resumes (retrying the block of the truncated file, a failure that may be transient)
    before = FeatureStore(out).array("global")[:]
    assert main(["cnn", "--data", str(data), "--out", out, *BASE, "--decoder", "torchvision"]) == 0
    assert "wrote 4 rows, skipped 4 already done, 1 failed" in capsys.readouterr().out
    np.testing.assert_array_equal(FeatureStore(out).array("global")[:], before)


def test_a_query_image_is_read_with_the_stores_decoder(data, stores) -> None:
    featurizer = Featurizer.from_store(f"{stores['torchvision']}:global")
    paths = paths_of(data)
    rows, failures = featurizer([paths[k] for k in (0, 2, 5, 7)])
    assert [f["path"] for f in failures] == [paths[2]] and failures[0]["reason"] == "truncated file"
    np.testing.assert_array_equal(rows, FeatureStore(stores["torchvision"]).array("global")[[0, 5, 7]])


def test_torchvision_on_a_cluster_needs_a_named_device(data, tmp_path, capsys) -> None:
    base = [a if a != "cpu" else "auto" for a in BASE]
    assert main(["cnn", "--data", str(data), "--out", str(tmp_path / "s.zarr"), *base, "--decoder",
                 "torchvision", "--scheduler", "local"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--decoder torchvision on a Dask cluster needs --device cpu or cuda (the decoder's "
                        "pixels depend on the device, and a store never mixes decoders)")


def test_a_jpeg_the_device_decoder_refuses_goes_through_pil(tmp_path) -> None:
    """A CMYK JPEG (libjpeg-turbo through torchvision refuses it as RGB): PIL's pixels, not a failure."""
    from features.extractors.backbones import load_backbone
    from features.extractors.crop_mapper import ImageMapper

    path = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (64, 48), (10, 200, 30, 0)).save(path)
    buffer = io.BytesIO()
    Image.open(path).convert("RGB").save(buffer, "PNG")
    backbone = load_backbone("efficientnet_lite0", "none", input_size=32)
    tv = ImageMapper(backbone, crops=1, decoder="torchvision")
    pil = ImageMapper(backbone, crops=1)
    item = tv.load(str(path), resize=tv.resize)
    got = tv([item])
    assert "__failed__" not in got
    np.testing.assert_array_equal(got["global"], pil([load_image(path)])["global"])
