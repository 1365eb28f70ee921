"""The evaluator against the VSE++ protocol, written here from its description as naively as possible.

VSE++ (and SCAN, which copies it) evaluate ``5 * N`` caption rows against ``N`` images, the captions of
image ``i`` being rows ``5i .. 5i + 4``: per image query, sort all captions by descending score and
take the best position of its five; per caption query, sort the images and take the position of its
image; COCO-1k 5-fold splits the images (and their captions) into five consecutive folds of 1,000,
COCO-5k takes all 5,000 at once. On scores without ties the evaluator must give exactly these ranks;
where the ground truth ties with another candidate, its rank is the pessimistic one (every tied
candidate counts against the ground truth), never better than the sort's.
"""

from __future__ import annotations

import numpy as np
import pytest

from train.retrieval.evaluate import evaluate_similarities, metrics_from_ranks, vsepp_caption_image

#: images per fold: VSE++ uses 1,000 (a stand-in of 200 keeps the naive loops fast)
FOLD = 200


def vsepp_ranks(sims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """0-based VSE++ ranks from an (N, 5N) score matrix: one sort per query, a Python loop per query."""
    n = sims.shape[0]
    i2t = np.zeros(n, dtype=np.int64)
    for i in range(n):
        order = list(np.argsort(-sims[i], kind="stable"))
        i2t[i] = min(order.index(c) for c in range(5 * i, 5 * i + 5))
    t2i = np.zeros(5 * n, dtype=np.int64)
    for c in range(5 * n):
        order = list(np.argsort(-sims[:, c], kind="stable"))
        t2i[c] = order.index(c // 5)
    return i2t, t2i


def vsepp_recalls(i2t: np.ndarray, t2i: np.ndarray) -> list[float]:
    """VSE++'s R@1, R@5, R@10 of each direction (ranks 0-based there)."""
    return [100.0 * float((r < k).mean()) for r in (i2t, t2i) for k in (1, 5, 10)]


def tie_free_scores(n: int, seed: int) -> np.ndarray:
    """(n, 5n) float32 scores, no two equal anywhere, ground truths favoured: a random permutation of the
    integers, and half-integers a third of the range higher for the ground truths (all exact in float32
    below 2**23)."""
    rng = np.random.default_rng(seed)
    total = n * 5 * n
    sims = rng.permutation(total).reshape(n, 5 * n).astype(np.float64)
    sims[np.repeat(np.arange(n), 5), np.arange(5 * n)] += total // 3 + 0.5
    assert sims.max() * 2 < 2 ** 24
    sims = sims.astype(np.float32)
    for axis in (0, 1):
        s = np.sort(sims, axis=axis)
        assert (np.diff(s, axis=axis) > 0).all()
    return sims


@pytest.mark.parametrize("protocol", ["5cv", "5k"])
def test_evaluator_equals_the_vsepp_loops_without_ties(protocol: str) -> None:
    sims = tie_free_scores(5 * FOLD, seed=4)
    ci = vsepp_caption_image(5 * FOLD, 5)
    got = evaluate_similarities(sims, ci, [protocol], fold_size=FOLD, device="cpu", log=lambda _: None)
    result = got[protocol]
    folds = [(0, 5 * FOLD)] if protocol == "5k" else [(f * FOLD, (f + 1) * FOLD) for f in range(5)]
    assert len(result.fold_ranks) == len(folds)
    per_fold = []
    for (start, stop), fold in zip(folds, result.fold_ranks, strict=True):
        i2t, t2i = vsepp_ranks(sims[start:stop, 5 * start:5 * stop])
        np.testing.assert_array_equal(fold.ranks.i2t, i2t + 1)
        np.testing.assert_array_equal(fold.ranks.t2i, t2i + 1)
        assert int(fold.ranks.i2t_ties.sum()) == int(fold.ranks.t2i_ties.sum()) == 0
        per_fold.append(vsepp_recalls(i2t, t2i))
    # VSE++ averages each recall over the folds; rsum is the sum of the six averages
    mean = np.mean(per_fold, axis=0)
    m = result.metrics
    ours = [m.i2t.r1, m.i2t.r5, m.i2t.r10, m.t2i.r1, m.t2i.r5, m.t2i.r10]
    np.testing.assert_allclose(ours, mean, rtol=0, atol=1e-9)
    assert m.rsum == pytest.approx(float(mean.sum()), abs=1e-9)


def test_ties_make_ranks_pessimistic_and_only_where_they_are() -> None:
    n = FOLD
    sims = tie_free_scores(n, seed=5)
    ci = vsepp_caption_image(n, 5)
    rng = np.random.default_rng(6)
    tied_captions = rng.choice(5 * n, size=40, replace=False)
    for c in tied_captions:  # another image scores exactly the ground truth's score for caption c
        other = (c // 5 + 1 + int(rng.integers(n - 1))) % n
        sims[other, c] = sims[c // 5, c]
    got = evaluate_similarities(sims, ci, ["all"], device="cpu", log=lambda _: None)["all"]
    ranks = got.fold_ranks[0].ranks
    i2t, t2i = vsepp_ranks(sims)
    # the documented rule, counted naively: 1 + #{other images scoring at least the ground truth}
    gt = sims[ci, np.arange(5 * n)]
    own = np.arange(n)[:, None] == ci[None, :]
    expected_t2i = 1 + ((sims >= gt[None, :]) & ~own).sum(axis=0)
    np.testing.assert_array_equal(ranks.t2i, expected_t2i)
    tied = np.zeros(5 * n, dtype=bool)
    tied[tied_captions] = True
    np.testing.assert_array_equal(ranks.t2i[~tied], t2i[~tied] + 1)  # no tie: exactly VSE++
    assert (ranks.t2i[tied] >= t2i[tied] + 1).all()  # a tie: never better than a sort puts it
    assert (ranks.t2i_ties[tied] >= 1).all() and (ranks.t2i_ties[~tied] == 0).all()
    assert metrics_from_ranks(ranks).rsum <= sum(vsepp_recalls(i2t, t2i))
