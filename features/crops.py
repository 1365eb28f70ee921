"""Test-time crops of the papers: shorter side resized, then 10 crops (or the centre one).

The FNE, CHAIN-VSE and OECC papers follow the VSE/VGG protocol: resize the shorter side to 256 (or the
network's own scale), take the four corner crops and the centre crop at the network's input size, plus the
horizontal mirrors of those five, and average the features of the ten crops.
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


def to_normalized_tensor(img: Image.Image, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """8-bit RGB image -> float32 (3, H, W) tensor, scaled to 0..1 and normalised per channel."""
    arr = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0
    tensor = torch.from_numpy(arr).permute(2, 0, 1).contiguous()
    mean_t = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
    return (tensor - mean_t) / std_t


def image_crops(
    img: Image.Image,
    resize: int,
    size: int,
    mean: Sequence[float],
    std: Sequence[float],
    crops: int = 10,
    interpolation: str = "bilinear",
) -> torch.Tensor:
    """One image -> its network inputs (crops, 3, size, size): shorter side to ``resize``, normalised,
    then :func:`ten_crop` (``crops=10``) or :func:`one_crop` (``crops=1``)."""
    if crops not in (1, 10):
        raise ValueError(f"crops must be 1 or 10, not {crops}")
    tensor = to_normalized_tensor(resize_shorter_side(img, resize, interpolation), mean, std)
    return ten_crop(tensor, size) if crops == 10 else one_crop(tensor, size)
