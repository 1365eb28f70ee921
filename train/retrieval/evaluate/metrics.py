"""Retrieval metrics from ranks: R@K, median and mean rank per direction, fold averages, chance.

Metrics follow VSE++ and the papers: R@K in percent (rank <= K), median rank ``floor(median)``
and mean rank of the 1-based ranks; ``rsum`` is the six recalls summed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from vsecore.errors import UserError

RECALL_KS = (1, 5, 10)


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
