"""Identical embeddings tie on every kernel: distinct rows are scored once (train.retrieval.evaluate.layout).

A matrix product may round a row's dot products differently depending on the row's position in the
product (MKL_CBWR=COMPATIBLE, other CPUs). The evaluator therefore scores each distinct embedding once
and reads every copy's scores from there. These tests make that visible on any machine with a scorer
that rounds *by position* on purpose: without the grouping, its scores of identical rows differ.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from ranking_reference import assert_ranks_like_naive, quiet, random_embeddings, tie_data

from train.retrieval.evaluate import (
    BlockSizes,
    TileScorer,
    evaluate_protocols,
    ground_truth_ranks,
    vsepp_caption_image,
)
from train.retrieval.evaluate.layout import RankingLayout, distinct_rows, scores_of_distinct
from train.retrieval.evaluate.ranking import embedding_ranks

CPU = torch.device("cpu")


# --------------------------------------------------------------------------- distinct rows


def test_distinct_rows_groups_bit_identical_rows_in_order_of_first_appearance() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [2.0, 1.0], [3.0, 4.0], [1.0, 2.0]])
    first, inverse, counts = distinct_rows(x)
    assert first.tolist() == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2, 1, 0]
    assert counts.tolist() == [3, 2, 1]
    # [1, 2] and [2, 1] have the same byte sum (a collision of the fingerprint): told apart exactly
    assert torch.equal(x[first[inverse]], x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [1, 3, 8, 33])
def test_distinct_rows_every_dtype_and_width(dtype: torch.dtype, d: int) -> None:
    gen = torch.Generator().manual_seed(d)
    base = torch.randn(7, d, generator=gen).to(dtype)
    pick = torch.tensor([0, 1, 2, 1, 3, 4, 0, 5, 6, 6])
    x = base[pick]
    first, inverse, counts = distinct_rows(x)
    assert first.tolist() == [0, 1, 2, 4, 5, 7, 8]
    assert inverse.tolist() == [0, 1, 2, 1, 3, 4, 0, 5, 6, 6]
    assert counts.sum() == 10 and torch.equal(x[first[inverse]], x)


def test_distinct_rows_edge_cases() -> None:
    first, inverse, counts = distinct_rows(torch.zeros(4, 0))
    assert first.tolist() == [0] and inverse.tolist() == [0] * 4 and counts.tolist() == [4]  # d = 0: one row
    assert distinct_rows(torch.zeros(0, 3))[0].size == 0
    nan = torch.tensor([[np.nan, 1.0], [np.nan, 1.0], [0.0, 1.0], [-0.0, 1.0]])
    first, _, _ = distinct_rows(nan)
    assert first.tolist() == [0, 2, 3]  # the same bits group (NaN too); +0.0 and -0.0 are other bits
    rows = torch.randn(1000, 16, generator=torch.Generator().manual_seed(0))
    first, inverse, counts = distinct_rows(rows)
    assert np.array_equal(first, np.arange(1000)) and np.array_equal(inverse, first) and (counts == 1).all()


def test_layout_of_distinct_inputs_is_the_identity() -> None:
    im, cap = random_embeddings(10, 50, 4, "cosine", seed=1)
    ci = torch.from_numpy(vsepp_caption_image(10))
    layout, image_rows, caption_rows = RankingLayout.distinct(torch.from_numpy(im), torch.from_numpy(cap), ci,
                                                              CPU)
    assert image_rows is None and caption_rows is None
    assert layout.rows == 10 and layout.cols == 50 and layout.home_rows.tolist() == ci.tolist()


# --------------------------------------------------------------------------- a kernel that rounds by position


def position_rounding(measure: str, log_shapes: list[tuple[int, int]] | None = None) -> TileScorer:
    """A scorer whose every score is perturbed by its *position* in the tile, as a kernel whose rounding
    depends on the position would (by far more than an ulp, so that any comparison sees it)."""
    exact = TileScorer(measure)

    class PositionRounding(TileScorer):
        def __call__(self, images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
            if log_shapes is not None:
                log_shapes.append((images.shape[0], captions.shape[0]))
            s = exact(images, captions)
            rows = torch.arange(s.shape[0], dtype=s.dtype)[:, None]
            cols = torch.arange(s.shape[1], dtype=s.dtype)[None, :]
            return s + 1e-4 * torch.sin(7 * rows + 3 * cols + s.shape[1])

    return PositionRounding(measure)


@pytest.mark.parametrize("measure", ["cosine", "order"])
@pytest.mark.parametrize("seed,d", [(0, 300), (20, 64), (3, 8), (11, 1024)])
def test_constant_captions_rank_worst_on_a_kernel_that_rounds_by_position(measure: str, seed: int,
                                                                          d: int) -> None:
    n = 100
    ci = torch.from_numpy(vsepp_caption_image(n, 5))
    im, cap = random_embeddings(n, 5 * n, d, measure, seed)
    constant = torch.from_numpy(np.repeat(cap[:1], 5 * n, axis=0))
    for blocks in (BlockSizes(1024, 8192), BlockSizes(7, 23)):
        ranks = embedding_ranks(torch.from_numpy(im), constant, ci, position_rounding(measure), blocks, CPU)
        assert (ranks.i2t == 5 * n - 5 + 1).all() and (ranks.i2t_ties == 5 * n - 5).all()
    # the same through the evaluator (its own kernels, whatever they round like)
    metrics = evaluate_protocols(im, constant.numpy(), ci.numpy(), measure, ["all"], device="cpu",
                                 log=quiet)["all"].metrics
    assert metrics.i2t.r1 == metrics.i2t.r10 == 0.0 and metrics.i2t.ties == n


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("blocks", [(5, 9), (2, 3), (37, 1000), (1, 1)])
def test_copies_read_one_score_on_a_kernel_that_rounds_by_position(shuffle: bool, blocks: tuple) -> None:
    """Duplicate images, captions duplicated across images, a caption equal to an image: every copy reads
    the same scores, and the ranks and ties are those of the naive sort of the scores it used."""
    im, cap, ci = tie_data(5, shuffle=shuffle)
    n, m = len(im), len(cap)
    scorer = position_rounding("cosine")
    whole = scorer(torch.from_numpy(im), torch.from_numpy(cap)).numpy()
    assert not np.array_equal(whole[5], whole[9])  # im[5] == im[9]: scored in place, they would not tie
    got = embedding_ranks(torch.from_numpy(im), torch.from_numpy(cap), torch.from_numpy(ci), scorer,
                          BlockSizes(*blocks), CPU, topk=m)
    # every score the ranking used, from the full top-K lists of both directions (the same scores)
    s = np.empty((n, m), np.float32)
    np.put_along_axis(s, got.i2t_topk, got.i2t_topk_scores, axis=1)
    st = np.empty((m, n), np.float32)
    np.put_along_axis(st, got.t2i_topk, got.t2i_topk_scores, axis=1)
    np.testing.assert_array_equal(st.T, s)
    img_first, img_inv, _ = distinct_rows(torch.from_numpy(im))
    cap_first, cap_inv, _ = distinct_rows(torch.from_numpy(cap))
    assert len(img_first) < n and len(cap_first) < m  # duplicates on both sides
    np.testing.assert_array_equal(s, s[img_first[img_inv]])  # copies of an image: one row of scores
    np.testing.assert_array_equal(s, s[:, cap_first[cap_inv]])  # copies of a caption: one column
    _, t2i_ties = assert_ranks_like_naive(got, s, ci)
    assert (t2i_ties > 0).sum() > 5  # the copies tie


def test_duplicated_rows_are_scored_once() -> None:
    """Each image twice, each with 5 copies of one caption: the distinct matrix n x n, the input 2n x 10n."""
    n = 40
    im, cap = random_embeddings(n, n, 8, "cosine", seed=2)
    images = torch.from_numpy(np.concatenate([im, im]))
    ci = torch.from_numpy(np.repeat(np.arange(2 * n), 5))
    captions = torch.from_numpy(cap[ci.numpy() % n])
    shapes: list[tuple[int, int]] = []
    ranks = embedding_ranks(images, captions, ci, position_rounding("cosine", shapes), BlockSizes(16, 64),
                            CPU)
    scored = sum(a * b for a, b in shapes)
    # every column is shared: its ground truths are taken in a first pass, counted in a second
    assert n * n <= scored <= 2 * n * n
    assert (ranks.t2i_ties >= 1).all()  # the image's copy ties with it
    assert (ranks.i2t_ties >= 5).all()  # the copy's 5 captions tie with the image's own


# --------------------------------------------------------------------------- the command


@pytest.mark.parametrize("measure", ["cosine", "order"])
def test_train_evaluate_on_a_constant_caption_matrix_scores_zero(tmp_path, measure: str) -> None:
    results = {}
    for seed, d in ((0, 300), (20, 64), (5, 17)):
        im, cap = random_embeddings(100, 500, d, measure, seed)
        np.save(tmp_path / "im.npy", im)
        np.save(tmp_path / "cap.npy", np.repeat(cap[:1], 500, axis=0))
        out = tmp_path / f"eval-{seed}-{d}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "train", "evaluate", "--img-emb", str(tmp_path / "im.npy"), "--cap-emb",
             str(tmp_path / "cap.npy"), "--measure", measure, "--protocol", "all", "--device", "cpu",
             "--json", str(out), "-q"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        results[(seed, d)] = json.loads(out.read_text())["all"]["i2t"]
    for (seed, d), i2t in results.items():
        assert i2t["r1"] == i2t["r10"] == 0.0, (seed, d, i2t)


def test_ground_truth_ranks_with_a_constant_image_encoder() -> None:
    im, cap = random_embeddings(60, 300, 32, "cosine", seed=4)
    ci = vsepp_caption_image(60, 5)
    ranks = ground_truth_ranks(np.repeat(im[:1], 60, axis=0), cap, ci, "cosine", device="cpu", log=quiet)
    assert (ranks.t2i == 60).all() and (ranks.t2i_ties == 59).all()


def test_a_search_scores_duplicate_candidates_alike_on_a_kernel_that_rounds_by_position() -> None:
    """``train query``'s scores (train.retrieval.query.search) come from the distinct candidates."""
    gen = torch.Generator().manual_seed(3)
    gallery = torch.randn(6, 16, generator=gen)[torch.tensor([0, 1, 0, 2, 3, 0, 4, 5, 1])]
    queries = torch.randn(3, 16, generator=gen)
    rounding = position_rounding("cosine")
    assert not torch.equal(rounding(gallery, queries)[0], rounding(gallery, queries)[2])  # in place: no tie
    scores = scores_of_distinct(gallery, lambda rows: rounding(rows, queries))
    assert torch.equal(scores[0], scores[2]) and torch.equal(scores[0], scores[5])
    assert torch.equal(scores[1], scores[8])
