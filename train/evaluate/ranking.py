"""Blocked ranking metrics for image-text retrieval, and the COCO/Flickr evaluation protocols.

The similarity matrix ``S[i, c]`` (image ``i``, caption ``c``; larger is more similar) is never
built whole: a *tile source* returns it tile by tile (``block_images x block_captions``), from
embeddings through :func:`train.similarity.similarity` or from a precomputed matrix (another
codebase's, e.g. SCAN's, read from a memory-mapped ``.npy``), and one counting kernel,
:func:`rank_tiles`, turns the tiles into ranks. A query's rank is found by *counting*, not by
sorting.

Tie rule (pessimistic): a candidate counts against the ground truth when it scores *at least as
high* as the ground truth:

* text-to-image: ``rank(c) = 1 + #{images i != gt(c) : S[i, c] >= S[gt(c), c]}``;
* image-to-text: ``rank(i) = 1 + #{captions c' not of image i : S[i, c'] >= max_{c of i} S[i, c]}``,
  which is the best rank over the image's captions; an image's own other captions never count
  against it.

So a model that scores every candidate alike (a constant caption encoder, d = 0, empty captions,
scores that overflow to -inf) gets the worst ranks, not the best. The naive reference in the tests
sorts each query's candidates by descending score, ground truth *last* among equal scores, and takes
the 1-based position of the first ground truth: the same numbers. A NaN score (a NaN in a given
similarity matrix) counts as a tie against the ground truth:
a NaN candidate counts against it, and a NaN ground-truth score lets every candidate count (the
kernel counts ``candidates - #{S < threshold}``, and every comparison with NaN is false). Each
direction reports ``ties``, the number of queries whose ground-truth score is tied by at least one
counted candidate (a NaN counts as a tie); the evaluation prints one warning line when more than 1%
of a direction's queries tie, one when a set of embeddings is constant, and one when scores are NaN.

Ties are exact float equality of the computed scores, and the ground truth's score is always taken
from the very tile that is counted (below), so the same pair is never compared with a differently
rounded copy of itself. Two *different* pairs whose exact scores are equal (duplicate rows) get the
same float when the similarity is computed the same way for both: true of the order-violation
kernels and, as far as we saw with MKL, of products of the default tile sizes (MKL rounds a row's
products differently depending on its position in products of a few rows or columns, so a tiny
problem with inexact duplicate rows may break such a tie either way, as any implementation would).

Two passes over the tiles. Captions are grouped by image (sorted by ``caption_image``; a copy when
the input is not), images are cut into row blocks and each row block's captions into column
chunks, so every ground-truth pair lies in a *home* tile (a row block and one of its own chunks).
The first pass computes the home tiles: the ground-truth scores ``S[gt(c), c]`` and each image's
best ground-truth score come from them, and a home tile whose row block has a single chunk (the
usual case: 1024 images x 5 captions per tile) is counted right away. The second pass counts every
other tile (a row block with several chunks recomputes its home tiles, which gives the same bits).
Each counted tile adds, per row and column, ``#{S >= threshold}`` (as above) and ``#{S >
threshold}`` (for the ties), minus what the tile's own ground-truth pairs contributed. With
``topk``, the same pass keeps each query's K best candidates (per-tile top-K merged across tiles;
ties: lower index first; NaN last, listed as -inf). Peak memory beyond the inputs:

* cosine: the tile, ``block_images x block_captions`` float32 (plus bool tiles of the same shape); the
  cosine is that of unit rows (:func:`unit_rows`: any row not of norm 1 is scaled in float64, which
  copies that side's matrix once; a model's own unit-norm output is used as it is, bit for bit);
* order on the CPU: the tile (default at most 1024 x 8192, 32 MB; 256 x 1024 at d = 8192), from the
  fused kernels of :func:`train.similarity.order_violation`, which build no broadcast. The
  evaluation chooses the kernel once for all its tiles: the compiled one when the total work
  ``sum of N x M x d`` over its folds reaches ``COMPILE_MIN_WORK`` (it then compiles first, with a
  one-line message) or it is already compiled, else the blocked one;
* order on CUDA: the tile plus the broadcast inside ``order_violation``, at most
  ``min(block_images x block_captions x d, max(2**24, block_images x d))`` float32 elements (the
  16M-element chunk of :mod:`train.similarity`, 64 MB);
* a precomputed matrix: the tile, read from the memory map in float32 (float64 for a float64
  matrix, never converted up);
* with ``topk``: ``(N + M) x K`` scores and indices.

No Python loop runs per query; loops run over blocks only.

Metrics follow VSE++ and the papers: R@K in percent (rank <= K), median rank ``floor(median)``
and mean rank of the 1-based ranks.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

import train.similarity as similarity_module
from train.similarity import similarity
from vsecore.device import resolve_device
from vsecore.errors import UserError

PROTOCOLS = ("1k", "5cv", "5k", "all")
#: how messages name the protocols (``train.evaluate.tables`` labels table rows the same way)
PROTOCOL_NAMES = {"1k": "COCO-1k", "5cv": "COCO-5cv", "5k": "COCO-5k", "all": "all"}
MEASURES = ("order", "cosine")
RECALL_KS = (1, 5, 10)
#: ``order_kernel`` values: ``auto`` (by the evaluation's work), or one kernel for every tile
ORDER_KERNELS = ("auto", "eager", "blocked", "compiled")
#: a direction warns when more than this share of its queries have a tied ground-truth score
TIE_WARNING_SHARE = 0.01

#: a tile callback receives (image_start, image_stop, caption_start, caption_stop) of every tile
TileHook = Callable[[int, int, int, int], None]
#: ``(i0, i1, c0, c1) -> S[i0:i1, c0:c1]``: a (B, Cb) float tile of the similarity matrix, on the
#: ranking device, larger = more similar
TileSource = Callable[[int, int, int, int], torch.Tensor]
#: where warnings and notes go: one line per call
Log = Callable[[str], None]

#: placeholder index of an empty top-K slot: sorts after every real index
_NO_INDEX = 1 << 62


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class DirectionMetrics:
    """Retrieval metrics of one direction: recalls in percent, ranks counted from 1.

    ``ties``: queries whose ground-truth score is tied by at least one candidate counted against it
    (summed over folds in a fold average).
    """

    r1: float
    r5: float
    r10: float
    medr: float
    meanr: float
    ties: int = 0

    def to_dict(self) -> dict[str, float]:
        """``{"r1", "r5", "r10", "medr", "meanr", "ties"}``."""
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
    """Ranks of one evaluated set, in the order of its inputs.

    ``i2t`` (N,) and ``t2i`` (M,): 1-based pessimistic ranks of the ground truth. ``i2t_ties`` /
    ``t2i_ties``: how many of the candidates counted against the ground truth tie with it (equal
    score or NaN); ``rank - ties`` is the optimistic rank. ``nan_scores``: NaN similarities seen
    (not counted, 0, where none can occur: order violations, cosines of unit rows).
    With ``topk``: ``i2t_topk`` (N, K) caption indices and ``t2i_topk`` (M, K) image indices of
    each query's best candidates (score descending, lower index first among equal scores, NaN last),
    with their scores in ``*_topk_scores``.
    """

    i2t: np.ndarray
    t2i: np.ndarray
    i2t_ties: np.ndarray
    t2i_ties: np.ndarray
    nan_scores: int = 0
    i2t_topk: np.ndarray | None = None
    i2t_topk_scores: np.ndarray | None = None
    t2i_topk: np.ndarray | None = None
    t2i_topk_scores: np.ndarray | None = None


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


def direction_metrics(ranks: np.ndarray | torch.Tensor, ties: int = 0) -> DirectionMetrics:
    """Metrics of one direction from 1-based ranks (Q,); ``ties``: the number of tied queries."""
    r = np.asarray(torch.as_tensor(ranks).cpu().numpy() if isinstance(ranks, torch.Tensor) else ranks)
    if r.size == 0:
        raise UserError("no queries to evaluate")
    recalls = [100.0 * float(np.mean(r <= k)) for k in RECALL_KS]
    # VSE++ reports floor(median(0-based)) + 1, which is floor(median) of the 1-based ranks
    return DirectionMetrics(r1=recalls[0], r5=recalls[1], r10=recalls[2],
                            medr=float(np.floor(np.median(r))), meanr=float(np.mean(r)), ties=int(ties))


def metrics_from_ranks(ranks: Ranks) -> RetrievalMetrics:
    """Both directions' metrics from :class:`Ranks`."""
    return RetrievalMetrics(
        i2t=direction_metrics(ranks.i2t, int(np.count_nonzero(ranks.i2t_ties))),
        t2i=direction_metrics(ranks.t2i, int(np.count_nonzero(ranks.t2i_ties))))


