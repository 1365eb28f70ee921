"""The papers' 10 crops: positions, mirrors, resize, and the mapper against a crop-by-crop computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from PIL import Image

from features.extractors.backbones import load_backbone
from features.extractors.crop_mapper import ImageMapper
from features.extractors.crops import (
    image_crops,
    normalization_table,
    normalize_pixels,
    one_crop,
    pixel_crops,
    resize_shorter_side,
    resized_pixels,
    ten_crop,
)
from features.extractors.full_network import FullNetworkRecorder
from features.extractors.images import load_image


def test_ten_crop_positions_and_mirrors_by_slicing():
    img = torch.arange(3 * 7 * 9, dtype=torch.float32).view(3, 7, 9)
    s = 4
    out = ten_crop(img, s)
    assert out.shape == (10, 3, s, s)
    a = img.numpy()
    expected = [
        a[:, :s, :s], a[:, :s, 9 - s :], a[:, 7 - s :, :s], a[:, 7 - s :, 9 - s :],
        a[:, 2:6, 2:6],  # centre: round((7-4)/2) = 2, round((9-4)/2) = 2 (half rounds to even: 2.5 -> 2)
    ]
    expected += [e[:, :, ::-1] for e in expected]
    for k in range(10):
        assert np.array_equal(out[k].numpy(), expected[k]), k
    assert np.array_equal(one_crop(img, s)[0].numpy(), expected[4])


def test_ten_crop_against_torchvision():
    """Same five crops as torchvision; torchvision mirrors the image *before* cropping, so its mirrored
    crops are ours in the order TR, TL, BR, BL, centre (same set when the centre offset is even)."""
    img = torch.rand(3, 20, 34)
    ours = ten_crop(img, 16)
    theirs = torch.stack(TF.ten_crop(img, [16, 16]))
    assert torch.equal(ours[:5], theirs[:5])
    assert torch.equal(ours[[6, 5, 8, 7, 9]], theirs[5:])


def test_resize_shorter_side_and_tiny_images():
    assert resize_shorter_side(Image.new("RGB", (640, 480)), 256).size == (341, 256)
    assert resize_shorter_side(Image.new("RGB", (480, 640)), 256).size == (256, 341)
    assert resize_shorter_side(Image.new("RGB", (1, 1)), 256).size == (256, 256)
    crops = image_crops(Image.new("RGB", (1, 1), (255, 0, 0)), 256, 224, (0, 0, 0), (1, 1, 1), crops=10)
    assert crops.shape == (10, 3, 224, 224)
    assert torch.allclose(crops[:, 0], torch.ones(1)) and torch.allclose(crops[:, 1], torch.zeros(1))
    with pytest.raises(ValueError):
        ten_crop(torch.zeros(3, 10, 30), 16)


@pytest.mark.parametrize("mean, std", [((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                                       ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
                                       ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))])
def test_normalising_by_the_table_is_the_per_pixel_formula_bit_for_bit(mean, std):
    """The device's lookup gives exactly the float32 formula's values: every 8-bit level of every channel,
    and a real photo's crops, batched or not."""
    def formula(pixels: np.ndarray) -> torch.Tensor:  # (H, W, 3) uint8 -> (3, H, W), one value at a time
        scaled = torch.from_numpy(pixels.astype(np.float32) / np.float32(255.0)).permute(2, 0, 1)
        return (scaled - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)

    table = normalization_table(mean, std)
    levels = np.arange(256, dtype=np.uint8).repeat(3).reshape(16, 16, 3)
    got = normalize_pixels(torch.from_numpy(levels), table)
    assert got.dtype == torch.float32 and torch.equal(got, formula(levels))
    batch = torch.from_numpy(np.stack([levels, levels[::-1].copy()]))
    assert torch.equal(normalize_pixels(batch, table)[1], formula(levels[::-1].copy()))
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8))
    pixels = resized_pixels(photo, 256)
    assert pixels.dtype == torch.uint8 and min(pixels.shape[:2]) == 256
    crops = pixel_crops(pixels, table, 224, 10)
    assert torch.equal(crops, ten_crop(formula(pixels.numpy()), 224))
    assert torch.equal(crops, image_crops(photo, 256, 224, mean, std, 10))


