"""The blocked ranking kernel: ranks of image-text retrieval by counting, tile by tile.

The similarity matrix ``S[i, c]`` (image ``i``, caption ``c``; larger is more similar) is never
built whole: a *tile source* returns it tile by tile (``block_images x block_captions``), from
embeddings through :func:`train.engine.similarity.similarity` or from a precomputed matrix (another
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

Ties are exact float equality of the scores, and the scores come from the matrix of *distinct* rows
(:mod:`train.retrieval.evaluate.layout`): each distinct pair is scored in one tile, and every image and
caption
reads its scores from its distinct row, so bit-identical embeddings tie on every kernel. The ground
truth's score is always taken from the very tile that is counted, so the same pair is never compared
with a differently rounded copy of itself.

Two passes over the tiles of the distinct matrix (:func:`rank_tiles`). Its single columns (one caption
each) are grouped by the row of their ground truth and cut with the rows, so each row block's own
chunks (its *home* tiles) hold their ground-truth pairs; the shared columns (several captions each)
come last. The first pass takes the ground-truth scores ``S[gt(c), c]`` and each image's best one from
the shared columns' tiles that hold ground-truth pairs, then from the home tiles, and counts a home
tile right away when its row block has a single chunk (the usual case: 1024 images x 5 captions per
tile). The second pass counts every other tile (recomputed tiles give the same bits). Each counted
tile adds, per image and caption reading from it, ``#{S >= threshold}`` (as above) and ``#{S >
threshold}`` (for the ties), each distinct candidate weighted by the inputs it stands for, minus what
the tile's own ground-truth pairs contributed. With ``topk``, the same pass keeps each query's K best
candidates (per-tile top-K merged across tiles; ties: lower index first; NaN last, listed as -inf).
An expanded tile (the rows of copies gathered) is processed in pieces no larger than a tile. Peak
memory beyond the inputs:

* cosine: the tile, ``block_images x block_captions`` float32 (plus bool tiles of the same shape); the
  cosine is that of unit rows (:func:`train.retrieval.evaluate.inputs.unit_rows`: any row not of norm 1 is
  scaled in float64, which copies that side's matrix once; a model's own unit-norm output is used as
  it is, bit for bit); with duplicates, one copy of the distinct rows;
* order on the CPU: the tile (default at most 1024 x 8192, 32 MB; 256 x 1024 at d = 8192), from the
  fused kernels of :func:`train.engine.similarity.order_violation`, which build no broadcast. The
  evaluation chooses the kernel once for all its tiles (:mod:`train.retrieval.evaluate.order_kernel`): the
  compiled one when the total work ``sum of N x M x d`` over its folds reaches ``COMPILE_MIN_WORK``
  (it then compiles first, with a one-line message) or it is already compiled, else the blocked one;
* order on CUDA: the tile plus the broadcast inside ``order_violation``, at most
  ``min(block_images x block_captions x d, max(2**24, block_images x d))`` float32 elements (the
  16M-element chunk of :mod:`train.engine.similarity`, 64 MB);
* a precomputed matrix: the tile, read from the memory map in float32 (float64 for a float64
  matrix, never converted up);
* with ``topk``: ``(N + M) x K`` scores and indices.

No Python loop runs per query; loops run over blocks only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from train.retrieval.evaluate.grid import Grid, Members
from train.retrieval.evaluate.layout import RankingLayout
from train.retrieval.evaluate.metrics import Ranks
from train.retrieval.evaluate.topk import Index as _Index
from train.retrieval.evaluate.topk import TopK as _TopK
from vsecore.errors import UserError

#: a tile callback receives the number of (image, caption) pairs of every tile counted
TileHook = Callable[[int], None]
#: ``(i0, i1, c0, c1) -> S[i0:i1, c0:c1]``: a (B, Cb) float tile of the similarity matrix, on the
#: ranking device, larger = more similar
TileSource = Callable[[int, int, int, int], torch.Tensor]
#: where warnings and notes go: one line per call
Log = Callable[[str], None]

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


@dataclass(frozen=True)
class BlockSizes:
    """Tile shape of the blocked computation (upper bounds: blocks are split evenly)."""

    images: int
    captions: int


def default_block_sizes(measure: str | None, dim: int, device: torch.device) -> BlockSizes:
    """Tile shape for a measure (``None``: a precomputed matrix), embedding size and device.

    Cosine tiles are matrix products: large tiles (1024 x 8192, 32 MB) keep BLAS efficient; a
    precomputed matrix is read in the same tiles. On the CPU, order tiles are the same size: the
    fused kernels of :func:`train.engine.similarity.order_violation` build no (block_images,
    block_captions, d) broadcast, so memory is the tile itself, and a large tile amortises their
    per-call overhead (the compiled kernel ran at 3.6 G elements/s on 128 x 256 tiles, 6.3 G on
    1024 x 8192 at d = 1024). Its inner loop reads every caption row of the tile for each image
    row, so the tile's caption rows are kept near 32 MB and its image rows near 8 MB (1024 x 8192
    at d = 1024, 256 x 1024 at d = 8192): at d = 8192 a 1024 x 8192 tile (256 MB of captions) ran
    1.3x slower than 1024 x 1024 and 1.8x slower than 256 x 1024. On CUDA the eager broadcast
    runs, in 256 x 4096 tiles and the 16M-element chunks of :mod:`train.engine.similarity`.
    """
    if measure in (None, "cosine"):
        return BlockSizes(images=1024, captions=8192)
    if device.type == "cuda":
        return BlockSizes(images=256, captions=4096)
    d = max(1, dim)
    return BlockSizes(images=min(1024, max(16, (1 << 21) // d)),
                      captions=min(8192, max(256, (1 << 23) // d)))


def _weighted_sum(mask: torch.Tensor, weight: torch.Tensor | None, dim: int) -> torch.Tensor:
    """``mask.sum(dim)``, each element counted ``weight`` times (weight along the other dimension)."""
    if weight is None:
        return mask.sum(dim, dtype=torch.int32)
    w = weight[None, :] if dim == 1 else weight[:, None]
    return (mask * w).sum(dim)


class _Counts:
    """Per-query counts of one ranking: candidates ``>=`` and ``>`` the ground truth, both directions."""

    def __init__(self, layout: RankingLayout, blocks: BlockSizes, device: torch.device, topk: int,
                 count_nan: bool) -> None:
        n, m = layout.n_images, layout.caption_image.numel()
        self.layout, self.blocks, self.device = layout, blocks, device
        self.ci = layout.caption_image
        self.count_nan = count_nan
        zeros = {"dtype": torch.int64, "device": device}
        self.against_i2t, self.above_i2t = torch.zeros(n, **zeros), torch.zeros(n, **zeros)
        self.against_t2i, self.above_t2i = torch.zeros(m, **zeros), torch.zeros(m, **zeros)
        self.nan = torch.zeros((), **zeros)
        self.gt: torch.Tensor | None = None  # S[gt(c), c] (M,), in the tiles' dtype
        self.best: torch.Tensor | None = None  # max over an image's captions (N,), NaN as -inf
        self.topk_i2t = _TopK(n, min(topk, m), device) if topk > 0 else None
        self.topk_t2i = _TopK(m, min(topk, n), device) if topk > 0 else None

    def own_scores(self, tile: torch.Tensor, rows: Members, cols: Members, own: _Index) -> torch.Tensor:
        """The scores (k,) of the ground-truth pairs of captions ``own``, all in this tile."""
        r = self.layout.image_row[self.ci[own]] - rows.lo
        c = self.layout.caption_col[own] - cols.lo
        return tile[r, c]

    def set_ground_truth(self, tile: torch.Tensor, rows: Members, cols: Members, own: _Index) -> None:
        """Take the ground-truth scores of the captions ``own`` from the tile that holds them."""
        if self.gt is None:
            self.gt = torch.empty(self.ci.numel(), dtype=tile.dtype, device=self.device)
            self.best = torch.full((self.layout.n_images,), -math.inf, dtype=tile.dtype, device=self.device)
        scores = self.own_scores(tile, rows, cols, own)
        self.gt[own] = scores
        # a NaN caption score must not hide the image's other captions: its own rank is the worst
        self.best.scatter_reduce_(0, self.ci[own], scores.masked_fill(torch.isnan(scores), -math.inf), "amax")

    def count(self, tile: torch.Tensor, rows: Members, cols: Members, own: _Index | None) -> None:
        """Add the tile of distinct rows ``rows`` x columns ``cols`` to the counts of every image and caption
        they score; ``own``: the captions whose ground-truth pair lies in it."""
        # image-to-text: each image against the tile's columns, each column counted once per caption
        total = cols.hi - cols.lo if cols.weight is None else int(cols.weight.sum())
        for images, local in rows.pieces(self.blocks.images):
            part = tile if local is None else tile.index_select(0, local)
            # ">= threshold" counted as "not < threshold": NaN scores and NaN thresholds count too
            threshold = self.best[images][:, None]
            self.against_i2t[images] += total - _weighted_sum(part < threshold, cols.weight, 1)
            self.above_i2t[images] += _weighted_sum(part > threshold, cols.weight, 1)
        # text-to-image: each caption against the tile's rows, each row counted once per image
        total = rows.hi - rows.lo if rows.weight is None else int(rows.weight.sum())
        for captions, local in cols.pieces(self.blocks.captions):
            part = tile if local is None else tile.index_select(1, local)
            threshold = self.gt[captions][None, :]
            self.against_t2i[captions] += total - _weighted_sum(part < threshold, rows.weight, 0)
            self.above_t2i[captions] += _weighted_sum(part > threshold, rows.weight, 0)
        if self.count_nan:
            nan = torch.isnan(tile)
            if rows.weight is not None:
                nan = nan * rows.weight[:, None]
            if cols.weight is not None:
                nan = nan * cols.weight[None, :]
            self.nan += nan.sum()
        if own is not None:
            # a caption and its own image never count against each other: take back exactly what
            # the comparisons above counted for those pairs
            scores = self.own_scores(tile, rows, cols, own)
            images = self.ci[own]
            best = self.best[images]
            self.against_i2t.index_add_(0, images, -(~(scores < best)).long())
            self.above_i2t.index_add_(0, images, -(scores > best).long())
            gt = self.gt[own]
            self.against_t2i[own] -= (~(scores < gt)).long()
            self.above_t2i[own] -= (scores > gt).long()
        if self.topk_i2t is not None:
            self._topk(tile, rows, cols)

    def _topk(self, tile: torch.Tensor, rows: Members, cols: Members) -> None:
        def ids(index: _Index) -> torch.Tensor:
            if isinstance(index, slice):
                return torch.arange(index.start, index.stop, device=self.device)
            return index

        for images, row_local in rows.pieces(self.blocks.images):
            part = tile if row_local is None else tile.index_select(0, row_local)
            for captions, col_local in cols.pieces(self.blocks.captions):
                scores = part if col_local is None else part.index_select(1, col_local)
                self.topk_i2t.update(images, scores, ids(captions))
                self.topk_t2i.update(captions, scores.t(), ids(images))

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
def rank_tiles(tiles: TileSource, layout: RankingLayout, blocks: BlockSizes, device: torch.device,
               topk: int = 0, stats: TileStats | None = None, on_tile: TileHook | None = None,
               nan_possible: bool = True) -> Ranks:
    """Ranks of every query from the tiles of a similarity matrix: the one counting kernel.

    Args:
        tiles: ``(r0, r1, c0, c1) -> U[r0:r1, c0:c1]`` on ``device``, U the matrix of ``layout``'s
            distinct rows and columns (for :meth:`RankingLayout.grouped`, the inputs themselves).
        layout: how images and captions read their scores from U; every image has a caption.
        blocks: the largest tile (split evenly); topk: K > 0 keeps each query's K best candidates.
        stats: filled with the number and largest shape of the tiles built.
        on_tile: called with each counted tile's number of (image, caption) pairs (each pair once).
        nan_possible: ``False`` when no score can be NaN (saves a pass; NaN ranks the same either way).

    Returns:
        :class:`Ranks` of the N images and M captions, in their input order.
    """
    stats = stats if stats is not None else TileStats()
    counts = _Counts(layout, blocks, device, topk, nan_possible)
    threads = _counting_threads(device)
    grid = Grid.of(layout, blocks.images, blocks.captions)
    row_blocks, home_chunks, shared_chunks = grid.row_blocks, grid.home_chunks, grid.shared_chunks
    def tile_of(rows: Members, cols: Members) -> torch.Tensor:
        tile = tiles(rows.lo, rows.hi, cols.lo, cols.hi)
        stats.record(*tile.shape)
        return tile

    def count(tile: torch.Tensor, rows: Members, cols: Members, own: _Index | None) -> None:
        with _intra_op_threads(threads):
            counts.count(tile, rows, cols, own)
        if on_tile is not None:
            on_tile(rows.count * cols.count)

    # pass 1: the ground-truth scores, from the tiles that will be counted: the shared columns'
    # first (their pairs lie in any row block), then each row block's own chunks, counted right away
    # when a single chunk completes the thresholds of every row and column of the tile
    for rows in row_blocks:
        for k, cols in enumerate(shared_chunks):
            own = grid.shared_own(rows, k)
            if own is not None:
                counts.set_ground_truth(tile_of(rows, cols), rows, cols, own)
    for rows, own_chunks in zip(row_blocks, home_chunks, strict=True):
        for cols in own_chunks:
            tile = tile_of(rows, cols)
            counts.set_ground_truth(tile, rows, cols, cols.all())
            if len(own_chunks) == 1:
                count(tile, rows, cols, cols.all())
            del tile
    # pass 2: every other tile (a recomputed tile has the same bits: same inputs, same shape)
    for r, rows in enumerate(row_blocks):
        for home_r, own_chunks in enumerate(home_chunks):
            if home_r == r and len(own_chunks) == 1:
                continue
            for cols in own_chunks:
                count(tile_of(rows, cols), rows, cols, cols.all() if home_r == r else None)
        for k, cols in enumerate(shared_chunks):
            count(tile_of(rows, cols), rows, cols, grid.shared_own(rows, k))
    return counts.ranks()


def block_sizes(measure: str | None, dim: int, device: torch.device, block_images: int | None = None,
                block_captions: int | None = None) -> BlockSizes:
    """The tile shape of an evaluation: ``block_images`` / ``block_captions`` where given (at least 1),
    else :func:`default_block_sizes`."""
    defaults = default_block_sizes(measure, dim, device)
    for name, value in (("block_images", block_images), ("block_captions", block_captions)):
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    return BlockSizes(images=block_images or defaults.images, captions=block_captions or defaults.captions)


# --------------------------------------------------------------------------- tile sources


def embedding_ranks(images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor,
                    score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], blocks: BlockSizes,
                    device: torch.device, topk: int = 0, stats: TileStats | None = None,
                    on_tile: TileHook | None = None, nan_possible: bool = True) -> Ranks:
    """:func:`rank_tiles` on embeddings (already checked, on ``device``), captions in any order.

    Each distinct embedding is scored once (:meth:`RankingLayout.distinct`): bit-identical rows get
    bit-identical scores on every kernel, so the tie rule holds by construction, and duplicated rows
    cost nothing extra.

    Args:
        images: (N, d); captions: (M, d); caption_image: (M,) int64, the image of each caption.
        score: images (B, d), captions (C, d) -> the (B, C) tile (one kernel for every tile:
            :meth:`train.retrieval.evaluate.order_kernel.OrderKernel.choose`).
        blocks, device, topk, stats, on_tile, nan_possible: as in :func:`rank_tiles`.

    Returns:
        :class:`Ranks` in the input's image and caption order.
    """
    layout, image_rows, caption_rows = RankingLayout.distinct(images, captions, caption_image, device)
    if image_rows is not None:
        images = images.index_select(0, image_rows)
    if caption_rows is not None:
        # the distinct captions, single ones grouped by image: one copy
        captions = captions.index_select(0, caption_rows)

    def tiles(r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
        return score(images[r0:r1], captions[c0:c1])

    return rank_tiles(tiles, layout, blocks, device, topk, stats, on_tile, nan_possible)


def matrix_tiles(sims: np.ndarray, transposed: bool, device: torch.device, row0: int = 0,
                 col0: int = 0) -> TileSource:
    """Tiles of a (memory-mapped) (N, M) matrix, or (M, N) with ``transposed``, offset by ``(row0, col0)``:
    float32, or float64 if it is float64."""
    dtype = np.float64 if sims.dtype == np.float64 else np.float32

    def tiles(i0: int, i1: int, c0: int, c1: int) -> torch.Tensor:
        if transposed:
            block = sims[col0 + c0:col0 + c1, row0 + i0:row0 + i1].T
        else:
            block = sims[row0 + i0:row0 + i1, col0 + c0:col0 + c1]
        # a copy: the tile in memory (a memory map's pages are read-only)
        return torch.from_numpy(np.array(block, dtype=dtype, order="C")).to(device)

    return tiles
