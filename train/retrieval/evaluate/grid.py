"""The tiles of a ranking: the distinct matrix cut into row blocks and column chunks, and which inputs
(images, captions) read their scores from each (:func:`train.retrieval.evaluate.ranking.rank_tiles`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from train.retrieval.evaluate.layout import RankingLayout
from train.retrieval.evaluate.topk import Index


def split_range(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` in the fewest pieces of at most ``size``, of equal length (+-1): no sliver of a
    few rows, whose products a BLAS may round differently."""
    count = stop - start
    if count <= 0:
        return []
    pieces = -(-count // max(1, size))
    return [(start + count * j // pieces, start + count * (j + 1) // pieces) for j in range(pieces)]


@dataclass(frozen=True)
class Members:
    """The images (or captions) that read their scores from distinct rows (columns) ``lo:hi``.

    ``index`` (k,): their input indices and ``local`` (k,): their distinct row minus ``lo``, both
    ``None`` when they are exactly the inputs ``lo:hi`` in order (no duplicates: the usual case, read
    without a gather); ``weight`` (hi - lo,): the multiplicities, ``None`` when all are 1.
    """

    lo: int
    hi: int
    device: torch.device
    index: torch.Tensor | None = None
    local: torch.Tensor | None = None
    weight: torch.Tensor | None = None

    @property
    def count(self) -> int:
        """The number of inputs (images or captions) these rows score."""
        return self.hi - self.lo if self.index is None else self.index.numel()

    def all(self) -> Index:
        """Every input, as a slice or an index tensor."""
        return slice(self.lo, self.hi) if self.index is None else self.index

    def indices(self) -> torch.Tensor:
        """Every input, as an index tensor (k,)."""
        if self.index is None:
            return torch.arange(self.lo, self.hi, device=self.device)
        return self.index

    def pieces(self, size: int) -> Iterator[tuple[Index, torch.Tensor | None]]:
        """``(inputs, local)`` in pieces of at most ``max(size, hi - lo)`` inputs (so an expanded tile is
        never larger than a tile); ``local`` ``None``: the tile's rows (columns) as they are."""
        if self.index is None:
            yield slice(self.lo, self.hi), None
            return
        size = max(size, self.hi - self.lo, 1)
        for a in range(0, self.index.numel(), size):
            yield self.index[a:a + size], self.local[a:a + size]


def members(keys: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, lo: int, hi: int) -> Members:
    """The inputs whose distinct row is in ``lo:hi``: ``keys`` (sorted distinct row of each input, in
    ``order``), ``weights`` (U,) the multiplicities."""
    a, b = torch.searchsorted(keys, torch.tensor([lo, hi], device=keys.device)).tolist()
    index = order[a:b]
    weighted = b - a != hi - lo
    if not weighted and bool((index == torch.arange(lo, hi, device=index.device)).all()):
        return Members(lo, hi, keys.device)
    return Members(lo, hi, keys.device, index, keys[a:b] - lo, weights[lo:hi] if weighted else None)


@dataclass(frozen=True)
class Grid:
    """The tiles of the distinct matrix: row blocks, each row block's own (home) column chunks, and the
    shared columns' chunks, with the distinct row of each shared caption's ground truth."""

    row_blocks: list[Members]
    home_chunks: list[list[Members]]
    shared_chunks: list[Members]
    shared_rows: list[torch.Tensor]

    @classmethod
    def of(cls, layout: RankingLayout, block_images: int, block_captions: int) -> Grid:
        row_keys, row_order = torch.sort(layout.image_row, stable=True)
        col_keys, col_order = torch.sort(layout.caption_col, stable=True)
        row_blocks = [members(row_keys, row_order, layout.image_weight, a, b)
                      for a, b in split_range(0, layout.rows, block_images)]
        # the single (unshared) columns are grouped by the row of their ground truth: each row block's own
        # columns, split into chunks, hold all their ground-truth pairs; the shared columns come last
        starts = torch.tensor([rows.lo for rows in row_blocks] + [layout.rows], dtype=torch.int64)
        bounds = torch.searchsorted(layout.home_rows.cpu(), starts).tolist()
        home_chunks = [[members(col_keys, col_order, layout.caption_weight, a, b)
                        for a, b in split_range(bounds[r], bounds[r + 1], block_captions)]
                       for r in range(len(row_blocks))]
        shared_chunks = [members(col_keys, col_order, layout.caption_weight, a, b)
                         for a, b in split_range(layout.home_rows.numel(), layout.cols, block_captions)]
        shared_rows = [layout.image_row[layout.caption_image[cols.indices()]] for cols in shared_chunks]
        return cls(row_blocks, home_chunks, shared_chunks, shared_rows)

    def shared_own(self, rows: Members, k: int) -> torch.Tensor | None:
        """The captions of shared chunk ``k`` whose ground-truth pair lies in row block ``rows`` (or None)."""
        inside = (self.shared_rows[k] >= rows.lo) & (self.shared_rows[k] < rows.hi)
        return self.shared_chunks[k].indices()[inside] if bool(inside.any()) else None
