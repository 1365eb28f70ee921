"""Blocked ranking metrics for image-text retrieval, and the COCO/Flickr evaluation protocols.

The similarity matrix ``S[i, c]`` (image ``i``, caption ``c``) is never built whole: it is computed
tile by tile (``block_images x block_captions``) with :func:`train.similarity.similarity`, and each
tile only updates two count vectors. A query's rank is found by *counting*, not by sorting:

* text-to-image: ``rank(c) = 1 + #{images i' : S[i', c] > S[gt(c), c]}``;
* image-to-text: ``rank(i) = min over its captions c of (1 + #{captions c' : S[i, c'] > S[i, c]})``
  which equals ``1 + #{captions c' : S[i, c'] > max_c S[i, c]}`` because the count only falls as the
  threshold rises; so one threshold per image suffices.

Tie rule: a candidate counts against the ground truth only when it scores *strictly* higher, i.e.
ties are resolved in favour of the ground truth (the optimistic rank). The naive reference in the
tests sorts each query's candidates by descending score, ground truth first among equal scores,
and takes the 1-based position of the first ground truth: the same number. Ground-truth candidates
never count against their own query (an image's other captions score at most its best one anyway).

Two passes over the tiles: a cheap one computes the ground-truth scores (each image block against
its own captions only), the full one counts. Peak memory beyond the embeddings themselves:

* cosine: the tile, ``block_images x block_captions`` float32 (plus a bool tile of the same shape);
* order on the CPU: the tile (default at most 1024 x 8192, 32 MB; 256 x 1024 at d = 8192): tiles take
  the fused kernel of :func:`train.similarity.order_violation`, which builds no broadcast (a
  tile whose ``block_images x block_captions x d`` is under ``FUSED_MIN_WORK``, i.e. d < 32 at
  the default tile, takes the eager kernel and adds its 16M-element chunk, 64 MB);
* order on CUDA: the tile plus the broadcast inside ``order_violation``, at most
  ``min(block_images x block_captions x d, max(2**24, block_images x d))`` float32 elements (the
  16M-element chunk of :mod:`train.similarity`, 64 MB).

No Python loop runs per query; loops run over blocks only.

Metrics follow VSE++ and the papers: R@K in percent (rank <= K), median rank ``floor(median)``
and mean rank of the 1-based ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from prep.errors import UserError
from train.similarity import similarity

PROTOCOLS = ("1k", "5cv", "5k", "all")
MEASURES = ("order", "cosine")
RECALL_KS = (1, 5, 10)

#: a tile callback receives (image_start, image_stop, caption_start, caption_stop) of every tile
TileHook = Callable[[int, int, int, int], None]


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class DirectionMetrics:
    """Retrieval metrics of one direction: recalls in percent, ranks counted from 1."""

    r1: float
    r5: float
    r10: float
    medr: float
    meanr: float

    def to_dict(self) -> dict[str, float]:
        """``{"r1", "r5", "r10", "medr", "meanr"}``."""
        return asdict(self)


@dataclass(frozen=True)
class RetrievalMetrics:
    """Image-to-text and text-to-image metrics of one evaluation (or a fold average)."""

    i2t: DirectionMetrics
    t2i: DirectionMetrics

    @property
    def rsum(self) -> float:
        """Sum of the six recalls (R@1, R@5, R@10 both ways)."""
        return (self.i2t.r1 + self.i2t.r5 + self.i2t.r10
                + self.t2i.r1 + self.t2i.r5 + self.t2i.r10)

    def to_dict(self) -> dict[str, object]:
        """``{"i2t": {...}, "t2i": {...}, "rsum": float}``, the JSON shape of one protocol."""
        return {"i2t": self.i2t.to_dict(), "t2i": self.t2i.to_dict(), "rsum": self.rsum}


@dataclass(frozen=True)
class Ranks:
    """1-based ground-truth ranks: ``i2t`` (N,) one per image, ``t2i`` (M,) one per caption."""

    i2t: np.ndarray
    t2i: np.ndarray


@dataclass
class TileStats:
    """What the blocked computation did: number of tiles and the largest tile it built."""

    tiles: int = 0
    max_tile_images: int = 0
    max_tile_captions: int = 0
    block_images: int = 0
    block_captions: int = 0

    def record(self, n_images: int, n_captions: int) -> None:
        """Account for one ``(n_images, n_captions)`` similarity tile."""
        self.tiles += 1
        self.max_tile_images = max(self.max_tile_images, n_images)
        self.max_tile_captions = max(self.max_tile_captions, n_captions)


def direction_metrics(ranks: np.ndarray | torch.Tensor) -> DirectionMetrics:
    """Metrics of one direction from 1-based ranks (Q,)."""
    r = np.asarray(torch.as_tensor(ranks).cpu().numpy() if isinstance(ranks, torch.Tensor) else ranks)
    if r.size == 0:
        raise UserError("no queries to evaluate")
    recalls = [100.0 * float(np.mean(r <= k)) for k in RECALL_KS]
    # VSE++ reports floor(median(0-based)) + 1, which is floor(median) of the 1-based ranks
    return DirectionMetrics(r1=recalls[0], r5=recalls[1], r10=recalls[2],
                            medr=float(np.floor(np.median(r))), meanr=float(np.mean(r)))


def metrics_from_ranks(ranks: Ranks) -> RetrievalMetrics:
    """Both directions' metrics from :class:`Ranks`."""
    return RetrievalMetrics(i2t=direction_metrics(ranks.i2t), t2i=direction_metrics(ranks.t2i))


