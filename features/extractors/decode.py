"""JPEG decoding where the network runs (``--decoder torchvision``): on CUDA by nvjpeg, on the CPU by
torchvision's libjpeg-turbo.

The default (``--decoder pil``) decodes and resizes every image with PIL on the host, in the extraction's
decode threads (:mod:`features.extractors.images`, :func:`features.extractors.crops.resized_pixels`). With
``torchvision`` the decode threads only check a JPEG's header (the same bounds as PIL's loading,
:func:`features.extractors.images.image_header`) and read its bytes (:func:`read_encoded`); the mapper's
thread decodes a pass's JPEGs in one ``torchvision.io.decode_jpeg`` call on its device, applies the EXIF
orientation and resizes the shorter side there (:func:`decode_and_resize`: antialiased like PIL's resize,
rounded back to 8 bits), so the host's work per image is a file read. Files that are not JPEG (PNG, ...), and
JPEGs the device decoder refuses (CMYK, arithmetic coding), are decoded by PIL as with ``pil``; a file PIL
cannot decode either is a failed image as always.

The pixels differ from PIL's (another IDCT and chroma upsampling, a full-size decode where PIL reduces a
large JPEG while decoding, another resize), so the rows do: a store records its decoder (its ``config``'s
``decoder``: ``torchvision-cuda`` or ``torchvision-cpu``; none for PIL) and refuses a resumption with another
one (``docs/features.md`` gives the measured differences).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from features.extractors.images import image_header

# torchvision 0.29 announces TorchCodec on every call of its decoder (a filter of this message only: the
# decode_jpeg of the pinned torchvision is the one measured and recorded)
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)

#: the ``--decoder`` values: PIL on the host (default), or torchvision's JPEG decoder on the network's device
DECODERS = ("pil", "torchvision")
#: the interpolations the device resize has (PIL's lanczos has no antialiased tensor counterpart)
DEVICE_INTERPOLATION = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "nearest"}


@dataclass(frozen=True)
class EncodedImage:
    """A JPEG file's bytes, read in a decode thread: ``data (n,) uint8`` on the CPU, ``size`` ``(width,
    height)`` as displayed (after its EXIF ``orientation``, 1..8), ``path`` (for PIL when the device decoder
    refuses it)."""

    data: torch.Tensor
    size: tuple[int, int]
    orientation: int
    path: str


def read_encoded(path: str | Path, resize: int | None = None) -> EncodedImage | None:
    """The bytes of the JPEG ``path`` after its header's checks (an :class:`~features.extractors.images.
    ImageError` for a file PIL's loading would refuse before decoding); ``None`` for another format."""
    fmt, (width, height), orientation = image_header(path, resize=resize)
    if fmt != "JPEG":
        return None
    data = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8)
    size = (height, width) if orientation >= 5 else (width, height)
    return EncodedImage(data, size, orientation, str(path))


def orient(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """``image (3, H, W)`` as displayed for its EXIF ``orientation`` (what ``PIL.ImageOps.exif_transpose``
    does: 2 mirrored, 3 turned half, 4 flipped, 5 transposed, 6 turned a quarter clockwise, 7 transversed, 8
    turned a quarter anticlockwise)."""
    if orientation == 2:
        return image.flip(2)
    if orientation == 3:
        return image.flip(1, 2)
    if orientation == 4:
        return image.flip(1)
    if orientation == 5:
        return image.transpose(1, 2)
    if orientation == 6:
        return image.transpose(1, 2).flip(2)
    if orientation == 7:
        return image.transpose(1, 2).flip(1, 2)
    if orientation == 8:
        return image.transpose(1, 2).flip(1)
    return image


def shorter_side_size(width: int, height: int, size: int) -> tuple[int, int]:
    """``(width, height)`` with the shorter side ``size`` (that of
    :func:`features.extractors.crops.resize_shorter_side`)."""
    if width <= height:
        return size, max(size, int(size * height / width))
    return max(size, int(size * width / height)), size


def resize_on_device(image: torch.Tensor, size: int, interpolation: str) -> torch.Tensor:
    """``image (3, H, W)`` uint8 with its shorter side resized to ``size``, antialiased when it shrinks,
    rounded to 8 bits: ``(H', W', 3)`` uint8 on the image's device (the pixels the crops are cut from)."""
    width, height = shorter_side_size(image.shape[2], image.shape[1], size)
    if (width, height) != (image.shape[2], image.shape[1]):
        mode = DEVICE_INTERPOLATION[interpolation]
        x = image.unsqueeze(0).float()
        x = F.interpolate(x, size=(height, width), mode=mode, antialias=mode != "nearest",
                          **({} if mode == "nearest" else {"align_corners": False}))
        image = x.squeeze(0).round_().clamp_(0, 255).to(torch.uint8)
    return image.permute(1, 2, 0)


def decode_jpegs(items: list[EncodedImage], device: torch.device) -> list[torch.Tensor | None]:
    """Decode ``items`` on ``device`` (one batched call; on an error, one at a time): ``(3, H, W)`` uint8 RGB
    each as displayed, or ``None`` for one the device decoder refuses."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        decoded: list[torch.Tensor | None] = list(decode_jpeg([i.data for i in items], mode=ImageReadMode.RGB,
                                                              device=device))
    except RuntimeError:
        decoded = []
        for item in items:
            try:
                decoded.append(decode_jpeg(item.data, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                decoded.append(None)
    return [None if d is None else orient(d, i.orientation) for d, i in zip(decoded, items, strict=True)]


def device_decoder(decoder: str | None, device: torch.device) -> str | None:
    """The recorded name of ``--decoder`` on ``device``: ``None`` for PIL, else ``torchvision-cuda`` or
    ``torchvision-cpu`` (nvjpeg and libjpeg-turbo give other pixels)."""
    if decoder in (None, "pil"):
        return None
    return f"torchvision-{device.type}"