def average_metrics(folds: Sequence[RetrievalMetrics]) -> RetrievalMetrics:
    """Average every metric over folds (COCO-5cv, as the papers: medr and meanr averaged too); ties summed."""
    def mean_of(direction: str) -> DirectionMetrics:
        values = [getattr(f, direction) for f in folds]
        return DirectionMetrics(**{k: float(np.mean([getattr(v, k) for v in values]))
                                   for k in ("r1", "r5", "r10", "medr", "meanr")},
                                ties=sum(v.ties for v in values))
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


# --------------------------------------------------------------------------- the counting kernel


@dataclass(frozen=True)
class BlockSizes:
    """Tile shape of the blocked computation (upper bounds: blocks are split evenly)."""

    images: int
    captions: int


def default_block_sizes(measure: str | None, dim: int, device: torch.device) -> BlockSizes:
    """Tile shape for a measure (``None``: a precomputed matrix), embedding size and device.

    Cosine tiles are matrix products: large tiles (1024 x 8192, 32 MB) keep BLAS efficient; a
    precomputed matrix is read in the same tiles. On the CPU, order tiles are the same size: the
    fused kernels of :func:`train.similarity.order_violation` build no (block_images,
    block_captions, d) broadcast, so memory is the tile itself, and a large tile amortises their
    per-call overhead (the compiled kernel ran at 3.6 G elements/s on 128 x 256 tiles, 6.3 G on
    1024 x 8192 at d = 1024). Its inner loop reads every caption row of the tile for each image
    row, so the tile's caption rows are kept near 32 MB and its image rows near 8 MB (1024 x 8192
    at d = 1024, 256 x 1024 at d = 8192): at d = 8192 a 1024 x 8192 tile (256 MB of captions) ran
    1.3x slower than 1024 x 1024 and 1.8x slower than 256 x 1024. On CUDA the eager broadcast
    runs, in 256 x 4096 tiles and the 16M-element chunks of :mod:`train.similarity`.
    """
    if measure in (None, "cosine"):
        return BlockSizes(images=1024, captions=8192)
    if device.type == "cuda":
        return BlockSizes(images=256, captions=4096)
    d = max(1, dim)
    return BlockSizes(images=min(1024, max(16, (1 << 21) // d)),
                      captions=min(8192, max(256, (1 << 23) // d)))


def _split_range(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` in the fewest pieces of at most ``size``, of equal length (+-1): no sliver of a
    few rows, whose products a BLAS may round differently."""
    count = stop - start
    if count <= 0:
        return []
    pieces = -(-count // max(1, size))
    return [(start + count * j // pieces, start + count * (j + 1) // pieces) for j in range(pieces)]


def _stable_topk(scores: torch.Tensor, k: int, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top ``k`` of each row of ``scores`` (Q, C): values and positions, descending, NaN as -inf.

    Among candidates equal to the k-th score, those with the lowest index in ``candidates`` (C,)
    are kept (``torch.topk`` leaves that choice unspecified).
    """
    s = scores.masked_fill(torch.isnan(scores), -math.inf)
    values, positions = s.topk(k, dim=1)
    kth = values[:, -1:]
    above = (s > kth).sum(1)
    tied = (s == kth).sum(1)
    ambiguous = torch.nonzero(above + tied > k)[:, 0]
    if ambiguous.numel():
        sub = s.index_select(0, ambiguous)
        sub_kth = kth.index_select(0, ambiguous)
        need = k - above.index_select(0, ambiguous)  # >= 1: the k-th score itself is tied
        # the tied candidates with the lowest indices: indices are distinct, so this is deterministic
        key = torch.where(sub == sub_kth, candidates[None, :], _NO_INDEX)
        lowest = key.topk(int(need.max()), dim=1, largest=False).indices
        lowest = torch.where(torch.arange(lowest.shape[1], device=s.device)[None, :] < need[:, None],
                             lowest, lowest[:, :1])
        take = (sub > sub_kth).scatter_(1, lowest, True)
        chosen = torch.nonzero(take)[:, 1].view(-1, k)  # k positions per row
        positions[ambiguous] = chosen
        values[ambiguous] = sub.gather(1, chosen)
    return values, positions


class _TopK:
    """The K best candidates of ``queries`` queries, merged tile by tile (memory O(queries x K))."""

    def __init__(self, queries: int, k: int, device: torch.device) -> None:
        self.queries, self.k, self.device = queries, k, device
        self.values: torch.Tensor | None = None
        self.indices = torch.full((queries, k), _NO_INDEX, dtype=torch.int64, device=device)

    def update(self, q0: int, q1: int, scores: torch.Tensor, candidates: torch.Tensor) -> None:
        """Merge ``scores`` (q1 - q0, C) of candidates with indices ``candidates`` (C,) into queries q0:q1."""
        if self.values is None:
            self.values = torch.full((self.queries, self.k), -math.inf, dtype=scores.dtype,
                                     device=self.device)
        values, positions = _stable_topk(scores, min(self.k, scores.shape[1]), candidates)
        all_values = torch.cat([self.values[q0:q1], values], dim=1)
        all_indices = torch.cat([self.indices[q0:q1], candidates[positions]], dim=1)
        # order by index, then a stable sort by score: equal scores keep the lower index first
        by_index = all_indices.argsort(dim=1)
        all_values, all_indices = all_values.gather(1, by_index), all_indices.gather(1, by_index)
        best = all_values.sort(dim=1, descending=True, stable=True).indices[:, :self.k]
        self.values[q0:q1] = all_values.gather(1, best)
        self.indices[q0:q1] = all_indices.gather(1, best)


class _Counts:
    """Per-query counts of one ranking: candidates ``>=`` and ``>`` the ground truth, both directions."""

    def __init__(self, n: int, caption_image: torch.Tensor, device: torch.device, topk: int,
                 caption_ids: torch.Tensor, count_nan: bool) -> None:
        m = caption_image.numel()
        self.ci = caption_image
        self.caption_ids = caption_ids
        self.count_nan = count_nan
        self.device = device
        zeros = {"dtype": torch.int64, "device": device}
        self.against_i2t, self.above_i2t = torch.zeros(n, **zeros), torch.zeros(n, **zeros)
        self.against_t2i, self.above_t2i = torch.zeros(m, **zeros), torch.zeros(m, **zeros)
        self.nan = torch.zeros((), **zeros)
        self.gt: torch.Tensor | None = None  # S[gt(c), c] (M,), in the tiles' dtype
        self.best: torch.Tensor | None = None  # max over an image's captions (N,), NaN as -inf
        self.n, self.m = n, m
        self.topk_i2t = _TopK(n, min(topk, m), device) if topk > 0 else None
        self.topk_t2i = _TopK(m, min(topk, n), device) if topk > 0 else None

    def own_scores(self, tile: torch.Tensor, i0: int, c0: int, c1: int) -> torch.Tensor:
        """The ground-truth pairs' scores (c1 - c0,) in a home tile (all its captions are of its images)."""
        cols = torch.arange(c1 - c0, device=tile.device)
        return tile[self.ci[c0:c1] - i0, cols]

    def set_ground_truth(self, tile: torch.Tensor, i0: int, c0: int, c1: int) -> None:
        """Take the ground-truth scores of captions c0:c1 from their home tile."""
        if self.gt is None:
            self.gt = torch.empty(self.m, dtype=tile.dtype, device=self.device)
            self.best = torch.full((self.n,), -math.inf, dtype=tile.dtype, device=self.device)
        own = self.own_scores(tile, i0, c0, c1)
        self.gt[c0:c1] = own
        # a NaN caption score must not hide the image's other captions: its own rank is the worst
        self.best.scatter_reduce_(0, self.ci[c0:c1], own.masked_fill(torch.isnan(own), -math.inf), "amax")

    def count(self, tile: torch.Tensor, i0: int, i1: int, c0: int, c1: int, home: bool) -> None:
        """Add the tile S[i0:i1, c0:c1] to the counts; ``home``: it holds ground-truth pairs."""
        rows, cols = tile.shape
        row_threshold = self.best[i0:i1, None]
        col_threshold = self.gt[None, c0:c1]
        # ">= threshold" counted as "not < threshold": NaN scores and NaN thresholds count too
        self.against_i2t[i0:i1] += cols - (tile < row_threshold).sum(1, dtype=torch.int32)
        self.above_i2t[i0:i1] += (tile > row_threshold).sum(1, dtype=torch.int32)
        self.against_t2i[c0:c1] += rows - (tile < col_threshold).sum(0, dtype=torch.int32)
        self.above_t2i[c0:c1] += (tile > col_threshold).sum(0, dtype=torch.int32)
        if self.count_nan:
            self.nan += torch.isnan(tile).sum()
        if home:
            # a caption and its own image never count against each other: take back exactly what
            # the comparisons above counted for those pairs
            own = self.own_scores(tile, i0, c0, c1)
            images = self.ci[c0:c1]
            best = self.best[images]
            self.against_i2t.index_add_(0, images, -(~(own < best)).long())
            self.above_i2t.index_add_(0, images, -(own > best).long())
            gt = self.gt[c0:c1]
            self.against_t2i[c0:c1] -= (~(own < gt)).long()
            self.above_t2i[c0:c1] -= (own > gt).long()
        if self.topk_i2t is not None:
            self.topk_i2t.update(i0, i1, tile, self.caption_ids[c0:c1])
            self.topk_t2i.update(c0, c1, tile.t(), torch.arange(i0, i1, device=tile.device))

    def ranks(self) -> Ranks:
        def numpy(t: torch.Tensor | None) -> np.ndarray | None:
            return None if t is None else t.cpu().numpy()
        return Ranks(
            i2t=numpy(self.against_i2t + 1), t2i=numpy(self.against_t2i + 1),
            i2t_ties=numpy(self.against_i2t - self.above_i2t),
            t2i_ties=numpy(self.against_t2i - self.above_t2i),
            nan_scores=int(self.nan),
            i2t_topk=numpy(self.topk_i2t.indices) if self.topk_i2t else None,
            i2t_topk_scores=numpy(self.topk_i2t.values) if self.topk_i2t else None,
            t2i_topk=numpy(self.topk_t2i.indices) if self.topk_t2i else None,
            t2i_topk_scores=numpy(self.topk_t2i.values) if self.topk_t2i else None)


def _counting_threads(device: torch.device) -> int:
    """Intra-op threads for the counting passes: torch's, or one on an oversubscribed CPU.

    The passes are short memory-bound ops (compare, sum) on the tile. On a CPU with more runnable
    processes than cores, every parallel region's barrier waits for a descheduled thread: on the
    2-core development machine at load 10, the four comparison passes over a 1024 x 5120 tile took
    190 to 250 ms with 2 threads and 56 to 80 ms with 1 (the tile's matrix product: 370 to 490 ms).
    The counts are exact integers either way.
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        return threads
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return threads
    return 1 if load > (os.cpu_count() or 1) else threads


@contextmanager
def _intra_op_threads(threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    if threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@torch.no_grad()
def rank_tiles(tiles: TileSource, caption_image: torch.Tensor, n_images: int, blocks: BlockSizes,
               device: torch.device, topk: int = 0, stats: TileStats | None = None,
               on_tile: TileHook | None = None, caption_ids: torch.Tensor | None = None,
               nan_possible: bool = True) -> Ranks:
    """Ranks of every query from the tiles of a similarity matrix: the one counting kernel.

    Args:
        tiles: the tile source, ``(i0, i1, c0, c1) -> S[i0:i1, c0:c1]`` on ``device``.
        caption_image: (M,) int64, the image of each caption, grouped (non-decreasing), every image
            in ``0..n_images-1`` with at least one caption.
        n_images: N; blocks: the largest tile (split evenly, see the module docstring).
        topk: K > 0 also keeps each query's K best candidates.
        stats: filled with the number and largest shape of the tiles built.
        on_tile: called with ``(i0, i1, c0, c1)`` for every tile counted (each pair exactly once).
        caption_ids: (M,) distinct int64, the index the top-K lists give each caption (and break
            ties by); default ``0..M-1``.
        nan_possible: ``False`` when no score can be NaN (it saves one pass over every tile to
            count them; NaN scores rank the same either way).

    Returns:
        :class:`Ranks` in the given order.
    """
    ci = caption_image.to(device=device, dtype=torch.int64)
    if caption_ids is None:
        caption_ids = torch.arange(ci.numel(), device=device)
    stats = stats if stats is not None else TileStats()
    row_blocks = _split_range(0, n_images, blocks.images)
    starts = torch.tensor([i0 for i0, _ in row_blocks] + [n_images], dtype=torch.int64)
    bounds = torch.searchsorted(ci.cpu(), starts).tolist()
    chunks = [_split_range(bounds[r], bounds[r + 1], blocks.captions) for r in range(len(row_blocks))]
    counts = _Counts(n_images, ci, device, topk, caption_ids.to(device), nan_possible)
    threads = _counting_threads(device)

    def tile_of(i0: int, i1: int, c0: int, c1: int) -> torch.Tensor:
        tile = tiles(i0, i1, c0, c1)
        stats.record(*tile.shape)
        return tile

    def count(tile: torch.Tensor, i0: int, i1: int, c0: int, c1: int, home: bool) -> None:
        with _intra_op_threads(threads):
            counts.count(tile, i0, i1, c0, c1, home)
        if on_tile is not None:
            on_tile(i0, i1, c0, c1)

    # pass 1: the ground-truth scores, from the home tiles that will be counted
    for (i0, i1), own_chunks in zip(row_blocks, chunks, strict=True):
        for c0, c1 in own_chunks:
            tile = tile_of(i0, i1, c0, c1)
            counts.set_ground_truth(tile, i0, c0, c1)
            if len(own_chunks) == 1:  # the row block's thresholds are complete: count it now
                count(tile, i0, i1, c0, c1, home=True)
            del tile
    # pass 2: every other tile
    for r, (i0, i1) in enumerate(row_blocks):
        for home_r, own_chunks in enumerate(chunks):
            if home_r == r and len(own_chunks) == 1:
                continue
            for c0, c1 in own_chunks:
                count(tile_of(i0, i1, c0, c1), i0, i1, c0, c1, home=home_r == r)
    return counts.ranks()


# --------------------------------------------------------------------------- inputs


def _as_float_tensor(x: np.ndarray | torch.Tensor, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 2:
        raise UserError(f"{name} embeddings must be a 2-D array (rows, d), got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        t = t.float()
    return t.to(torch.float32)


def _as_caption_image(caption_image: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(caption_image, torch.Tensor):
        return caption_image.to(torch.int64)
    return torch.as_tensor(np.asarray(caption_image)).to(torch.int64)


def _check_caption_image(caption_image: torch.Tensor, n: int, m: int) -> None:
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


@dataclass(frozen=True)
class _InputCheck:
    """What :func:`_check_embeddings` learnt: warnings about usable but suspicious inputs."""

    notes: list[str]


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


def _check_embeddings(images: torch.Tensor, captions: torch.Tensor,
                      caption_image: torch.Tensor) -> _InputCheck:
    """Raise on unusable inputs; note usable but suspicious ones (constant embeddings).

    One pass per matrix, in row blocks (no bool copy of the whole matrix): the column-wise minimum
    and maximum tell both whether everything is finite (NaN and infinity propagate) and whether all
    rows are identical (minimum == maximum in every column).
    """
    if images.shape[1] != captions.shape[1]:
        raise UserError(f"image and caption embeddings differ in size: d = {images.shape[1]} "
                        f"vs {captions.shape[1]}")
    _check_caption_image(caption_image, images.shape[0], captions.shape[0])
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
    return _InputCheck(notes)


def _order_kernel_options(measure: str, device: torch.device, dim: int, work: int, order_kernel: str,
                          log: Log) -> dict[str, bool | None]:
    """``fused`` / ``compile`` arguments of the order violation for every tile of one evaluation.

    Decided once for the whole evaluation (``work``: the sum of N x M x d over its folds), so that
    every tile takes the same kernel (the same rounding) and the compilation is paid only when the
    whole evaluation amortises it, never because one tile is large.
    """
    if order_kernel not in ORDER_KERNELS:
        raise UserError(f"unknown order kernel {order_kernel!r} (expected one of {', '.join(ORDER_KERNELS)})")
    if measure != "order":
        return {}
    if order_kernel == "eager" or device.type != "cpu":
        return {"fused": False}
    if order_kernel == "blocked":
        return {"fused": True, "compile": False}
    if order_kernel == "compiled" or work >= similarity_module.COMPILE_MIN_WORK:
        similarity_module.prepare_compiled_kernel(dim, log)
        return {"fused": True, "compile": True}
    # the compiled kernel only if an earlier evaluation of this process compiled it already
    return {"fused": True, "compile": None}


def _embedding_ranks(images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor, measure: str,
                     order_sqrt: bool, device: torch.device, blocks: BlockSizes,
                     kernel: dict[str, bool | None], topk: int, stats: TileStats | None,
                     on_tile: TileHook | None, nan_possible: bool) -> Ranks:
    """:func:`rank_tiles` on embeddings (already checked, on ``device``), any caption order."""
    order = None
    if caption_image.numel() > 1 and not bool((caption_image[1:] >= caption_image[:-1]).all()):
        # the counting kernel needs captions grouped by image: one sorted copy of the captions
        order = torch.argsort(caption_image, stable=True)
        captions, caption_image = captions.index_select(0, order), caption_image[order]

    def tiles(i0: int, i1: int, c0: int, c1: int) -> torch.Tensor:
        return similarity(images[i0:i1], captions[c0:c1], measure, order_sqrt, **kernel)

    ranks = rank_tiles(tiles, caption_image, images.shape[0], blocks, device, topk, stats, on_tile, order,
                       nan_possible)
    return ranks if order is None else _unsort_captions(ranks, order.cpu().numpy())


def _unsort_captions(ranks: Ranks, order: np.ndarray) -> Ranks:
    """Ranks computed on captions ``order`` (sorted by image), back in the input's caption order.

    (The top-K lists already name captions by their input index: ``caption_ids`` of :func:`rank_tiles`.)
    """
    def back(values: np.ndarray | None) -> np.ndarray | None:
        if values is None:
            return None
        out = np.empty_like(values)
        out[order] = values
        return out

    return Ranks(i2t=ranks.i2t, t2i=back(ranks.t2i), i2t_ties=ranks.i2t_ties, t2i_ties=back(ranks.t2i_ties),
                 nan_scores=ranks.nan_scores, i2t_topk=ranks.i2t_topk, i2t_topk_scores=ranks.i2t_topk_scores,
                 t2i_topk=back(ranks.t2i_topk), t2i_topk_scores=back(ranks.t2i_topk_scores))


def _blocks(measure: str | None, dim: int, device: torch.device, block_images: int | None,
            block_captions: int | None) -> BlockSizes:
    defaults = default_block_sizes(measure, dim, device)
    for name, value in (("block_images", block_images), ("block_captions", block_captions)):
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    return BlockSizes(images=block_images or defaults.images, captions=block_captions or defaults.captions)


@torch.no_grad()
def ground_truth_ranks(images: np.ndarray | torch.Tensor, captions: np.ndarray | torch.Tensor,
                       caption_image: np.ndarray | torch.Tensor, measure: str, order_sqrt: bool = False,
                       device: str | torch.device | None = None, block_images: int | None = None,
                       block_captions: int | None = None, stats: TileStats | None = None,
                       on_tile: TileHook | None = None, topk: int = 0, order_kernel: str = "auto",
                       log: Log | None = None) -> Ranks:
    """1-based ground-truth ranks (pessimistic, see the module docstring) for every query, in blocks.

    Args:
        images: (N, d) image embeddings.
        captions: (M, d) caption embeddings.
        caption_image: (M,) int, the image row of each caption (any number of captions per image,
            at least one each, in any order).
        measure: ``"order"`` or ``"cosine"``; ``order_sqrt`` takes the square root of the
            violation (rankings are unchanged in exact arithmetic).
        device: where to compute (default: CUDA when available).
        block_images, block_captions: largest tile (default :func:`default_block_sizes`).
        stats: filled with the number and largest shape of the tiles built.
        on_tile: called with ``(i0, i1, c0, c1)`` for every tile counted (captions grouped by image).
        topk: K > 0 also returns each query's K best candidates.
        order_kernel: ``auto`` or the order-violation kernel of every tile (see :data:`ORDER_KERNELS`).
        log: where the warnings go (constant embeddings, ties, NaN scores; default: stderr).

    Returns:
        :class:`Ranks` with ``i2t`` (N,) and ``t2i`` (M,) int64 ranks counted from 1.
    """
    if measure not in MEASURES:
        raise UserError(f"unknown measure {measure!r} (expected one of {', '.join(MEASURES)})")
    log = log or _stderr
    dev = resolve_device(device)
    img = _as_float_tensor(images, "image").to(dev)
    cap = _as_float_tensor(captions, "caption").to(dev)
    ci = _as_caption_image(caption_image).to(dev)
    check = _check_embeddings(img, cap, ci)
    d = img.shape[1]
    blocks = _blocks(measure, d, dev, block_images, block_captions)
    if stats is not None:
        stats.block_images, stats.block_captions = blocks.images, blocks.captions
    kernel = _order_kernel_options(measure, dev, d, img.shape[0] * cap.shape[0] * d, order_kernel, log)
    if measure == "cosine":
        img, cap = unit_rows(img), unit_rows(cap)
    # no NaN score: the order violation sums non-negative terms (at worst +inf, never inf - inf) and
    # a cosine of unit rows is at most 1 in magnitude
    nan_possible = False
    ranks = _embedding_ranks(img, cap, ci, measure, order_sqrt, dev, blocks, kernel, topk, stats, on_tile,
                             nan_possible)
    for line in check.notes + _problems({"": [ranks]}):
        log(line)
    return ranks


# --------------------------------------------------------------------------- precomputed similarities


SIMILARITY_DTYPES = (np.float16, np.float32, np.float64)


def check_similarity_matrix(sims: np.ndarray, caption_image: np.ndarray | torch.Tensor,
                            transposed: bool = False, name: str = "the similarity matrix") -> None:
    """Raise a :class:`UserError` unless ``sims`` is an (N images, M captions) float matrix for
    ``caption_image`` (M,), grouped by image; with ``transposed``, (M, N)."""
    ci = _as_caption_image(caption_image)
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
    _check_caption_image(ci, n, m)
    if m > 1 and not bool((ci[1:] >= ci[:-1]).all()):
        raise UserError(f"{name}: the captions must be grouped by image (all captions of image 0, then "
                        "of image 1, ...)")


def _matrix_tiles(sims: np.ndarray, transposed: bool, device: torch.device, row0: int = 0,
                  col0: int = 0) -> TileSource:
    """Tiles of a (memory-mapped) matrix, offset by ``(row0, col0)``: float32, or float64 if it is float64."""
    dtype = np.float64 if sims.dtype == np.float64 else np.float32

    def tiles(i0: int, i1: int, c0: int, c1: int) -> torch.Tensor:
        if transposed:
            block = sims[col0 + c0:col0 + c1, row0 + i0:row0 + i1].T
        else:
            block = sims[row0 + i0:row0 + i1, col0 + c0:col0 + c1]
        # a copy: the tile in memory (a memory map's pages are read-only)
        return torch.from_numpy(np.array(block, dtype=dtype, order="C")).to(device)

    return tiles


# --------------------------------------------------------------------------- protocols


@dataclass(frozen=True)
class FoldRanks:
    """The ranks of one fold: images ``start:stop`` and the captions ``caption_index`` (k,) of the input."""

    start: int
    stop: int
    caption_index: np.ndarray
    ranks: Ranks


@dataclass(frozen=True)
class ProtocolResult:
    """Metrics of one protocol (fold-averaged for ``5cv``), each fold's own metrics, and the ranks."""

    protocol: str
    metrics: RetrievalMetrics
    folds: list[RetrievalMetrics] = field(default_factory=list)
    n_images: int = 0
    n_captions: int = 0
    fold_ranks: list[FoldRanks] = field(default_factory=list)


def protocol_folds(protocol: str, n_images: int, fold_size: int = 1000,
                   have: str = "the embeddings have") -> list[tuple[int, int]]:
    """Image row ranges ``[(start, stop), ...]`` a protocol evaluates.

    ``1k``: the first fold; ``5cv``: the five folds of ``fold_size`` images; ``5k``: the first
    ``5 * fold_size`` images as one set; ``all``: every image. ``have`` words the error when there
    are too few images (e.g. ``"the test split has"``).
    """
    if protocol == "all":
        return [(0, n_images)]
    need = {"1k": fold_size, "5cv": 5 * fold_size, "5k": 5 * fold_size}.get(protocol)
    if need is None:
        raise UserError(f"unknown protocol {protocol!r} (expected one of {', '.join(PROTOCOLS)})")
    if fold_size < 1:
        raise UserError(f"--fold-size must be at least 1, got {fold_size}")
    if n_images < need:
        raise UserError(f"protocol {protocol} needs at least {need} images, {have} "
                        f"{n_images} (use --protocol all for a smaller test set)")
    if protocol == "5cv":
        return [(k * fold_size, (k + 1) * fold_size) for k in range(5)]
    return [(0, need)]


def _fold_captions(caption_image: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Indices (k,) of the captions of images ``start:stop``, in input order."""
    if caption_image.numel() > 1 and bool((caption_image[1:] >= caption_image[:-1]).all()):
        edges = torch.tensor([start, stop], device=caption_image.device)
        a, b = torch.searchsorted(caption_image, edges).tolist()
        return torch.arange(a, b, device=caption_image.device)
    return torch.nonzero((caption_image >= start) & (caption_image < stop))[:, 0]


def select_images(images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor,
                  start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images ``start:stop`` with their captions (views when the captions are grouped by image).

    Returns (images (n, d), captions (k, d), caption_image (k,)), ``caption_image`` renumbered
    to start at 0.
    """
    if start == 0 and stop == images.shape[0]:
        return images, captions, caption_image
    index = _fold_captions(caption_image, start, stop)
    if index.numel() and int(index[-1]) - int(index[0]) + 1 == index.numel():
        a, b = int(index[0]), int(index[-1]) + 1
        return images[start:stop], captions[a:b], caption_image[a:b] - start
    return images[start:stop], captions[index.to(captions.device)], caption_image[index] - start


def _plan(protocols: Sequence[str], n_images: int, fold_size: int,
          have: str = "the embeddings have") -> list[tuple[str, list[tuple[int, int]]]]:
    """Every protocol's folds, checked before any work starts."""
    return [(p, protocol_folds(p, n_images, fold_size, have)) for p in protocols]


def _fold_work(plan: list[tuple[str, list[tuple[int, int]]]], caption_image: torch.Tensor) -> int:
    """Sum over the folds of images x captions (the number of scored pairs)."""
    total = 0
    for _, folds in plan:
        for start, stop in folds:
            total += (stop - start) * int(((caption_image >= start) & (caption_image < stop)).sum())
    return total


def _evaluate_plan(plan: list[tuple[str, list[tuple[int, int]]]], caption_image: torch.Tensor,
                   rank_fold: Callable[[int, int, torch.Tensor], Ranks]) -> dict[str, ProtocolResult]:
    """Rank every fold of every protocol with ``rank_fold(start, stop, caption_index)``."""
    results: dict[str, ProtocolResult] = {}
    for protocol, folds in plan:
        fold_ranks = []
        for start, stop in folds:
            index = _fold_captions(caption_image, start, stop)
            fold_ranks.append(FoldRanks(start, stop, index.cpu().numpy(), rank_fold(start, stop, index)))
        fold_metrics = [metrics_from_ranks(f.ranks) for f in fold_ranks]
        metrics = fold_metrics[0] if len(fold_metrics) == 1 else average_metrics(fold_metrics)
        results[protocol] = ProtocolResult(
            protocol, metrics, fold_metrics if len(fold_metrics) > 1 else [],
            n_images=sum(b - a for a, b in folds), n_captions=sum(f.caption_index.size for f in fold_ranks),
            fold_ranks=fold_ranks)
    return results


def _problems(ranks_by_protocol: dict[str, list[Ranks]]) -> list[str]:
    """At most two warning lines for one evaluation: tied ground truths, NaN scores."""
    lines = []
    tied = []
    for protocol, fold_ranks in ranks_by_protocol.items():
        for direction in ("i2t", "t2i"):
            queries = sum(getattr(r, direction).size for r in fold_ranks)
            ties = sum(int(np.count_nonzero(getattr(r, f"{direction}_ties"))) for r in fold_ranks)
            if queries and ties > TIE_WARNING_SHARE * queries:
                where = f", {PROTOCOL_NAMES.get(protocol, protocol)}" if protocol else ""
                tied.append(f"{direction} {ties} of {queries} queries ({100.0 * ties / queries:.1f}%{where})")
    if tied:
        lines.append(f"warning: the ground-truth score is tied by another candidate in {', '.join(tied)}; "
                     "tied candidates count against the ground truth, so these ranks are pessimistic "
                     "(duplicate or collapsed embeddings?)")
    nan = max((sum(r.nan_scores for r in fold_ranks) for fold_ranks in ranks_by_protocol.values()), default=0)
    if nan:
        lines.append(f"warning: {nan} similarity scores are NaN (e.g. inf - inf in an overflowing product); "
                     "each counts as a tie against the ground truth")
    return lines


def _report(results: dict[str, ProtocolResult], notes: list[str], log: Log) -> None:
    for line in notes + _problems({p: [f.ranks for f in r.fold_ranks] for p, r in results.items()}):
        log(line)


def evaluate_protocols(images: np.ndarray | torch.Tensor, captions: np.ndarray | torch.Tensor,
                       caption_image: np.ndarray | torch.Tensor, measure: str,
                       protocols: Sequence[str] = ("all",), order_sqrt: bool = False,
                       fold_size: int = 1000, device: str | torch.device | None = None,
                       block_images: int | None = None, block_captions: int | None = None,
                       on_tile: TileHook | None = None, topk: int = 0, order_kernel: str = "auto",
                       log: Log | None = None) -> dict[str, ProtocolResult]:
    """Evaluate embeddings under each protocol.

    Args:
        images: (N, d); captions: (M, d); caption_image: (M,) image row of each caption.
        measure, order_sqrt: the similarity (see :func:`ground_truth_ranks`).
        protocols: names from :data:`PROTOCOLS`, evaluated in the given order (all checked first).
        fold_size: images per fold (1000 for COCO; smaller in tests).
        device, block_images, block_captions, on_tile, topk, order_kernel: as in
            :func:`ground_truth_ranks` (tile indices of ``on_tile`` are relative to the fold).
        log: where the warnings go, once per call (default: stderr).

    Returns:
        ``{protocol: ProtocolResult}``.
    """
    if measure not in MEASURES:
        raise UserError(f"unknown measure {measure!r} (expected one of {', '.join(MEASURES)})")
    log = log or _stderr
    dev = resolve_device(device)
    img = _as_float_tensor(images, "image").to(dev)
    cap = _as_float_tensor(captions, "caption").to(dev)
    ci = _as_caption_image(caption_image).to(dev)
    if ci.shape != (cap.shape[0],):
        raise UserError(f"caption_image must have one entry per caption ({cap.shape[0]}), got shape "
                        f"{tuple(ci.shape)}")
    plan = _plan(protocols, img.shape[0], fold_size)
    check = _check_embeddings(img, cap, ci)
    d = img.shape[1]
    blocks = _blocks(measure, d, dev, block_images, block_captions)
    kernel = _order_kernel_options(measure, dev, d, _fold_work(plan, ci) * d, order_kernel, log)
    if measure == "cosine":  # see ground_truth_ranks
        img, cap = unit_rows(img), unit_rows(cap)
    nan_possible = False

    def rank_fold(start: int, stop: int, index: torch.Tensor) -> Ranks:
        f_img, f_cap, f_ci = select_images(img, cap, ci, start, stop)
        return _embedding_ranks(f_img, f_cap, f_ci, measure, order_sqrt, dev, blocks, kernel, topk, None,
                                on_tile, nan_possible)

    results = _evaluate_plan(plan, ci, rank_fold)
    _report(results, check.notes, log)
    return results


def evaluate_similarities(sims: np.ndarray, caption_image: np.ndarray | torch.Tensor,
                          protocols: Sequence[str] = ("all",), fold_size: int = 1000,
                          device: str | torch.device | None = None, block_images: int | None = None,
                          block_captions: int | None = None, on_tile: TileHook | None = None,
                          topk: int = 0, transposed: bool = False, log: Log | None = None
                          ) -> dict[str, ProtocolResult]:
    """Evaluate a precomputed similarity matrix (another codebase's) under each protocol.

    Args:
        sims: (N images, M captions) float16/32/64 array, larger = more similar, e.g. an
            ``np.load(..., mmap_mode="r")`` memory map: it is read tile by tile, never copied
            whole; with ``transposed``, (M, N).
        caption_image: (M,) image row of each caption, grouped by image (the VSE++/SCAN layout).
        protocols, fold_size, device, block_images, block_captions, on_tile, topk, log: as in
            :func:`evaluate_protocols`; a fold is a row and column slice of the matrix.

    Returns:
        ``{protocol: ProtocolResult}``.
    """
    log = log or _stderr
    ci_cpu = _as_caption_image(caption_image)
    check_similarity_matrix(sims, ci_cpu, transposed)
    dev = resolve_device(device)
    n = sims.shape[1] if transposed else sims.shape[0]
    plan = _plan(protocols, n, fold_size, have="the similarity matrix has")
    blocks = _blocks(None, 0, dev, block_images, block_captions)
    ci = ci_cpu.to(dev)

    def rank_fold(start: int, stop: int, index: torch.Tensor) -> Ranks:
        c0 = int(index[0]) if index.numel() else 0
        tiles = _matrix_tiles(sims, transposed, dev, start, c0)
        return rank_tiles(tiles, ci[c0:c0 + index.numel()] - start, stop - start, blocks, dev, topk,
                          on_tile=on_tile)

    results = _evaluate_plan(plan, ci, rank_fold)
    _report(results, [], log)
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