def average_metrics(folds: Sequence[RetrievalMetrics]) -> RetrievalMetrics:
    """Average every metric over folds (COCO-5cv, as the papers: medr and meanr averaged too)."""
    def mean_of(direction: str) -> DirectionMetrics:
        values = [getattr(f, direction) for f in folds]
        return DirectionMetrics(**{k: float(np.mean([getattr(v, k) for v in values]))
                                   for k in ("r1", "r5", "r10", "medr", "meanr")})
    return RetrievalMetrics(i2t=mean_of("i2t"), t2i=mean_of("t2i"))


def chance_metrics(caption_image: np.ndarray | torch.Tensor, n_images: int) -> RetrievalMetrics:
    """Expected recalls and mean ranks of a uniformly random ranking, for comparison.

    Text-to-image: one ground truth among ``N`` images, ``R@K = K / N``, mean rank ``(N + 1) / 2``.
    Image-to-text with ``k`` ground-truth captions among ``M``: ``R@K = 1 - C(M-k, K) / C(M, K)``,
    expected best rank ``(M + 1) / (k + 1)``; averaged over images. The median is left as NaN.
    """
    ci = np.asarray(caption_image, dtype=np.int64)
    m = int(ci.size)
    per_image = np.bincount(ci, minlength=n_images).astype(np.float64)

    def miss_probability(k_top: int) -> np.ndarray:
        # prod_{j<K} (M - k - j) / (M - j): the K top candidates are all wrong
        p = np.ones_like(per_image)
        for j in range(min(k_top, m)):
            p *= np.clip(m - per_image - j, 0, None) / (m - j)
        return p

    i2t = [100.0 * float(np.mean(1.0 - miss_probability(k))) for k in RECALL_KS]
    t2i = [100.0 * min(1.0, k / n_images) for k in RECALL_KS]
    return RetrievalMetrics(
        i2t=DirectionMetrics(*i2t, medr=math.nan, meanr=float(np.mean((m + 1) / (per_image + 1)))),
        t2i=DirectionMetrics(*t2i, medr=math.nan, meanr=(n_images + 1) / 2.0),
    )


# --------------------------------------------------------------------------- ranks


@dataclass(frozen=True)
class BlockSizes:
    """Tile shape of the blocked computation."""

    images: int
    captions: int


