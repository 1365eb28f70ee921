"""The blocked ranking kernel: ranks of image-text retrieval by counting, tile by tile.

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
  cosine is that of unit rows (:func:`train.evaluate.inputs.unit_rows`: any row not of norm 1 is
  scaled in float64, which copies that side's matrix once; a model's own unit-norm output is used as
  it is, bit for bit);
* order on the CPU: the tile (default at most 1024 x 8192, 32 MB; 256 x 1024 at d = 8192), from the
  fused kernels of :func:`train.similarity.order_violation`, which build no broadcast. The
  evaluation chooses the kernel once for all its tiles (:mod:`train.evaluate.order_kernel`): the
  compiled one when the total work ``sum of N x M x d`` over its folds reaches ``COMPILE_MIN_WORK``
  (it then compiles first, with a one-line message) or it is already compiled, else the blocked one;
* order on CUDA: the tile plus the broadcast inside ``order_violation``, at most
  ``min(block_images x block_captions x d, max(2**24, block_images x d))`` float32 elements (the
  16M-element chunk of :mod:`train.similarity`, 64 MB);
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

from train.evaluate.metrics import Ranks
from vsecore.errors import UserError

#: a tile callback receives (image_start, image_stop, caption_start, caption_stop) of every tile
TileHook = Callable[[int, int, int, int], None]
#: ``(i0, i1, c0, c1) -> S[i0:i1, c0:c1]``: a (B, Cb) float tile of the similarity matrix, on the
#: ranking device, larger = more similar
TileSource = Callable[[int, int, int, int], torch.Tensor]
#: where warnings and notes go: one line per call
Log = Callable[[str], None]

#: placeholder index of an empty top-K slot: sorts after every real index
_NO_INDEX = 1 << 62


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

    Args:
        images: (N, d); captions: (M, d); caption_image: (M,) int64, the image of each caption.
        score: images (B, d), captions (C, d) -> the (B, C) tile (one kernel for every tile:
            :meth:`train.evaluate.order_kernel.OrderKernel.choose`).
        blocks, device, topk, stats, on_tile, nan_possible: as in :func:`rank_tiles`.

    Returns:
        :class:`Ranks` in the input's caption order.
    """
    order = None
    if caption_image.numel() > 1 and not bool((caption_image[1:] >= caption_image[:-1]).all()):
        # the counting kernel needs captions grouped by image: one sorted copy of the captions
        order = torch.argsort(caption_image, stable=True)
        captions, caption_image = captions.index_select(0, order), caption_image[order]

    def tiles(i0: int, i1: int, c0: int, c1: int) -> torch.Tensor:
        return score(images[i0:i1], captions[c0:c1])

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
