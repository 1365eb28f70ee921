"""Robust image loading: every awkward file a photo collection holds, made inside the test."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from features.extractors.images import ImageError, load_image, to_rgb


def _save(img: Image.Image, path: Path, **kw) -> Path:
    img.save(path, **kw)
    return path


def test_grayscale_png_becomes_rgb_with_equal_channels(tmp_path):
    arr = np.tile(np.arange(0, 256, 16, dtype=np.uint8), (8, 1))
    path = _save(Image.fromarray(arr), tmp_path / "gray.png")
    out = load_image(path)
    assert out.mode == "RGB" and out.size == (16, 8)
    rgb = np.asarray(out)
    for channel in range(3):
        assert np.array_equal(rgb[..., channel], arr)


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_16_bit_grayscale_is_scaled_not_clipped(tmp_path, suffix):
    values = np.array([[0, 1000, 32768, 65535]], dtype=np.uint16)
    img = Image.fromarray(values)  # mode I;16
    assert img.mode.startswith("I;16")
    out = np.asarray(load_image(_save(img, tmp_path / f"deep{suffix}")))
    assert out.dtype == np.uint8
    expected = np.rint(values.astype(np.float64) * 255 / 65535).astype(np.uint8)  # 0, 4, 128, 255
    assert np.array_equal(out[..., 0], expected)
    assert out[0, 1, 0] == 4  # clipping would have given 255


def test_32_bit_integer_mode_scales_like_16_bit():
    img = Image.new("I", (3, 1))
    img.putpixel((1, 0), 65535)
    img.putpixel((2, 0), 1000)
    assert np.asarray(to_rgb(img))[0, :, 0].tolist() == [0, 255, 4]
    small = Image.new("I", (2, 1))
    small.putpixel((1, 0), 200)  # 8-bit values in a 32-bit container stay as they are
    assert np.asarray(to_rgb(small))[0, :, 0].tolist() == [0, 200]


def test_cmyk_jpeg_converts_to_rgb(tmp_path):
    img = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # no cyan, full magenta + yellow: red
    out = np.asarray(load_image(_save(img, tmp_path / "cmyk.jpg", quality=95)))
    r, g, b = out[4, 4].astype(int)
    assert r > 200 and g < 60 and b < 60


def test_rgba_is_composited_on_white(tmp_path):
    img = Image.new("RGBA", (2, 1))
    img.putpixel((0, 0), (255, 0, 0, 255))
    img.putpixel((1, 0), (0, 0, 0, 0))  # transparent black must not show as black
    out = np.asarray(load_image(_save(img, tmp_path / "rgba.png")))
    assert out[0, 0].tolist() == [255, 0, 0]
    assert out[0, 1].tolist() == [255, 255, 255]


def test_la_and_palette_with_transparency(tmp_path):
    la = Image.new("LA", (2, 1))
    la.putpixel((0, 0), (10, 255))
    la.putpixel((1, 0), (0, 0))
    out = np.asarray(load_image(_save(la, tmp_path / "la.png")))
    assert out[0].tolist() == [[10, 10, 10], [255, 255, 255]]

    pal = Image.new("P", (2, 1))
    pal.putpalette([0, 0, 255] + [0, 255, 0] + [0, 0, 0] * 254)
    pal.putpixel((0, 0), 0)
    pal.putpixel((1, 0), 1)
    path = _save(pal, tmp_path / "pal.png", transparency=1)
    assert np.asarray(load_image(path))[0].tolist() == [[0, 0, 255], [255, 255, 255]]
    # the same palette without transparency keeps its colours
    plain = np.asarray(load_image(_save(pal, tmp_path / "pal.gif")))
    assert plain[0].tolist() == [[0, 0, 255], [0, 255, 0]]


def test_exif_orientation_is_applied(tmp_path):
    img = Image.new("RGB", (4, 2), (0, 0, 0))
    img.putpixel((0, 0), (255, 255, 255))  # white top-left corner
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: display rotated 90 degrees clockwise
    out = load_image(_save(img, tmp_path / "rot.png", exif=exif))
    assert out.size == (2, 4)
    arr = np.asarray(out)
    assert arr[0, 1].tolist() == [255, 255, 255]  # the corner went to the top right
    assert arr[0, 0].tolist() == [0, 0, 0]


def test_tiny_image_loads(tmp_path):
    out = load_image(_save(Image.new("RGB", (1, 1), (1, 2, 3)), tmp_path / "tiny.png"))
    assert out.size == (1, 1) and np.asarray(out)[0, 0].tolist() == [1, 2, 3]


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_large_image_is_reduced_while_decoding(tmp_path, suffix):
    img = Image.new("RGB", (4000, 3000), (30, 60, 90))
    out = load_image(_save(img, tmp_path / f"big{suffix}"), large_side=500)
    assert min(out.size) >= 500 and min(out.size) < 3000
    assert abs(out.size[0] / out.size[1] - 4 / 3) < 0.01
    assert np.abs(np.asarray(out)[10, 10].astype(int) - [30, 60, 90]).max() <= 3


def test_10000_by_8000_jpeg_loads_downscaled(tmp_path):
    path = _save(Image.new("RGB", (10000, 8000), (200, 100, 50)), tmp_path / "huge.jpg", quality=50)
    out = load_image(path)
    # DCT scale 1/4 is the smallest that keeps the shorter side >= the default 1,024 (1/8 would give 1,000)
    assert out.size == (2500, 2000)


def test_decompression_bomb_is_an_error(tmp_path):
    path = _save(Image.new("L", (200, 100)), tmp_path / "bomb.png")
    with pytest.raises(ImageError, match="decompression bomb") as info:
        load_image(path, max_pixels=10_000)
    assert info.value.path == str(path)
    assert load_image(path, max_pixels=20_000).size == (200, 100)


def test_truncated_corrupt_empty_and_missing_files(tmp_path):
    buf = io.BytesIO()
    Image.effect_noise((64, 64), 50).convert("RGB").save(buf, format="JPEG")
    truncated = tmp_path / "cut.jpg"
    truncated.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(ImageError, match="truncated"):
        load_image(truncated)

    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"this is not an image at all" * 10)
    with pytest.raises(ImageError, match="not a recognised image"):
        load_image(garbage)

    bad_data = tmp_path / "bad.png"
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, format="PNG")
    raw = bytearray(png.getvalue())
    idat = raw.index(b"IDAT") + 4
    raw[idat : idat + 8] = b"\xff" * 8  # scramble the compressed pixel data, keep the header
    bad_data.write_bytes(bytes(raw))
    with pytest.raises(ImageError):
        load_image(bad_data)

    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    with pytest.raises(ImageError, match="empty"):
        load_image(empty)
    with pytest.raises(ImageError, match="missing"):
        load_image(tmp_path / "nope.jpg")


def test_real_coco_image_loads(coco_sample):
    path = sorted((coco_sample / "images").glob("*.jpg"))[0]
    out = load_image(path)
    assert out.mode == "RGB" and min(out.size) > 100