def default_block_sizes(measure: str, dim: int, device: torch.device) -> BlockSizes:
    """Tile shape for a measure, embedding size and device.

    Cosine tiles are matrix products: large tiles (1024 x 8192, 32 MB) keep BLAS efficient. On
    the CPU, order tiles are the same size: the fused kernel of
    :func:`train.similarity.order_violation` builds no (block_images, block_captions, d)
    broadcast, so memory is the tile itself, and a large tile keeps each call above
    ``FUSED_MIN_WORK`` (for d >= 32) and amortises its per-call overhead (the compiled kernel ran
    at 3.6 G elements/s on 128 x 256 tiles, 6.3 G on 1024 x 8192 at d = 1024). Its inner loop
    reads every caption row of the tile for each image row, so the tile's caption rows are kept
    near 32 MB and its image rows near 8 MB (1024 x 8192 at d = 1024, 256 x 1024 at d = 8192):
    at d = 8192 a 1024 x 8192 tile (256 MB of captions) ran 1.3x slower than 1024 x 1024 and
    1.8x slower than 256 x 1024. On CUDA the eager broadcast runs, in 256 x 4096 tiles and the
    16M-element chunks of :mod:`train.similarity`.
    """
    if measure == "cosine":
        return BlockSizes(images=1024, captions=8192)
    if device.type == "cuda":
        return BlockSizes(images=256, captions=4096)
    d = max(1, dim)
    return BlockSizes(images=min(1024, max(16, (1 << 21) // d)),
                      captions=min(8192, max(256, (1 << 23) // d)))


def _as_float_tensor(x: np.ndarray | torch.Tensor, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 2:
        raise UserError(f"{name} embeddings must be a 2-D array (rows, d), got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        t = t.float()
    return t.to(torch.float32)


def _check_inputs(images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor) -> None:
    n, m = images.shape[0], captions.shape[0]
    if images.shape[1] != captions.shape[1]:
        raise UserError(f"image and caption embeddings differ in size: d = {images.shape[1]} "
                        f"vs {captions.shape[1]}")
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
    for name, t in (("image", images), ("caption", captions)):
        for r0 in range(0, t.shape[0], 4096):  # in row blocks: no bool copy of the whole matrix
            finite_rows = torch.isfinite(t[r0:r0 + 4096]).all(dim=1)
            if not bool(finite_rows.all()):
                row = r0 + int(torch.nonzero(~finite_rows)[0, 0])
                raise UserError(f"{name} embeddings contain NaN or infinity (first at row {row})")


def _resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA device is available")
    return dev


def _ground_truth_scores(images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor,
                         measure: str, order_sqrt: bool, blocks: BlockSizes,
                         stats: TileStats) -> torch.Tensor:
    """S[gt(c), c] for every caption (M,): each image block against its own captions only."""
    m = captions.shape[0]
    gt = torch.empty(m, dtype=torch.float32, device=images.device)
    order = torch.argsort(caption_image, stable=True)  # captions grouped by image
    bounds = torch.searchsorted(caption_image[order], torch.arange(
        0, images.shape[0] + blocks.images, blocks.images, device=caption_image.device).clamp_max(
            images.shape[0]))
    for a, i0 in enumerate(range(0, images.shape[0], blocks.images)):
        i1 = min(i0 + blocks.images, images.shape[0])
        own = order[int(bounds[a]):int(bounds[a + 1])]
        for j0 in range(0, own.numel(), blocks.captions):
            sel = own[j0:j0 + blocks.captions]
            if bool((sel[1:] - sel[:-1] == 1).all()):  # grouped layout (VSE++): a view, no copy
                chosen = captions[int(sel[0]):int(sel[0]) + sel.numel()]
            else:
                chosen = captions.index_select(0, sel)
            tile = similarity(images[i0:i1], chosen, measure, order_sqrt)
            stats.record(*tile.shape)
            rows = caption_image.index_select(0, sel) - i0
            gt[sel] = tile[rows, torch.arange(sel.numel(), device=tile.device)]
    return gt


@torch.no_grad()
def ground_truth_ranks(images: np.ndarray | torch.Tensor, captions: np.ndarray | torch.Tensor,
                       caption_image: np.ndarray | torch.Tensor, measure: str, order_sqrt: bool = False,
                       device: str | torch.device | None = None, block_images: int | None = None,
                       block_captions: int | None = None, stats: TileStats | None = None,
                       on_tile: TileHook | None = None) -> Ranks:
    """1-based ranks of the ground truth for every query, in blocks.

    Args:
        images: (N, d) image embeddings.
        captions: (M, d) caption embeddings.
        caption_image: (M,) int, the image row of each caption (any number of captions per image,
            at least one each).
        measure: ``"order"`` or ``"cosine"``; ``order_sqrt`` takes the square root of the
            violation (rankings are unchanged in exact arithmetic).
        device: where to compute (default: CUDA when available).
        block_images, block_captions: tile shape (default :func:`default_block_sizes`).
        stats: filled with the number and largest shape of the tiles built.
        on_tile: called with ``(i0, i1, c0, c1)`` for every tile of the counting pass.

    Returns:
        :class:`Ranks` with ``i2t`` (N,) and ``t2i`` (M,) int64 ranks counted from 1.
    """
    if measure not in MEASURES:
        raise UserError(f"unknown measure {measure!r} (expected one of {', '.join(MEASURES)})")
    dev = _resolve_device(device)
    img = _as_float_tensor(images, "image").to(dev)
    cap = _as_float_tensor(captions, "caption").to(dev)
    ci = torch.as_tensor(np.asarray(caption_image) if not isinstance(caption_image, torch.Tensor)
                         else caption_image).to(device=dev, dtype=torch.int64)
    _check_inputs(img, cap, ci)
    n, m = img.shape[0], cap.shape[0]
    defaults = default_block_sizes(measure, img.shape[1], dev)
    blocks = BlockSizes(images=block_images or defaults.images, captions=block_captions or defaults.captions)
    stats = stats if stats is not None else TileStats()
    stats.block_images, stats.block_captions = blocks.images, blocks.captions

    gt = _ground_truth_scores(img, cap, ci, measure, order_sqrt, blocks, stats)
    best_gt = torch.full((n,), -math.inf, device=dev).scatter_reduce(0, ci, gt, reduce="amax")

    above_i2t = torch.zeros(n, dtype=torch.int64, device=dev)
    above_t2i = torch.zeros(m, dtype=torch.int64, device=dev)
    for i0 in range(0, n, blocks.images):
        i1 = min(i0 + blocks.images, n)
        for c0 in range(0, m, blocks.captions):
            c1 = min(c0 + blocks.captions, m)
            tile = similarity(img[i0:i1], cap[c0:c1], measure, order_sqrt)  # (B, Cb)
            stats.record(*tile.shape)
            if on_tile is not None:
                on_tile(i0, i1, c0, c1)
            tile_ci = ci[c0:c1]
            own = (tile_ci >= i0) & (tile_ci < i1)
            # ground-truth pairs never count against their own query, whatever the rounding
            not_gt = None
            if bool(own.any()):
                not_gt = torch.ones_like(tile, dtype=torch.bool)
                cols = torch.nonzero(own)[:, 0]
                not_gt[tile_ci[cols] - i0, cols] = False
            higher_i2t = tile > best_gt[i0:i1, None]
            higher_t2i = tile > gt[None, c0:c1]
            if not_gt is not None:
                higher_i2t &= not_gt
                higher_t2i &= not_gt
            above_i2t[i0:i1] += higher_i2t.sum(dim=1)
            above_t2i[c0:c1] += higher_t2i.sum(dim=0)
    return Ranks(i2t=(above_i2t + 1).cpu().numpy(), t2i=(above_t2i + 1).cpu().numpy())


# --------------------------------------------------------------------------- protocols


@dataclass(frozen=True)
class ProtocolResult:
    """Metrics of one protocol (fold-averaged for ``5cv``) and each fold's own metrics."""

    protocol: str
    metrics: RetrievalMetrics
    folds: list[RetrievalMetrics] = field(default_factory=list)
    n_images: int = 0
    n_captions: int = 0


def protocol_folds(protocol: str, n_images: int, fold_size: int = 1000) -> list[tuple[int, int]]:
    """Image row ranges ``[(start, stop), ...]`` a protocol evaluates.

    ``1k``: the first fold; ``5cv``: the five folds of ``fold_size`` images; ``5k``: the first
    ``5 * fold_size`` images as one set; ``all``: every image.
    """
    if protocol == "all":
        return [(0, n_images)]
    need = {"1k": fold_size, "5cv": 5 * fold_size, "5k": 5 * fold_size}.get(protocol)
    if need is None:
        raise UserError(f"unknown protocol {protocol!r} (expected one of {', '.join(PROTOCOLS)})")
    if n_images < need:
        raise UserError(f"protocol {protocol} needs at least {need} images, the embeddings have "
                        f"{n_images} (use --protocol all for a smaller test set)")
    if protocol == "5cv":
        return [(k * fold_size, (k + 1) * fold_size) for k in range(5)]
    return [(0, need)]


def select_images(images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor,
                  start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images ``start:stop`` with their captions.

    Returns (images (n, d), captions (k, d), caption_image (k,)), ``caption_image`` renumbered
    to start at 0.
    """
    if start == 0 and stop == images.shape[0]:
        return images, captions, caption_image
    keep = (caption_image >= start) & (caption_image < stop)
    return images[start:stop], captions[keep], caption_image[keep] - start


def evaluate_protocols(images: np.ndarray | torch.Tensor, captions: np.ndarray | torch.Tensor,
                       caption_image: np.ndarray | torch.Tensor, measure: str,
                       protocols: Sequence[str] = ("all",), order_sqrt: bool = False,
                       fold_size: int = 1000, device: str | torch.device | None = None,
                       block_images: int | None = None, block_captions: int | None = None,
                       on_tile: TileHook | None = None) -> dict[str, ProtocolResult]:
    """Evaluate embeddings under each protocol.

    Args:
        images: (N, d); captions: (M, d); caption_image: (M,) image row of each caption.
        measure, order_sqrt: the similarity (see :func:`ground_truth_ranks`).
        protocols: names from :data:`PROTOCOLS`, evaluated in the given order.
        fold_size: images per fold (1000 for COCO; smaller in tests).
        device, block_images, block_captions, on_tile: as in :func:`ground_truth_ranks` (tile
            indices of ``on_tile`` are relative to the fold).

    Returns:
        ``{protocol: ProtocolResult}``.
    """
    img = _as_float_tensor(images, "image")
    cap = _as_float_tensor(captions, "caption")
    ci = torch.as_tensor(np.asarray(caption_image) if not isinstance(caption_image, torch.Tensor)
                         else caption_image).to(torch.int64)
    if ci.shape != (cap.shape[0],):
        raise UserError(f"caption_image must have one entry per caption ({cap.shape[0]}), got shape "
                        f"{tuple(ci.shape)}")
    results: dict[str, ProtocolResult] = {}
    for protocol in protocols:
        folds = []
        n_cap = 0
        ranges = protocol_folds(protocol, img.shape[0], fold_size)
        for start, stop in ranges:
            f_img, f_cap, f_ci = select_images(img, cap, ci, start, stop)
            n_cap += f_cap.shape[0]
            ranks = ground_truth_ranks(f_img, f_cap, f_ci, measure, order_sqrt, device,
                                       block_images, block_captions, on_tile=on_tile)
            folds.append(metrics_from_ranks(ranks))
        metrics = folds[0] if len(folds) == 1 else average_metrics(folds)
        results[protocol] = ProtocolResult(protocol, metrics, folds if len(folds) > 1 else [],
                                           n_images=sum(b - a for a, b in ranges), n_captions=n_cap)
    return results


def evaluate_protocol(images: np.ndarray | torch.Tensor, captions: np.ndarray | torch.Tensor,
                      caption_image: np.ndarray | torch.Tensor, measure: str, protocol: str = "all",
                      order_sqrt: bool = False, fold_size: int = 1000,
                      device: str | torch.device | None = None) -> RetrievalMetrics:
    """Metrics of one protocol (fold-averaged for ``5cv``); shapes as :func:`evaluate_protocols`.

    This is what validation during training calls: ``metrics.rsum`` is the model-selection score.
    """
    return evaluate_protocols(images, captions, caption_image, measure, [protocol], order_sqrt,
                              fold_size, device)[protocol].metrics


def vsepp_caption_image(n_images: int, captions_per_image: int = 5) -> np.ndarray:
    """The VSE++ layout: captions ``5i .. 5i+4`` belong to image ``i``; returns (N * k,) int64."""
    return np.repeat(np.arange(n_images, dtype=np.int64), captions_per_image)


def select_image_rows(images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor,
                      rows: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images at ``rows`` (any order, distinct) with their captions, renumbered to ``0..len(rows)-1``.

    Returns (images (R, d), captions (k, d), caption_image (k,)); captions keep their relative order.
    """
    rows_t = torch.as_tensor(np.asarray(rows) if not isinstance(rows, torch.Tensor) else rows,
                             dtype=torch.int64)
    new_index = torch.full((images.shape[0],), -1, dtype=torch.int64)
    new_index[rows_t] = torch.arange(rows_t.numel())
    mapped = new_index[caption_image.cpu()]
    keep = mapped >= 0
    return images[rows_t.to(images.device)], captions[keep.to(captions.device)], mapped[keep]
