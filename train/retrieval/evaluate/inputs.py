"""The inputs of an evaluation, checked and placed once: embeddings or a similarity matrix, and the
caption-image map.

Both sources go through one path (:func:`prepare_embeddings`, :func:`prepare_similarities` ->
:class:`EvaluationInputs`): the caption-image map is read and checked the same way, the device is
resolved and the tile shape chosen once, and a protocol's size is checked (``check_size``) before any
pass over the data. Unusable inputs are one-line :class:`~vsecore.errors.UserError`; usable but
suspicious ones (constant embeddings) become notes the evaluation logs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from train.retrieval.evaluate.ranking import BlockSizes, block_sizes
from vsecore.device import resolve_device
from vsecore.errors import UserError

MEASURES = ("order", "cosine")
SIMILARITY_DTYPES = (np.float16, np.float32, np.float64)


def _as_float_tensor(x: np.ndarray | torch.Tensor, name: str) -> torch.Tensor:
    """(rows, d) float32 embeddings."""
    t = torch.as_tensor(x)
    if t.dim() != 2:
        raise UserError(f"{name} embeddings must be a 2-D array (rows, d), got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        t = t.float()
    return t.to(torch.float32)


def as_caption_image(caption_image: np.ndarray | torch.Tensor) -> torch.Tensor:
    """The (M,) image row of each caption as int64 (on the device it is on)."""
    if isinstance(caption_image, torch.Tensor):
        return caption_image.to(torch.int64)
    return torch.as_tensor(np.asarray(caption_image)).to(torch.int64)


def check_caption_image(caption_image: torch.Tensor, n: int, m: int) -> None:
    """Raise unless ``caption_image`` is (m,), names rows ``0..n-1`` and gives every image a caption."""
    if caption_image.shape != (m,):
        raise UserError(f"caption_image must have one entry per caption ({m}), got shape "
                        f"{tuple(caption_image.shape)}")
    if n == 0 or m == 0:
        raise UserError(f"nothing to evaluate: {n} images, {m} captions")
    if int(caption_image.min()) < 0 or int(caption_image.max()) >= n:
        bad = int(torch.nonzero((caption_image < 0) | (caption_image >= n))[0, 0])
        raise UserError(f"caption {bad} refers to image row {int(caption_image[bad])}, "
                        f"outside 0..{n - 1}")
    counts = torch.bincount(caption_image, minlength=n)
    if bool((counts == 0).any()):
        missing = torch.nonzero(counts == 0)[:5, 0].tolist()
        raise UserError(f"images without any caption cannot be ranked: rows {missing}"
                        + (" ..." if int((counts == 0).sum()) > 5 else ""))


#: a row whose L2 norm is within this of 1 is taken as the model's own unit vector, bit for bit
UNIT_NORM_TOLERANCE = 1e-5


def unit_rows(t: torch.Tensor, block_rows: int = 4096) -> torch.Tensor:
    """``t`` (R, d) with every row scaled to unit L2 norm, for the cosine: rows already of norm 1
    (within :data:`UNIT_NORM_TOLERANCE`, what every model of the toolkit outputs) and zero rows are
    kept bit for bit; when none needs scaling ``t`` itself is returned (no copy).

    Norms and quotients are computed in float64, so rows of any finite scale (1e-30 or 1e30) give
    the same cosines as their unit versions: the cosine does not depend on scale, and no product of
    two unit rows can overflow (so a cosine score is never NaN by overflow).
    """
    out = t
    for r0 in range(0, t.shape[0], block_rows):
        rows = t[r0:r0 + block_rows].double()
        norms = torch.linalg.vector_norm(rows, dim=1)
        scale = ((norms - 1).abs() > UNIT_NORM_TOLERANCE) & (norms > 0)
        if bool(scale.any()):
            if out is t:
                out = t.clone()
            out[r0:r0 + block_rows][scale] = (rows[scale] / norms[scale, None]).to(t.dtype)
    return out


def _check_embeddings(images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor) -> list[str]:
    """Raise on unusable inputs; return notes on usable but suspicious ones (constant embeddings).

    One pass per matrix, in row blocks (no bool copy of the whole matrix): the column-wise minimum
    and maximum tell both whether everything is finite (NaN and infinity propagate) and whether all
    rows are identical (minimum == maximum in every column).
    """
    if images.shape[1] != captions.shape[1]:
        raise UserError(f"image and caption embeddings differ in size: d = {images.shape[1]} "
                        f"vs {captions.shape[1]}")
    check_caption_image(caption_image, images.shape[0], captions.shape[0])
    notes = []
    for name, t, other in (("image", images, "t2i"), ("caption", captions, "i2t")):
        low = high = None
        for r0 in range(0, t.shape[0], 4096):
            rows = t[r0:r0 + 4096]
            if rows.shape[1] == 0:
                continue
            block_low, block_high = torch.aminmax(rows, dim=0)
            if not bool(torch.isfinite(block_low).all() & torch.isfinite(block_high).all()):
                row = r0 + int(torch.nonzero(~torch.isfinite(rows).all(dim=1))[0, 0])
                raise UserError(f"{name} embeddings contain NaN or infinity (first at row {row})")
            low = block_low if low is None else torch.minimum(low, block_low)
            high = block_high if high is None else torch.maximum(high, block_high)
        constant = low is None or bool((low == high).all())
        if constant and t.shape[0] > 1:
            notes.append(f"warning: the {name} embeddings are constant (all {t.shape[0]} rows identical, "
                         f"d = {t.shape[1]}): every {name} ties with every other, so {other} ranks are the "
                         "worst possible (ties count against the ground truth)")
    return notes


def check_similarity_matrix(sims: np.ndarray, caption_image: np.ndarray | torch.Tensor,
                            transposed: bool = False, name: str = "the similarity matrix") -> None:
    """Raise a :class:`UserError` unless ``sims`` is an (N images, M captions) float matrix for
    ``caption_image`` (M,), grouped by image; with ``transposed``, (M, N)."""
    ci = as_caption_image(caption_image)
    if sims.ndim != 2 or sims.dtype.type not in SIMILARITY_DTYPES:
        raise UserError(f"{name} must be a 2-D float16/32/64 array, got {sims.dtype} {sims.shape}")
    n, m = (sims.shape[1], sims.shape[0]) if transposed else sims.shape
    if m != ci.numel():
        if not transposed and sims.shape[0] == ci.numel():
            raise UserError(f"{name} has shape {sims.shape}: that is (captions, images), transposed; "
                            f"expected (images, captions) = ({sims.shape[1]}, {ci.numel()}) "
                            "(use --sims-transposed to read it as it is)")
        layout = "(captions, images)" if transposed else "(images, captions)"
        raise UserError(f"{name} has shape {sims.shape} {layout}, but there are {ci.numel()} captions "
                        "(check --captions-per-image)")
    check_caption_image(ci, n, m)
    if m > 1 and not bool((ci[1:] >= ci[:-1]).all()):
        raise UserError(f"{name}: the captions must be grouped by image (all captions of image 0, then "
                        "of image 1, ...)")


@dataclass(frozen=True)
class EvaluationInputs:
    """The checked inputs of one evaluation, on its device: what every fold is ranked from.

    Embeddings (``images`` (N, d) and ``captions`` (M, d) float32, unit rows for the cosine) or a
    precomputed matrix ``sims`` ((N, M), or (M, N) with ``transposed``; left where it is, e.g. a
    memory map); ``caption_image`` (M,) int64 on ``device``; ``blocks`` the tile shape; ``notes`` the
    warnings about usable but suspicious inputs.
    """

    caption_image: torch.Tensor
    n_images: int
    device: torch.device
    blocks: BlockSizes
    measure: str | None = None
    images: torch.Tensor | None = None
    captions: torch.Tensor | None = None
    sims: np.ndarray | None = None
    transposed: bool = False
    notes: tuple[str, ...] = ()

    @property
    def dim(self) -> int:
        """The embedding size d (0 for a similarity matrix)."""
        return 0 if self.images is None else int(self.images.shape[1])


def prepare_embeddings(images: np.ndarray | torch.Tensor, captions: np.ndarray | torch.Tensor,
                       caption_image: np.ndarray | torch.Tensor, measure: str,
                       device: str | torch.device | None = None, block_images: int | None = None,
                       block_captions: int | None = None,
                       check_size: Callable[[int], None] | None = None) -> EvaluationInputs:
    """Embeddings checked and on the evaluation's device.

    Args:
        images: (N, d); captions: (M, d); caption_image: (M,) image row of each caption (any order).
        measure: ``"order"`` or ``"cosine"`` (the cosine's rows are made unit, :func:`unit_rows`).
        device: where to compute (default: CUDA when available).
        block_images, block_captions: the largest tile (default by measure, d and device).
        check_size: called with N before the embeddings are scanned (a protocol's size check).

    Returns:
        :class:`EvaluationInputs` with ``images`` and ``captions`` on the device and ``notes``.
    """
    if measure not in MEASURES:
        raise UserError(f"unknown measure {measure!r} (expected one of {', '.join(MEASURES)})")
    dev = resolve_device(device)
    img = _as_float_tensor(images, "image").to(dev)
    cap = _as_float_tensor(captions, "caption").to(dev)
    ci = as_caption_image(caption_image).to(dev)
    if ci.shape != (cap.shape[0],):
        raise UserError(f"caption_image must have one entry per caption ({cap.shape[0]}), got shape "
                        f"{tuple(ci.shape)}")
    if check_size is not None:
        check_size(img.shape[0])
    notes = _check_embeddings(img, cap, ci)
    blocks = block_sizes(measure, img.shape[1], dev, block_images, block_captions)
    if measure == "cosine":  # the cosine of unit rows: see unit_rows
        img, cap = unit_rows(img), unit_rows(cap)
    return EvaluationInputs(ci, img.shape[0], dev, blocks, measure, img, cap, notes=tuple(notes))


def prepare_similarities(sims: np.ndarray, caption_image: np.ndarray | torch.Tensor, transposed: bool = False,
                         device: str | torch.device | None = None, block_images: int | None = None,
                         block_captions: int | None = None,
                         check_size: Callable[[int], None] | None = None) -> EvaluationInputs:
    """A precomputed similarity matrix checked (:func:`check_similarity_matrix`), left where it is.

    Args:
        sims: (N images, M captions) float16/32/64, or (M, N) with ``transposed``.
        caption_image: (M,) image row of each caption, grouped by image.
        device, block_images, block_captions, check_size: as in :func:`prepare_embeddings`.

    Returns:
        :class:`EvaluationInputs` with ``sims`` (not copied) and ``caption_image`` on the device.
    """
    ci = as_caption_image(caption_image)
    check_similarity_matrix(sims, ci, transposed)
    dev = resolve_device(device)
    n = sims.shape[1] if transposed else sims.shape[0]
    if check_size is not None:
        check_size(n)
    blocks = block_sizes(None, 0, dev, block_images, block_captions)
    return EvaluationInputs(ci.to(dev), n, dev, blocks, sims=sims, transposed=transposed)
