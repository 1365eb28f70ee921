"""Distinct embeddings: the layout that makes identical embeddings tie on every kernel.

A matrix product does not promise that two identical rows get identical results: MKL, oneDNN and
ATen round a row's dot products differently depending on its position in the product (measured: 82 of
100 rows of ``images @ captions.T`` against 500 *identical* caption rows held different values under
``MKL_CBWR=COMPATIBLE``, one ulp apart). Ranking such scores would break the tie rule (tied
candidates count against the ground truth) by rounding alone: a collapsed caption encoder could score
R@1 = 1 on one CPU and 0 on another.

So the evaluator scores each *distinct* embedding once. :func:`distinct_rows` groups the bit-identical
rows of a matrix; :class:`RankingLayout` maps every image to its distinct image row and every caption
to its distinct caption column, with the multiplicities, and orders the distinct captions so that the
counting kernel (:func:`train.retrieval.evaluate.ranking.rank_tiles`) finds every ground-truth pair in few
tiles. Each distinct pair is scored in exactly one tile of the distinct matrix (and recomputed, when
it is, from the same inputs in the same shape), then every image and caption reads its scores from
there: identical embeddings get identical scores by construction, whatever the kernel.

Only bit-identical rows are grouped. Rows that differ in any bit (e.g. two embeddings of the same
caption computed at different batch positions, equal up to rounding) are different embeddings: their
scores differ by rounding and rank in the order of those scores, as any evaluation of the given
floats would rank them; calling them equal would need a tolerance, and any tolerance makes "equal"
intransitive and scale-dependent (docs/evaluation.md). A row of ``+0.0`` and one of ``-0.0`` differ in
bits and are not grouped.

Without duplicates (the usual case) the layout is the identity and costs one pass over the bytes of
each matrix (a 64-bit sum per row, then exact comparison only of rows whose sums collide).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


def distinct_rows(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group the bit-identical rows of a matrix.

    Args:
        x: (N, d), any dtype and device (read on the CPU).

    Returns:
        ``(first, inverse, counts)``: ``first`` (U,) int64, ascending, the first row of each group of
        identical rows; ``inverse`` (N,) int64, the group of each row (``x[first[inverse[i]]]`` has the
        bits of ``x[i]``); ``counts`` (U,) int64, the rows in each group. Without duplicates:
        ``arange(N), arange(N), ones(N)``. A matrix with d = 0 is one group.
    """
    n = x.shape[0]
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    if x.numel() == 0:  # d = 0: every row is the empty row
        return np.zeros(1, np.int64), np.zeros(n, np.int64), np.array([n], np.int64)
    raw = x.detach().cpu().contiguous().view(torch.uint8).numpy().reshape(n, -1)
    width = raw.shape[1]
    # a cheap fingerprint: the wrapped 64-bit (or 32-bit) integer sum of each row's bytes; equal rows
    # have equal sums, and only rows whose sums collide are compared byte for byte below
    if width % 8 == 0:
        sums = raw.view(np.int64).sum(axis=1)
    elif width % 4 == 0:
        sums = raw.view(np.int32).sum(axis=1, dtype=np.int64)
    else:
        sums = raw.sum(axis=1, dtype=np.int64)
    _, by_sum, sum_counts = np.unique(sums, return_inverse=True, return_counts=True)
    shared = np.flatnonzero(sum_counts[by_sum.reshape(-1)] > 1)
    if shared.size == 0:
        index = np.arange(n, dtype=np.int64)
        return index, index.copy(), np.ones(n, dtype=np.int64)
    label = np.arange(n, dtype=np.int64)
    rows = np.ascontiguousarray(raw[shared]).view(np.dtype((np.void, width))).reshape(-1)
    _, first_of, group = np.unique(rows, return_index=True, return_inverse=True)
    label[shared] = shared[first_of][group.reshape(-1)]  # the first row with the same bytes
    first, inverse, counts = np.unique(label, return_inverse=True, return_counts=True)
    return first.astype(np.int64), inverse.reshape(-1).astype(np.int64), counts.astype(np.int64)


