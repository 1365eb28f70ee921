"""Test-time crops of the papers: shorter side resized, then 10 crops (or the centre one).

The FNE, CHAIN-VSE and OECC papers follow the VSE/VGG protocol: resize the shorter side to 256 (or the
network's own scale), take the four corner crops and the centre crop at the network's input size, plus the
horizontal mirrors of those five, and average the features of the ten crops.

The host does the part that needs PIL, the resize (:func:`resized_pixels`: 8-bit pixels, a quarter of
float32's bytes); normalising (:func:`normalize_pixels`, a lookup in a 256-entry table per channel, so the
values are the same bits on any device) and cutting the crops are tensor operations on the device that
runs the network.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

_PIL_INTERPOLATION = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
}


def crop_offsets(height: int, width: int, size: int) -> list[tuple[int, int]]:
    """Top-left ``(top, left)`` of the five crops, in the order top-left, top-right, bottom-left,
    bottom-right, centre (the order of torchvision's ``TenCrop``; the centre offset rounds half up:
    ``round((H - size) / 2)``)."""
    if height < size or width < size:
        raise ValueError(f"image {height}x{width} is smaller than the crop size {size}")
    return [
        (0, 0),
        (0, width - size),
        (height - size, 0),
        (height - size, width - size),
        (int(round((height - size) / 2.0)), int(round((width - size) / 2.0))),
    ]


def ten_crop(img: torch.Tensor, size: int) -> torch.Tensor:
    """``img`` (3, H, W) -> (10, 3, size, size): the 4 corners and the centre, then their horizontal mirrors
    in the same order (crop ``k + 5`` is crop ``k`` flipped left-right)."""
    offsets = crop_offsets(img.shape[1], img.shape[2], size)
    five = torch.stack([img[:, t : t + size, l : l + size] for t, l in offsets])
    return torch.cat([five, five.flip(-1)], dim=0)


def one_crop(img: torch.Tensor, size: int) -> torch.Tensor:
    """``img`` (3, H, W) -> (1, 3, size, size): the centre crop (``--crops 1``)."""
    top, left = crop_offsets(img.shape[1], img.shape[2], size)[4]
    return img[:, top : top + size, left : left + size].unsqueeze(0)


def resize_shorter_side(img: Image.Image, size: int, interpolation: str = "bilinear") -> Image.Image:
    """Resize so that the shorter side is ``size``; the longer keeps the aspect ratio (truncated like
    torchvision's ``Resize(int)``). Tiny images are upsampled."""
    width, height = img.size
    if width <= height:
        new_w, new_h = size, max(size, int(size * height / width))
    else:
        new_w, new_h = max(size, int(size * width / height)), size
    if (new_w, new_h) == (width, height):
        return img
    return img.resize((new_w, new_h), _PIL_INTERPOLATION[interpolation])


def rgb_pixels(img: Image.Image) -> torch.Tensor:
    """``img``'s 8-bit RGB pixels ``(H, W, 3)`` uint8, on the CPU."""
    return torch.from_numpy(np.array(img.convert("RGB")))


def resized_pixels(img: Image.Image, resize: int, interpolation: str = "bilinear") -> torch.Tensor:
    """``img`` with its shorter side resized to ``resize`` (:func:`resize_shorter_side`) -> its 8-bit RGB
    pixels ``(H, W, 3)`` uint8, on the CPU (the host's part of the crops)."""
    return rgb_pixels(resize_shorter_side(img, resize, interpolation))


def normalization_table(mean: Sequence[float], std: Sequence[float], device: str | torch.device = "cpu"
                        ) -> torch.Tensor:
    """``(3, 256)`` float32: channel ``c``'s normalised value of each 8-bit level, ``(v / 255 - mean[c]) /
    std[c]``, computed on the CPU in float32 (the level scaled first, then the mean taken away and the
    result divided: the order and rounding of the per-pixel formula), then moved to ``device``."""
    levels = torch.from_numpy(np.arange(256, dtype=np.float32) / np.float32(255.0)).expand(3, 256)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(3, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(3, 1)
    return ((levels - mean_t) / std_t).contiguous().to(device)


def normalize_pixels(pixels: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """8-bit pixels ``(..., H, W, 3)`` uint8 -> float32 ``(..., 3, H, W)`` normalised by ``table``
    (:func:`normalization_table`, on the pixels' device): a lookup, so the same bits on any device."""
    index = pixels.movedim(-1, -3).to(torch.int64)  # (..., 3, H, W): channel c's level v is entry 256 c + v
    index += torch.arange(0, 768, 256, device=pixels.device).view(3, 1, 1)
    return torch.take(table, index)


def to_normalized_tensor(img: Image.Image, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """8-bit RGB image -> float32 (3, H, W) tensor, scaled to 0..1 and normalised per channel."""
    return normalize_pixels(rgb_pixels(img), normalization_table(mean, std))


def pixel_crops(pixels: torch.Tensor, table: torch.Tensor, size: int, crops: int = 10) -> torch.Tensor:
    """Resized 8-bit pixels ``(H, W, 3)`` (:func:`resized_pixels`, on any device) -> the network inputs
    ``(crops, 3, size, size)`` float32 on that device: normalised by ``table``, then :func:`ten_crop`
    (``crops=10``) or :func:`one_crop` (``crops=1``)."""
    if crops not in (1, 10):
        raise ValueError(f"crops must be 1 or 10, not {crops}")
    tensor = normalize_pixels(pixels, table)
    return ten_crop(tensor, size) if crops == 10 else one_crop(tensor, size)


def image_crops(
    img: Image.Image,
    resize: int,
    size: int,
    mean: Sequence[float],
    std: Sequence[float],
    crops: int = 10,
    interpolation: str = "bilinear",
) -> torch.Tensor:
    """One image -> its network inputs (crops, 3, size, size) on the CPU: shorter side to ``resize``,
    normalised, then :func:`ten_crop` (``crops=10``) or :func:`one_crop` (``crops=1``)."""
    pixels = resized_pixels(img, resize, interpolation)
    return pixel_crops(pixels, normalization_table(mean, std), size, crops)
