"""Each query's K best candidates, merged tile by tile, with a deterministic order among equal scores."""

from __future__ import annotations

import math

import torch

#: the queries of a piece of a tile (images or captions): ``slice(a, b)`` (inputs a..b-1, when they are
#: the distinct rows a..b-1 themselves) or an index tensor (k,)
Index = slice | torch.Tensor

#: placeholder index of an empty top-K slot: sorts after every real index
_NO_INDEX = 1 << 62


def stable_topk(scores: torch.Tensor, k: int, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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


class TopK:
    """The K best candidates of ``queries`` queries, merged tile by tile (memory O(queries x K))."""

    def __init__(self, queries: int, k: int, device: torch.device) -> None:
        self.queries, self.k, self.device = queries, k, device
        self.values: torch.Tensor | None = None
        self.indices = torch.full((queries, k), _NO_INDEX, dtype=torch.int64, device=device)

    def update(self, queries: Index, scores: torch.Tensor, candidates: torch.Tensor) -> None:
        """Merge ``scores`` (Q, C) of candidates with indices ``candidates`` (C,) into ``queries`` (Q
        distinct query indices: a slice or an index tensor)."""
        if self.values is None:
            self.values = torch.full((self.queries, self.k), -math.inf, dtype=scores.dtype,
                                     device=self.device)
        values, positions = stable_topk(scores, min(self.k, scores.shape[1]), candidates)
        all_values = torch.cat([self.values[queries], values], dim=1)
        all_indices = torch.cat([self.indices[queries], candidates[positions]], dim=1)
        # order by index, then a stable sort by score: equal scores keep the lower index first
        by_index = all_indices.argsort(dim=1)
        all_values, all_indices = all_values.gather(1, by_index), all_indices.gather(1, by_index)
        best = all_values.sort(dim=1, descending=True, stable=True).indices[:, :self.k]
        self.values[queries] = all_values.gather(1, best)
        self.indices[queries] = all_indices.gather(1, best)