def scores_of_distinct(rows: torch.Tensor, score: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``score(rows)`` computed on the distinct rows only, then expanded: identical rows get identical
    scores on every kernel (a search over a gallery with duplicate candidates ranks them as ties).

    Args:
        rows: (N, d) candidates; score: (U, d) -> (U, ...) scores of each row.

    Returns:
        (N, ...) the scores of every row.
    """
    first, inverse, _ = distinct_rows(rows)
    if first.size == rows.shape[0]:
        return score(rows)
    out = score(rows.index_select(0, torch.from_numpy(first).to(rows.device)))
    return out.index_select(0, torch.from_numpy(inverse).to(out.device))


@dataclass(frozen=True)
class RankingLayout:
    """How the N x M similarity matrix reads from the U x V matrix of distinct rows.

    Attributes:
        caption_image: (M,) int64, the image of each caption (any order).
        image_row: (N,) int64, the distinct image row that scores each image.
        caption_col: (M,) int64, the distinct caption column that scores each caption.
        image_weight: (U,) int64, images per distinct image row.
        caption_weight: (V,) int64, captions per distinct caption column.
        home_rows: (H,) int64, non-decreasing: the distinct image row of the ground truth of each of
            the first H distinct captions, those of a single caption each; columns H..V-1 are the
            *shared* ones (several captions each), whose ground truths may lie in any row.
    """

    caption_image: torch.Tensor
    image_row: torch.Tensor
    caption_col: torch.Tensor
    image_weight: torch.Tensor
    caption_weight: torch.Tensor
    home_rows: torch.Tensor

    @property
    def n_images(self) -> int:
        """N, the images."""
        return self.image_row.numel()

    @property
    def rows(self) -> int:
        """U, the distinct image rows."""
        return self.image_weight.numel()

    @property
    def cols(self) -> int:
        """V, the distinct caption columns."""
        return self.caption_weight.numel()

    @classmethod
    def grouped(cls, caption_image: torch.Tensor, n_images: int, device: torch.device) -> RankingLayout:
        """The identity layout: every row and column its own, captions grouped by image (non-decreasing
        ``caption_image`` (M,)); a precomputed similarity matrix is ranked this way."""
        ci = caption_image.to(device=device, dtype=torch.int64)
        ones = {"dtype": torch.int64, "device": device}
        return cls(ci, torch.arange(n_images, **ones), torch.arange(ci.numel(), **ones),
                   torch.ones(n_images, **ones), torch.ones(ci.numel(), **ones), ci)

    @classmethod
    def distinct(cls, images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor,
                 device: torch.device) -> tuple[RankingLayout, torch.Tensor | None, torch.Tensor | None]:
        """The layout of embeddings: their bit-identical rows grouped (:func:`distinct_rows`).

        Args:
            images: (N, d); captions: (M, d); caption_image: (M,) int64, any order.

        Returns:
            ``(layout, image_rows, caption_rows)``: the index (U,) of the input image of each distinct
            row and (V,) of the input caption of each distinct column, or ``None`` where that is
            ``arange`` (no duplicates, and for captions, already grouped by image).
        """
        ci = caption_image.detach().cpu().numpy().astype(np.int64)
        img_first, img_inverse, img_counts = distinct_rows(images)
        cap_first, cap_inverse, cap_counts = distinct_rows(captions)
        # single captions first, ordered by the distinct row of their image (stable: a grouped input
        # without duplicates keeps its order), then the shared ones in order of first appearance
        home = img_inverse[ci[cap_first]] if ci.size else np.zeros(0, np.int64)
        single = np.flatnonzero(cap_counts == 1)
        order = np.concatenate([single[np.argsort(home[single], kind="stable")],
                                np.flatnonzero(cap_counts > 1)]).astype(np.int64)
        position = np.empty_like(order)
        position[order] = np.arange(order.size, dtype=np.int64)

        def tensor(values: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)).to(device)

        layout = cls(tensor(ci), tensor(img_inverse), tensor(position[cap_inverse]), tensor(img_counts),
                     tensor(cap_counts[order]), tensor(home[order[:single.size]]))
        n, m = images.shape[0], captions.shape[0]
        image_rows = None if img_first.size == n else tensor(img_first)
        caption_rows = cap_first[order]
        identity = caption_rows.size == m and bool((caption_rows == np.arange(m)).all())
        return layout, image_rows, None if identity else tensor(caption_rows)
