"""The naive reference of the evaluator tests: a full sort per query, and the embeddings they rank."""

from __future__ import annotations

import math

import numpy as np
import torch

from train.engine.similarity import similarity
from train.retrieval.evaluate import (
    unit_rows,
)

# --------------------------------------------------------------------------- naive reference


def full_similarity(images, captions, measure: str, order_sqrt: bool = False) -> np.ndarray:
    """The whole (N, M) matrix in one call of the eager kernel (the reference scores); the cosine is
    that of unit rows, as the evaluator defines it (``unit_rows``, tested on its own below)."""
    images, captions = torch.as_tensor(images), torch.as_tensor(captions)
    if measure == "cosine":
        images, captions = unit_rows(images.float()), unit_rows(captions.float())
    return similarity(images, captions, measure, order_sqrt, fused=False).numpy()


def naive_ranks_of(s: np.ndarray, caption_image: np.ndarray, gt_last: bool = True
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per query a full sort of the candidates by descending score; among equal scores the ground truth
    comes LAST (pessimistic; ``gt_last=False``: first, the optimistic rank). The rank is the 1-based
    position of the first ground truth."""
    n, m = s.shape
    i2t = np.empty(n, dtype=np.int64)
    for i in range(n):
        is_gt = caption_image == i
        order = np.lexsort((is_gt if gt_last else ~is_gt, -s[i]))
        i2t[i] = np.flatnonzero(is_gt[order])[0] + 1
    t2i = np.empty(m, dtype=np.int64)
    for c in range(m):
        is_gt = np.arange(n) == caption_image[c]
        order = np.lexsort((is_gt if gt_last else ~is_gt, -s[:, c]))
        t2i[c] = np.flatnonzero(is_gt[order])[0] + 1
    return i2t, t2i


def naive_ranks(images, captions, caption_image, measure: str, order_sqrt: bool = False):
    return naive_ranks_of(full_similarity(images, captions, measure, order_sqrt), caption_image)


def naive_topk(s: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k best columns by a dense sort: score descending, lower index first, NaN last."""
    s = np.where(np.isnan(s), -np.inf, s)
    order = np.stack([np.lexsort((np.arange(s.shape[1]), -row))[:k] for row in s])
    return order, np.take_along_axis(s, order, 1)


def naive_metrics(ranks: np.ndarray) -> dict[str, float]:
    return {"r1": 100.0 * np.sum(ranks <= 1) / len(ranks), "r5": 100.0 * np.sum(ranks <= 5) / len(ranks),
            "r10": 100.0 * np.sum(ranks <= 10) / len(ranks), "medr": math.floor(np.median(ranks)),
            "meanr": float(ranks.sum()) / len(ranks)}


def naive_protocol(images, captions, caption_image, measure, protocol, fold_size, order_sqrt=False):
    n = images.shape[0]
    ranges = {"1k": [(0, fold_size)], "5k": [(0, 5 * fold_size)], "all": [(0, n)],
              "5cv": [(k * fold_size, (k + 1) * fold_size) for k in range(5)]}[protocol]
    folds = []
    for a, b in ranges:
        keep = (caption_image >= a) & (caption_image < b)
        i2t, t2i = naive_ranks(images[a:b], captions[keep], caption_image[keep] - a, measure, order_sqrt)
        folds.append({"i2t": naive_metrics(i2t), "t2i": naive_metrics(t2i)})
    return {d: {k: float(np.mean([f[d][k] for f in folds])) for k in folds[0][d]} for d in ("i2t", "t2i")}


def random_embeddings(n: int, m: int, d: int, measure: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    im = rng.normal(size=(n, d)).astype(np.float32)
    cap = rng.normal(size=(m, d)).astype(np.float32)
    if measure == "order":  # order embeddings are non-negative
        return np.abs(im), np.abs(cap)
    return im / np.linalg.norm(im, axis=1, keepdims=True), cap / np.linalg.norm(cap, axis=1, keepdims=True)


def correlated(im: np.ndarray, caption_image: np.ndarray, seed: int, measure: str) -> np.ndarray:
    """Captions near their image, so that ranks spread between 1 and chance level."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(size=(len(caption_image), im.shape[1]))
    # order embeddings stay non-negative; the scales give median ranks of a few positions
    noise = 1.5 * np.abs(noise) if measure == "order" else 0.75 * noise
    return (im[caption_image] + noise).astype(np.float32)


def dyadic_unit_rows(x: np.ndarray) -> np.ndarray:
    """Each quarter-integer row of ``x`` (d >= 4) mapped, as a function of the row (so equal rows stay
    equal), to a unit vector of four entries +-1/2: its norm is exactly 1, so the evaluator's cosine
    uses it bit for bit, and every product of two such rows (a multiple of 1/4) is exact."""
    d = x.shape[1]
    supports = [c for c in np.ndindex(*(2,) * d) if sum(c) == 4]
    out = np.zeros_like(x)
    for r, row in enumerate(x):
        code = int(np.dot((row * 4).astype(np.int64), 4 ** np.arange(d)))
        support = np.flatnonzero(supports[code % len(supports)])
        signs = np.array([1 if (code >> (4 + k)) & 1 else -1 for k in range(4)], np.float32)
        out[r, support] = signs / 2
    return out


def tie_data(seed: int, n: int = 37, d: int = 6, shuffle: bool = True, unit: bool = False):
    """Quarter-integer embeddings (every score exact in float32 whatever the summation order, so all
    kernels agree bit for bit) with many exact ties: duplicate images, captions duplicated across
    images, and a few captions equal to an image. ``unit``: rows of :func:`dyadic_unit_rows` (for
    the cosine, which is computed on unit rows)."""
    rng = np.random.default_rng(seed)
    ci = np.repeat(np.arange(n), rng.integers(1, 8, size=n))
    if shuffle:
        rng.shuffle(ci)  # captions need not be grouped by image
    im = rng.integers(0, 4, size=(n, d)).astype(np.float32) / 4
    cap = rng.integers(0, 4, size=(len(ci), d)).astype(np.float32) / 4
    im[5] = im[9]
    im[11] = im[12]
    for a in range(0, 40, 4):  # duplicate captions of different images
        b = int(np.flatnonzero(ci != ci[a])[a % 7])
        cap[b] = cap[a]
    cap[3] = im[ci[3]]
    if unit:
        im, cap = dyadic_unit_rows(im), dyadic_unit_rows(cap)
    return im, cap, ci


def quiet(line: str) -> None:
    """A log that drops the evaluator's warning lines."""


def assert_ranks_like_naive(ranks, s: np.ndarray, caption_image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The evaluator's ``ranks`` (ranks and ties of both directions) are those of the naive sort of the
    full score matrix ``s`` (N, M); returns how many candidates tie per query, (N,) and (M,)."""
    i2t, t2i = naive_ranks_of(s, caption_image)
    np.testing.assert_array_equal(ranks.i2t, i2t)
    np.testing.assert_array_equal(ranks.t2i, t2i)
    # the ties: pessimistic minus optimistic rank, per query
    i2t_opt, t2i_opt = naive_ranks_of(s, caption_image, gt_last=False)
    np.testing.assert_array_equal(ranks.i2t_ties, i2t - i2t_opt)
    np.testing.assert_array_equal(ranks.t2i_ties, t2i - t2i_opt)
    return i2t - i2t_opt, t2i - t2i_opt