def _crop_by_crop(backbone, pil: Image.Image, fne: bool) -> np.ndarray:
    """Independent reference: PIL resize, PIL crop boxes, PIL mirror, one forward pass per crop, mean."""
    w, h = pil.size
    r, s = backbone.resize, backbone.input_size
    size = (r, int(r * h / w)) if w <= h else (int(r * w / h), r)
    bicubic = backbone.interpolation == "bicubic"
    resized = pil.resize(size, Image.Resampling.BICUBIC if bicubic else Image.Resampling.BILINEAR)
    W, H = resized.size
    centre = (int(round((W - s) / 2)), int(round((H - s) / 2)))
    boxes = [(0, 0), (W - s, 0), (0, H - s), (W - s, H - s), centre]
    crops = [resized.crop((x, y, x + s, y + s)) for x, y in boxes]
    crops += [c.transpose(Image.Transpose.FLIP_LEFT_RIGHT) for c in crops]
    feats = []
    mean, std = np.array(backbone.mean, np.float32), np.array(backbone.std, np.float32)
    for crop in crops:
        x = (np.asarray(crop, np.float32) / 255.0 - mean) / std
        x = torch.from_numpy(x).permute(2, 0, 1)[None].contiguous()
        with torch.inference_mode():
            if fne:
                with FullNetworkRecorder(backbone.model) as rec:
                    backbone.model(x)
                    y, _ = rec.take()
            else:
                y = backbone.model(x)
        feats.append(y[0].numpy())
    return np.mean(feats, axis=0)


@pytest.fixture(scope="module")
def lite0():
    return load_backbone("efficientnet_lite0", "imagenet")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["global", "fne"])
def test_mapper_ten_crops_equal_crop_by_crop(coco_sample, lite0, kind):
    """Real ImageNet EfficientNet-Lite0 on a real COCO image: the mapper's 10-crop average equals ten
    separate PIL-cropped forward passes averaged (global pooled features, and every FNE activation)."""
    backbone = lite0
    pil = load_image(sorted((coco_sample / "images").glob("*.jpg"))[1])
    mapper = ImageMapper(backbone, kind=kind, crops=10, batch_size=10, device="cpu")
    (name, width), = mapper.outputs.items()
    got = mapper([pil])[name]
    assert got.shape == (1, width) and got.dtype == np.float32
    ref = _crop_by_crop(backbone, pil, fne=kind == "fne")
    np.testing.assert_allclose(got[0], ref, rtol=1e-4, atol=1e-5)
    if kind == "global":
        # the average is not the centre crop's features: the corners and mirrors count
        centre_only = ImageMapper(backbone, kind=kind, crops=1, batch_size=1)([pil])[name]
        assert not np.allclose(centre_only, got, atol=1e-3)


def test_images_prepared_in_the_decode_threads_give_the_same_rows_and_another_recipe_is_refused(tmp_path):
    """The extraction's decode threads call ``mapper.prepare`` (the resize); the mapper then only drives the
    network: the same rows, boxes and sizes as from the PIL images, for the crop and the grid mappers."""
    from features.executors.extract import BlockTask, read_block
    from features.extractors.grid_mapper import GridRegionMapper

    rng = np.random.default_rng(5)
    paths = []
    for k, size in enumerate([(120, 90), (90, 140)]):
        paths.append(str(tmp_path / f"{k}.png"))
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(paths[-1])
    images = [load_image(p) for p in paths]
    backbone = load_backbone("efficientnet_lite0", "none", input_size=64, resize=72)
    crops = ImageMapper(backbone, kind="global", crops=10, batch_size=20)
    grid = GridRegionMapper(load_backbone("efficientnet_lite0", "none", input_size=64))
    for mapper in (crops, grid):
        block = read_block(BlockTask(str(tmp_path / "s.zarr"), 0, 0, tuple(paths)), prepare=mapper.prepare)
        assert [item.size for item in block.images] == [img.size for img in images]
        by_threads, by_mapper = mapper(block.images), mapper(images)
        assert by_threads.keys() == by_mapper.keys()
        assert all(np.array_equal(by_threads[k], by_mapper[k]) for k in by_mapper)
    with pytest.raises(ValueError, match="prepared as"):
        grid([crops.prepare(images[0])])
