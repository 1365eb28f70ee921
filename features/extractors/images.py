"""Robust image loading: any file a photo collection contains -> an 8-bit RGB ``PIL.Image``.

Conversions (chosen so that every photo of COCO / Flickr gives the pixels a viewer would show):

- EXIF orientation is applied (``ImageOps.exif_transpose``), as browsers and annotators saw the image.
- Grayscale (``1``, ``L``), palette without transparency, ``YCbCr`` and ``CMYK`` convert with PIL's own
  conversion to ``RGB``.
- Transparency (``RGBA``, ``LA``, ``PA``, palette or ``L``/``RGB`` with a ``transparency`` entry) is
  **composited on white**, not dropped: pixels with alpha 0 often store arbitrary colour (black is common),
  which dropping the alpha would show; white is the page background such images were made for.
- 16-bit and 32-bit integer images (``I;16*`` PNG/TIFF, ``I``) are **scaled** to 8 bit by ``v * 255 / 65535``
  (rounded), never clipped; an ``I`` image whose values all fit in 0..255 is taken as 8-bit data.
  Float images (``F``) in 0..1 are scaled by 255, otherwise clipped to 0..255.
- Very large images are reduced while decoding: a JPEG whose shorter side exceeds ``large_side`` is decoded
  at a DCT scale (``Image.draft``) that keeps the shorter side at least ``large_side``; other formats are
  reduced by an integer box filter (``Image.reduce``) to the same bound. The features later resize the
  shorter side to 256 (or the network's scale), so nothing the network sees is lost.
- Tiny images (down to 1x1) load as they are; the resize to the network's scale upsamples them.

Unusable files raise :class:`ImageError` with a short reason: missing, empty, not an image, truncated or
corrupt data, an I/O error of the filesystem (missing, truncated and I/O errors may be transient:
:func:`is_transient`), or more pixels than ``max_pixels`` (a decompression bomb; checked from the header
before any pixel is decoded).

The work an image may cost is bounded from its header too, before anything is decoded, resized or converted:
a longer side more than ``max_aspect`` (100) times its shorter side is refused (a 20000x2 strip would become
2,560,000 x 256 float32 after the resize of its shorter side to 256), and so is an image whose resize to the
network's scale (``resize``: the shorter side the features resize to) would exceed ``max_resized_pixels``
(16 Mpx, 192 MiB as a float32 RGB tensor). Such images are recorded as failed like any unusable file.
:func:`check_sizes` bounds ``--input-size`` / ``--resize`` themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from vsecore.errors import UserError

#: Default pixel limit: PIL's own warning level (about 89.5 Mpx, i.e. 0.25 GiB at 24 bit); a 10000x8000
#: photo (80 Mpx) is still accepted.
DEFAULT_MAX_PIXELS = 89_478_485
#: Shorter side above which images are reduced while decoding.
DEFAULT_LARGE_SIDE = 1024
#: Longest accepted longer side / shorter side: panoramas (up to about 10:1) pass, pixel strips do not.
DEFAULT_MAX_ASPECT = 100
#: Most pixels an image may have after the resize of its shorter side to the network's scale.
DEFAULT_MAX_RESIZED_PIXELS = 16 * 1024 * 1024
#: Accepted range of ``--input-size`` (the crop or view side a network sees) and the longest ``--resize``.
INPUT_SIZE_RANGE = (16, 2048)
MAX_RESIZE = 4096


class ImageError(UserError):
    """An image file that cannot be used; ``reason`` is short (``"truncated file"``), ``path`` names it.

    A subclass of :class:`vsecore.errors.UserError`, so that ``--on-error fail`` reports it in one line.
    """

    def __init__(self, reason: str, path: str | Path | None = None) -> None:
        self.reason = reason
        self.path = None if path is None else str(path)
        super().__init__(reason if path is None else f"{path}: {reason}")

    @property
    def transient(self) -> bool:
        """Whether the failure may go away by itself (see :func:`is_transient`)."""
        return is_transient(self.reason)


#: reasons of failures that may go away by themselves (a folder briefly unmounted or moved, a file still
#: being copied, a network filesystem's hiccup): a plain re-run of the extraction retries them
TRANSIENT_REASONS = ("missing file", "truncated file", "I/O error")


def is_transient(reason: str) -> bool:
    """Whether a failure ``reason`` (as :class:`ImageError` words it) may be transient."""
    return str(reason).startswith(TRANSIENT_REASONS)


def check_sizes(input_size: int | None = None, resize: int | None = None) -> None:
    """A one-line :class:`UserError` for an ``--input-size`` outside :data:`INPUT_SIZE_RANGE` or a
    ``--resize`` outside ``input_size..MAX_RESIZE`` (``None``: the network's own, not checked)."""
    low, high = INPUT_SIZE_RANGE
    if input_size is not None and not low <= input_size <= high:
        raise UserError(f"--input-size {input_size}: must be between {low} and {high} pixels")
    if resize is not None and not max(low, input_size or low) <= resize <= MAX_RESIZE:
        raise UserError(f"--resize {resize}: must be between {max(low, input_size or low)} (the crop size) "
                        f"and {MAX_RESIZE} pixels")


def check_work(width: int, height: int, resize: int | None = None, max_aspect: float = DEFAULT_MAX_ASPECT,
               max_resized_pixels: int = DEFAULT_MAX_RESIZED_PIXELS) -> str | None:
    """Why an image of ``width`` x ``height`` pixels would cost too much to featurise, else ``None``.

    ``resize``: the shorter side the features resize the image to (``None``: the aspect bound only).
    """
    short, long = min(width, height), max(width, height)
    if short < 1:
        return "image has no pixels"
    if long > max_aspect * short:
        return (f"aspect ratio {width}x{height} is {long / short:.0f}:1, more than {max_aspect:g}:1 "
                "(a pixel strip, not a photo)")
    if resize is not None:
        resized = resize * max(resize, int(resize * long / short))
        if resized > max_resized_pixels:
            return (f"{width}x{height} resized to a shorter side of {resize} would have {resized} pixels, "
                    f"more than {max_resized_pixels}")
    return None


def load_image(
    path: str | Path,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    large_side: int = DEFAULT_LARGE_SIDE,
    resize: int | None = None,
    max_aspect: float = DEFAULT_MAX_ASPECT,
    max_resized_pixels: int = DEFAULT_MAX_RESIZED_PIXELS,
) -> Image.Image:
    """Open ``path`` and return it as an 8-bit RGB image with EXIF orientation applied.

    ``max_pixels``: images with more pixels (width x height from the header) raise
    ``ImageError("decompression bomb ...")`` before decoding. ``large_side``: images whose shorter side is
    larger are reduced while decoding (see the module docstring). ``resize`` (the shorter side the features
    will resize to), ``max_aspect``, ``max_resized_pixels``: the work bound of :func:`check_work`, checked
    from the header. Raises :class:`ImageError` for missing, empty, unrecognised, truncated or corrupt
    files and for images over a bound.
    """
    path = Path(path)
    _check_file(path)
    with _image_errors(path), Image.open(path) as img:
        _check_header(img, path, max_pixels, resize, max_aspect, max_resized_pixels)
        _reduce_while_decoding(img, large_side)
        img.load()
        img = _reduce_after_decoding(img, large_side)
        img = ImageOps.exif_transpose(img)
        rgb = to_rgb(img)
    if rgb.width < 1 or rgb.height < 1:
        raise ImageError("image has no pixels", path)
    return rgb


def image_header(path: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS, resize: int | None = None,
                 max_aspect: float = DEFAULT_MAX_ASPECT, max_resized_pixels: int = DEFAULT_MAX_RESIZED_PIXELS
                 ) -> tuple[str | None, tuple[int, int], int]:
    """``(format, (width, height), EXIF orientation 1..8)`` of the image file ``path``, read from its header
    alone, with the checks :func:`load_image` makes before decoding (file, pixel count, work bound): the
    same :class:`ImageError` for a file it would refuse before decoding."""
    path = Path(path)
    _check_file(path)
    with _image_errors(path), Image.open(path) as img:
        _check_header(img, path, max_pixels, resize, max_aspect, max_resized_pixels)
        orientation = img.getexif().get(0x0112, 1) if img.format == "JPEG" else 1
        return img.format, img.size, orientation if orientation in range(1, 9) else 1


@contextlib.contextmanager
def _image_errors(path: Path) -> Iterator[None]:
    """Turn what PIL raises on a bad file into one :class:`ImageError` naming ``path``."""
    try:
        yield
    except ImageError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageError(f"decompression bomb: {exc}", path) from exc
    except UnidentifiedImageError as exc:
        raise ImageError("not a recognised image file", path) from exc
    except (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError) as exc:
        raise _decode_error(exc, path) from exc


def _check_header(img: Image.Image, path: Path, max_pixels: int, resize: int | None, max_aspect: float,
                  max_resized_pixels: int) -> None:
    """The checks made from the header before any decoding: the pixel count and the work bound."""
    width, height = img.size
    if width * height > max_pixels:
        reason = f"decompression bomb: {width}x{height} = {width * height} pixels > {max_pixels}"
        raise ImageError(reason, path)
    too_much = check_work(width, height, resize, max_aspect, max_resized_pixels)
    if too_much:
        raise ImageError(too_much, path)


def _check_file(path: Path) -> None:
    """An :class:`ImageError` for a missing, unreadable, empty file or one that is not a regular file."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ImageError("missing file", path) from None
    except OSError as exc:
        raise ImageError(f"I/O error ({exc.strerror or exc})", path) from None
    if not path.is_file():
        raise ImageError("not a file", path)
    if size == 0:
        raise ImageError("empty file", path)


def _decode_error(exc: BaseException, path: Path) -> ImageError:
    """The :class:`ImageError` for an exception PIL raised while decoding ``path``: an ``OSError`` with an
    errno is the filesystem failing (``I/O error``); PIL signals truncated or corrupt data with errno-less
    ``OSError``s and ``SyntaxError``/``ValueError``/``EOFError``/``IndexError``/``TypeError``."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return ImageError(f"I/O error ({exc.strerror or exc})", path)
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "truncat" in reason.lower():
        return ImageError("truncated file", path)
    return ImageError(f"corrupt image data ({reason})", path)


def _reduce_while_decoding(img: Image.Image, large_side: int) -> None:
    """JPEG only: decode at the smallest DCT scale whose shorter side is still >= ``large_side``."""
    if img.format == "JPEG" and min(img.size) > large_side:
        # draft keeps both sides >= the request, so ask for the shorter side on both axes
        img.draft(img.mode, (large_side, large_side))


_REDUCIBLE_MODES = ("L", "RGB", "RGBA", "LA", "CMYK", "YCbCr", "I", "F")


def _reduce_after_decoding(img: Image.Image, large_side: int) -> Image.Image:
    factor = min(img.size) // large_side
    if factor >= 2 and img.mode in _REDUCIBLE_MODES:
        return img.reduce(factor)
    return img


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert a decoded image of any PIL mode to 8-bit ``RGB`` (conversions: see the module docstring)."""
    mode = img.mode
    if mode == "RGB" and "transparency" not in img.info:
        return img.copy()
    if mode.startswith("I;16") or mode in ("I", "F"):
        return _high_depth_to_rgb(img)
    if mode == "P" or "transparency" in img.info:
        has_alpha = "transparency" in img.info or mode == "PA"
        img = img.convert("RGBA" if has_alpha else "RGB")
        mode = img.mode
        if mode == "RGB":
            return img
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    try:
        return img.convert("RGB")
    except ValueError as exc:
        raise ImageError(f"unsupported image mode {mode}") from exc


def _high_depth_to_rgb(img: Image.Image) -> Image.Image:
    """16/32-bit integer or float grayscale -> 8-bit RGB by scaling (not clipping)."""
    arr = np.asarray(img)
    if img.mode == "F":
        values = arr.astype(np.float64)
        finite = values[np.isfinite(values)]
        scale = 255.0 if finite.size and finite.max() <= 1.0 and finite.min() >= 0.0 else 1.0
        out = np.clip(np.nan_to_num(values) * scale, 0, 255)
    else:
        values = arr.astype(np.float64)
        if img.mode == "I" and values.min() >= 0 and values.max() <= 255:
            out = values  # 8-bit data stored in a 32-bit container
        else:
            out = np.clip(values, 0, 65535) * (255.0 / 65535.0)
    gray = Image.fromarray(np.rint(out).astype(np.uint8))
    return gray.convert("RGB")
