"""The blocked ranking metrics against a naive per-query full sort, and the protocols."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from ranking_reference import (
    assert_ranks_like_naive,
    correlated,
    full_similarity,
    naive_protocol,
    naive_ranks,
    naive_ranks_of,
    naive_topk,
    quiet,
    random_embeddings,
    tie_data,
)

import train.engine.similarity as similarity_module
from train.engine.similarity import similarity
from train.retrieval.evaluate import (
    OrderKernel,
    TileStats,
    chance_metrics,
    default_block_sizes,
    evaluate_protocols,
    evaluate_similarities,
    ground_truth_ranks,
    metrics_from_ranks,
    protocol_folds,
    unit_rows,
    vsepp_caption_image,
)
from train.retrieval.evaluate.tables import results_json
from vsecore.errors import UserError

# --------------------------------------------------------------------------- kernels


@pytest.fixture(params=["cosine", "eager", "blocked", pytest.param("compiled", marks=pytest.mark.skipif(
    os.environ.get("VSE_TEST_COMPILE", "1") == "0", reason="VSE_TEST_COMPILE=0"))])
def kernel(request, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """``(measure, order_kernel)``: cosine, or order with every tile on the named kernel."""
    if request.param == "cosine":
        return "cosine", "auto"
    if request.param == "compiled":
        monkeypatch.delenv("VSE_NO_COMPILE", raising=False)
        shared = OrderKernel.shared()  # what the evaluations below use
        shared.prepare(6)  # about 12 to 50 s once per process
        if shared.backend != "compiled":
            pytest.skip(f"torch.compile cannot build here: {shared.fallback_reason}")
    return "order", request.param


# --------------------------------------------------------------------------- ranks


@pytest.mark.parametrize("measure,order_sqrt", [("cosine", False), ("order", False), ("order", True)])
def test_ranks_match_naive_sort_vsepp_layout(measure: str, order_sqrt: bool) -> None:
    ci = vsepp_caption_image(60, 5)
    im, _ = random_embeddings(60, 300, 16, measure, seed=1)
    cap = correlated(im, ci, 2, measure)
    stats = TileStats()
    ranks = ground_truth_ranks(im, cap, ci, measure, order_sqrt, device="cpu", block_images=7,
                               block_captions=11, stats=stats)
    i2t, t2i = naive_ranks(im, cap, ci, measure, order_sqrt)
    np.testing.assert_array_equal(ranks.i2t, i2t)
    np.testing.assert_array_equal(ranks.t2i, t2i)
    # ranks spread over many values, so the comparison means something
    assert len(np.unique(t2i)) > 5 and len(np.unique(i2t)) > 5
    assert stats.max_tile_images <= 7 and stats.max_tile_captions <= 11


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("blocks", [(5, 9), (None, None)])
def test_every_kernel_ranks_exact_ties_like_the_naive_sort(kernel, shuffle, blocks) -> None:
    measure, order_kernel = kernel
    im, cap, ci = tie_data(3, shuffle=shuffle, unit=measure == "cosine")
    s = full_similarity(im, cap, measure)
    assert len(np.unique(s)) < s.size / 4  # many ties
    ranks = ground_truth_ranks(im, cap, ci, measure, device="cpu", block_images=blocks[0],
                               block_captions=blocks[1], order_kernel=order_kernel, log=quiet)
    i2t_ties, t2i_ties = assert_ranks_like_naive(ranks, s, ci)
    assert (i2t_ties > 0).sum() > 5 and (t2i_ties > 0).sum() > 5  # the rule matters on this data


def test_tie_rule_counts_ties_against_the_ground_truth() -> None:
    im = np.ones((4, 3), dtype=np.float32)
    cap = np.ones((8, 3), dtype=np.float32)
    lines: list[str] = []
    ranks = ground_truth_ranks(im, cap, vsepp_caption_image(4, 2), "cosine", device="cpu", log=lines.append)
    # i2t: the 6 captions of other images tie; t2i: the 3 other images tie. Own captions never count.
    assert ranks.i2t.tolist() == [7] * 4 and ranks.t2i.tolist() == [4] * 8
    assert ranks.i2t_ties.tolist() == [6] * 4 and ranks.t2i_ties.tolist() == [3] * 8
    m = metrics_from_ranks(ranks)
    assert m.i2t.r1 == m.t2i.r1 == 0.0 and m.i2t.ties == 4 and m.t2i.ties == 8
    assert [line.split(":")[0] for line in lines] == ["warning"] * 3  # constant images, captions; ties


def test_constant_caption_encoder_scores_worst_not_best(kernel) -> None:
    """Real-valued (inexact) embeddings at the default tiles, as a collapsed model produces them."""
    measure, order_kernel = kernel
    ci = vsepp_caption_image(100, 5)
    im, cap = random_embeddings(100, 500, 64, measure, seed=20)
    constant = np.repeat(cap[:1], 500, axis=0)
    lines: list[str] = []
    results = evaluate_protocols(im, constant, ci, measure, ["all"], device="cpu", order_kernel=order_kernel,
                                 log=lines.append)
    metrics = results["all"].metrics
    assert metrics.i2t.r1 == metrics.i2t.r10 == 0.0 and metrics.i2t.meanr == 500 - 5 + 1
    assert metrics.i2t.ties == 100 and metrics.rsum < 20
    assert any("caption embeddings are constant" in line for line in lines)
    assert any("i2t 100 of 100 queries (100.0%, all)" in line for line in lines)
    # constant images: every caption ranks its image last
    results = evaluate_protocols(np.repeat(im[:1], 100, axis=0), cap, ci, measure, ["all"], device="cpu",
                                 order_kernel=order_kernel, log=quiet)
    assert results["all"].metrics.t2i.meanr == 100 and results["all"].metrics.t2i.r10 == 0.0


@pytest.mark.parametrize("measure", ["cosine", "order"])
def test_zero_dimensional_embeddings_rank_worst(measure: str) -> None:
    ci = np.array([0, 0, 1, 2, 2, 2])
    ranks = ground_truth_ranks(np.zeros((3, 0), np.float32), np.zeros((6, 0), np.float32), ci, measure,
                               device="cpu", log=quiet)
    assert ranks.i2t.tolist() == [5, 6, 4] and ranks.t2i.tolist() == [3] * 6


def test_overflow_to_infinity_ranks_like_the_naive_sort(kernel) -> None:
    measure, order_kernel = kernel
    im, cap, ci = tie_data(7, shuffle=False, unit=measure == "cosine")
    if measure == "cosine":  # rows of 2**120 (products overflow) are scaled back exactly to unit rows
        im[2] *= 2.0 ** 120
        im[::7] *= 2.0 ** 100
        cap[9] *= 2.0 ** 120
        with np.errstate(over="ignore"):  # unnormalised, this row's products would overflow
            assert np.isinf(im[2] @ im[2])
    else:  # violations of 1e30 overflow to -inf when squared
        im[2, 0] = 1e30  # lies above every caption there: no violation
        im[7, 1] = -1e30  # -inf with every caption
        cap[4, 0] = 1e30  # -inf with every image
        cap[9, 2] = 1e30
    s = full_similarity(im, cap, measure)
    assert not np.isnan(s).any()
    assert np.isinf(s).sum() > 40 if measure == "order" else np.isfinite(s).all()
    for blocks in ((5, 9), (None, None)):
        ranks = ground_truth_ranks(im, cap, ci, measure, device="cpu", block_images=blocks[0],
                                   block_captions=blocks[1], order_kernel=order_kernel, log=quiet)
        i2t, t2i = naive_ranks_of(s, ci)
        np.testing.assert_array_equal(ranks.i2t, i2t)
        np.testing.assert_array_equal(ranks.t2i, t2i)
    if measure == "order":
        assert ranks.t2i[[c for c in range(len(ci)) if ci[c] == 7]].tolist() == [37] * int((ci == 7).sum())


def rule_ranks(s: np.ndarray, caption_image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documented rule written out, NaN included: a candidate counts unless it scores below."""
    n, m = s.shape
    own = caption_image[None, :] == np.arange(n)[:, None]
    gt = s[caption_image, np.arange(m)]
    best = np.array([np.max(np.where(np.isnan(s[i, own[i]]), -np.inf, s[i, own[i]])) for i in range(n)])
    with np.errstate(invalid="ignore"):
        i2t = 1 + (~(s < best[:, None]) & ~own).sum(1)
        t2i = 1 + (~(s < gt[None, :]) & ~own).sum(0)
    return i2t, t2i


def test_nan_scores_count_as_ties_against_the_ground_truth() -> None:
    rng = np.random.default_rng(9)
    ci = vsepp_caption_image(20, 3)
    s = rng.normal(size=(20, 60)).astype(np.float32)
    s[ci, np.arange(60)] += 1.5  # ground truths mostly on top
    s[4, 30] = np.nan  # a NaN candidate for image 4 and caption 30
    s[6, 18:21] = np.nan  # every caption of image 6 is NaN: its i2t rank is the worst
    s[9, 28] = np.nan  # caption 28 (image 9): NaN ground truth, the worst t2i rank
    s[0, 1] = np.nan  # one of image 0's captions is NaN: its others still rank it
    lines: list[str] = []
    got = evaluate_similarities(s, ci, device="cpu", block_images=6, block_captions=7, log=lines.append)
    ranks = got["all"].fold_ranks[0].ranks
    i2t, t2i = rule_ranks(s, ci)
    np.testing.assert_array_equal(ranks.i2t, i2t)
    np.testing.assert_array_equal(ranks.t2i, t2i)
    assert ranks.i2t[6] == 60 - 3 + 1 and ranks.t2i[28] == 20 and ranks.nan_scores == 6
    assert ranks.i2t_ties[4] >= 1 and ranks.t2i_ties[30] >= 1
    assert sum("6 similarity scores are NaN" in line for line in lines) == 1
    # a NaN in a given matrix anywhere else: the same rule, whatever the block shapes
    for bi, bc in ((20, 60), (1, 1), (3, 11)):
        again = evaluate_similarities(s, ci, device="cpu", block_images=bi, block_captions=bc, log=quiet)
        np.testing.assert_array_equal(again["all"].fold_ranks[0].ranks.i2t, i2t)
        np.testing.assert_array_equal(again["all"].fold_ranks[0].ranks.t2i, t2i)


@pytest.mark.parametrize("scale", [1e30, 3e38, 1e-30, 7.0])
def test_cosine_does_not_depend_on_the_scale_of_the_embeddings(scale: float) -> None:
    """Cosine scores are those of unit rows: scaling rows (each by its own factor, up to float32's
    largest values) changes no rank, and no score overflows to NaN on any CPU kernel."""
    rng = np.random.default_rng(3)
    ci = vsepp_caption_image(30, 3)
    im = rng.normal(size=(30, 64))
    cap = im[ci] + rng.normal(scale=0.8, size=(90, 64))
    im /= np.linalg.norm(im, axis=1, keepdims=True)
    cap /= np.linalg.norm(cap, axis=1, keepdims=True)
    im, cap = im.astype(np.float32), cap.astype(np.float32)
    base = ground_truth_ranks(im, cap, ci, "cosine", device="cpu", log=quiet)
    factors = np.where(rng.random(30) < 0.5, scale, 1.0).astype(np.float64)
    scaled_im = (im.astype(np.float64) * factors[:, None] / np.abs(im).max()).astype(np.float32)
    scaled_cap = (cap.astype(np.float64) * scale / np.abs(cap).max()).astype(np.float32)
    assert np.isfinite(scaled_im).all() and np.isfinite(scaled_cap).all()
    got = ground_truth_ranks(scaled_im, scaled_cap, ci, "cosine", device="cpu", log=quiet)
    assert got.nan_scores == 0
    np.testing.assert_array_equal(got.i2t, base.i2t)
    np.testing.assert_array_equal(got.t2i, base.t2i)
    res = evaluate_protocols(scaled_im, scaled_cap, ci, "cosine", device="cpu", log=quiet)
    assert res["all"].metrics.rsum == metrics_from_ranks(base).rsum > 0


def test_unit_rows_are_used_bit_for_bit() -> None:

    t = torch.nn.functional.normalize(torch.randn(50, 16), dim=1)
    assert unit_rows(t) is t  # a model's own unit vectors: no copy, no rounding
    t[3] *= 5
    t[7] = 0
    u = unit_rows(t)
    assert u is not t and torch.equal(u[:3], t[:3]) and torch.equal(u[7], t[7])
    assert abs(float(u[3].norm()) - 1) < 1e-6


def test_tie_warning_once_per_evaluation_and_ties_in_the_json() -> None:
    ci = vsepp_caption_image(60, 5)
    im, _ = random_embeddings(60, 300, 16, "cosine", seed=21)
    cap = correlated(im, ci, 22, "cosine")
    lines: list[str] = []
    results = evaluate_protocols(im, cap, ci, "cosine", ["1k", "5cv"], fold_size=12, device="cpu",
                                 block_images=5, block_captions=7, log=lines.append)
    assert lines == [] and results["5cv"].metrics.i2t.ties == 0  # continuous scores: no ties, no warning
    for a in range(0, 60, 6):  # in every fold a duplicated image and a caption copied to another image
        im[a + 1] = im[a]
        cap[5 * a + 10] = cap[5 * a]
    results = evaluate_protocols(im, cap, ci, "cosine", ["1k", "5cv"], fold_size=12, device="cpu",
                                 block_images=5, block_captions=7, log=lines.append)
    assert len(lines) == 1 and lines[0].startswith("warning: the ground-truth score is tied")
    assert "%, COCO-1k)" in lines[0] and "%, COCO-5cv)" in lines[0] and "pessimistic" in lines[0]
    folds = results["5cv"].fold_ranks
    assert len(folds) == 5 and all(np.count_nonzero(f.ranks.t2i_ties) > 0 for f in folds)
    t2i_ties = sum(int(np.count_nonzero(f.ranks.t2i_ties)) for f in folds)
    assert results["5cv"].metrics.t2i.ties == t2i_ties  # summed over the folds
    data = results_json(results)
    assert data["5cv"]["t2i"]["ties"] == t2i_ties and data["1k"]["t2i"]["ties"] >= 1


@pytest.mark.parametrize("shuffle", [False, True])
def test_topk_matches_a_dense_argsort(shuffle: bool) -> None:
    im, cap, ci = tie_data(11, shuffle=shuffle)
    cap[6, 0] = 1e30  # -inf with every image: ties at the bottom
    s = full_similarity(im, cap, "order")
    for k, blocks in ((4, (5, 9)), (10, (None, None)), (60, (6, 13))):
        ranks = ground_truth_ranks(im, cap, ci, "order", device="cpu", block_images=blocks[0],
                                   block_captions=blocks[1], topk=k, log=quiet)
        want, want_scores = naive_topk(s, min(k, s.shape[1]))
        np.testing.assert_array_equal(ranks.i2t_topk, want)
        np.testing.assert_array_equal(ranks.i2t_topk_scores, want_scores)
        want, want_scores = naive_topk(s.T, min(k, s.shape[0]))
        np.testing.assert_array_equal(ranks.t2i_topk, want)
        np.testing.assert_array_equal(ranks.t2i_topk_scores, want_scores)
    assert ranks.t2i_topk.shape == (len(ci), 37)  # K larger than the candidates: all of them


def test_topk_nan_scores_come_last() -> None:
    s = np.array([[0.5, np.nan, 0.5, 0.2], [np.nan, np.nan, 0.1, 0.9]], np.float32)
    got = evaluate_similarities(s, np.array([0, 0, 1, 1]), device="cpu", topk=4, log=quiet)
    ranks = got["all"].fold_ranks[0].ranks
    assert ranks.i2t_topk.tolist() == [[0, 2, 3, 1], [3, 2, 0, 1]]
    assert ranks.i2t_topk_scores[0, -1] == -np.inf


@pytest.mark.parametrize("measure", ["cosine", "order"])
@pytest.mark.parametrize("protocol", ["1k", "5cv", "5k", "all"])
def test_protocol_metrics_match_naive(measure: str, protocol: str) -> None:
    ci = vsepp_caption_image(66, 5)
    im, _ = random_embeddings(66, 330, 12, measure, seed=4)
    cap = correlated(im, ci, 5, measure)
    got = evaluate_protocols(im, cap, ci, measure, [protocol], fold_size=12, device="cpu",
                             block_images=5, block_captions=13)[protocol]
    want = naive_protocol(im, cap, ci, measure, protocol, fold_size=12)
    for direction in ("i2t", "t2i"):
        for key, value in want[direction].items():
            got_value = getattr(getattr(got.metrics, direction), key)
            assert got_value == pytest.approx(value, abs=1e-9), (direction, key)
    recalls = [want[d][k] for d in ("i2t", "t2i") for k in ("r1", "r5", "r10")]
    assert got.metrics.rsum == pytest.approx(sum(recalls))
    assert got.n_images == {"1k": 12, "5cv": 60, "5k": 60, "all": 66}[protocol]
    assert len(got.folds) == (5 if protocol == "5cv" else 0)


class RecordingKernel(OrderKernel):
    """An evaluator's order kernel that records every tile it scores and every compilation it is asked for."""

    def __init__(self, compile_min_work: int = 1 << 36) -> None:
        super().__init__(compile_min_work)
        self.tiles: list[tuple[int, int, str]] = []  # (images, captions, kernel) of each scored tile
        self.prepared: list[int] = []

    def prepare(self, dim, log=None) -> float:
        self.prepared.append(dim)
        return 0.0

    def choose(self, *args, **kwargs):
        scorer = super().choose(*args, **kwargs)

        def record(images, captions):
            self.tiles.append((images.shape[0], captions.shape[0], scorer.kernel))
            return scorer(images, captions) if scorer.kernel != "compiled" else \
                similarity(images, captions, "order", scorer.order_sqrt, fused=True)
        return record


def test_every_pair_is_scored_once_in_bounded_tiles() -> None:
    kernel = RecordingKernel()
    n, m = 50, 250
    pairs: list[int] = []
    im, cap = random_embeddings(n, m, 8, "order", seed=6)
    ground_truth_ranks(im, cap, vsepp_caption_image(n), "order", device="cpu", block_images=8,
                       block_captions=32, on_tile=pairs.append, kernel=kernel)
    shapes = [(a, b) for a, b, _ in kernel.tiles]
    assert sum(pairs) == n * m  # the counting covers the matrix exactly once
    assert max(a for a, _ in shapes) <= 8 and max(b for _, b in shapes) <= 32
    assert all(a * b <= 8 * 32 for a, b in shapes)  # never a whole row, column or the N x M matrix
    # only the home tiles of row blocks with several caption chunks are computed twice (here 1/7)
    assert n * m < sum(a * b for a, b in shapes) <= 1.2 * n * m


def test_order_kernel_is_decided_once_per_evaluation() -> None:
    """Many small tiles whose total work passes the threshold compile (once); a small evaluation does not."""
    ci = vsepp_caption_image(60, 5)
    im, cap = random_embeddings(60, 300, 16, "order", seed=23)
    work = 5 * 12 * 60 * 16  # the 5cv folds' pairs x d
    kernel = RecordingKernel(compile_min_work=work + 1)
    evaluate_protocols(im, cap, ci, "order", ["5cv"], fold_size=12, device="cpu", block_images=4,
                       block_captions=8, kernel=kernel)
    assert kernel.prepared == [] and len(kernel.tiles) > 40 and all(k == "blocked" for *_, k in kernel.tiles)
    kernel = RecordingKernel(compile_min_work=work)  # each tile is far below it
    evaluate_protocols(im, cap, ci, "order", ["5cv"], fold_size=12, device="cpu", block_images=4,
                       block_captions=8, kernel=kernel)
    assert kernel.prepared == [16] and all(k == "compiled" for *_, k in kernel.tiles)


def test_default_blocks_bound_memory_at_5k_by_8192() -> None:
    cpu = torch.device("cpu")
    for dim in (1024, 8192):
        order = default_block_sizes("order", dim, cpu)
        assert order.images * order.captions <= 1 << 23  # the fused kernel's memory: the tile
        # ... and the tile is large enough for the fused kernels to pay their per-call overhead
        assert order.images * order.captions * dim >= similarity_module.FUSED_MIN_WORK
    cos = default_block_sizes("cosine", 8192, cpu)
    assert cos.images * cos.captions <= 1 << 23  # one float32 tile of at most 32 MB
    cuda = default_block_sizes("order", 8192, torch.device("cuda"))
    assert cuda.images * cuda.captions < 5000 * 25000


def test_bad_inputs_are_user_errors() -> None:
    im, cap = random_embeddings(10, 50, 4, "cosine", seed=7)
    ci = vsepp_caption_image(10)
    with pytest.raises(UserError, match="needs at least 1000 images"):
        evaluate_protocols(im, cap, ci, "cosine", ["1k"])
    with pytest.raises(UserError, match="without any caption"):
        ground_truth_ranks(im, cap[:45], ci[:45], "cosine", device="cpu")
    with pytest.raises(UserError, match="outside"):
        ground_truth_ranks(im, cap, np.where(ci == 3, 10, ci), "cosine", device="cpu")
    bad = cap.copy()
    bad[7, 1] = np.nan
    with pytest.raises(UserError, match="NaN"):
        ground_truth_ranks(im, bad, ci, "cosine", device="cpu")
    bad[7, 1] = np.inf
    with pytest.raises(UserError, match="infinity .first at row 7"):
        evaluate_protocols(im, bad, ci, "cosine", device="cpu")
    with pytest.raises(UserError, match="differ in size"):
        ground_truth_ranks(im, cap[:, :3], ci, "cosine", device="cpu")
    with pytest.raises(UserError, match="unknown protocol"):
        protocol_folds("10k", 10)
    with pytest.raises(UserError, match="block-images must be at least 1"):
        ground_truth_ranks(im, cap, ci, "cosine", device="cpu", block_images=0)
    with pytest.raises(UserError, match="unknown order kernel"):
        ground_truth_ranks(im, cap, ci, "order", device="cpu", order_kernel="fast")


def test_chance_metrics_match_simulated_random_rankings() -> None:
    rng = np.random.default_rng(8)
    ci = np.repeat(np.arange(40), rng.integers(1, 6, size=40))
    chance = chance_metrics(ci, 40)
    # independent random scores (no ties): every query's ranking is a uniform random permutation
    trials = [ground_truth_ranks(*random_embeddings(40, len(ci), 3, "cosine", seed), ci, "cosine",
                                 device="cpu") for seed in range(60)]
    sim_i2t = np.concatenate([t.i2t for t in trials])
    sim_t2i = np.concatenate([t.t2i for t in trials])
    assert chance.t2i.r10 == pytest.approx(25.0)
    assert chance.i2t.r10 == pytest.approx(100 * np.mean(sim_i2t <= 10), abs=5)
    assert chance.i2t.meanr == pytest.approx(sim_i2t.mean(), rel=0.1)
    assert chance.t2i.meanr == pytest.approx(sim_t2i.mean(), rel=0.1)


# --------------------------------------------------------------------------- precomputed similarities


class RecordingMatrix:
    """A read-only (N, M) matrix that records every block read from it (like a memory map would serve)."""

    def __init__(self, data: np.ndarray) -> None:
        self.data, self.shape, self.dtype, self.ndim = data, data.shape, data.dtype, data.ndim
        self.reads: list[int] = []

    def __getitem__(self, key):
        block = self.data[key]
        self.reads.append(block.size)
        return block


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_similarity_matrix_ranks_like_its_embeddings(dtype) -> None:
    ci = vsepp_caption_image(66, 5)
    im, _ = random_embeddings(66, 330, 12, "order", seed=24)
    cap = correlated(im, ci, 25, "order")
    s = full_similarity(im, cap, "order").astype(dtype)
    matrix = RecordingMatrix(s)
    got = evaluate_similarities(matrix, ci, ["5cv", "all"], fold_size=12, device="cpu", block_images=5,
                                block_captions=13, topk=3, log=quiet)
    assert max(matrix.reads) <= 5 * 13  # read tile by tile, never whole
    exact = s.astype(np.float64)  # the scores the evaluator sees: float16 rounds, and makes ties
    for protocol in ("5cv", "all"):
        for fold in got[protocol].fold_ranks:
            keep = fold.caption_index
            fold_s = exact[fold.start:fold.stop][:, keep]
            i2t, t2i = naive_ranks_of(fold_s, ci[keep] - fold.start)
            np.testing.assert_array_equal(fold.ranks.i2t, i2t)
            np.testing.assert_array_equal(fold.ranks.t2i, t2i)
            np.testing.assert_array_equal(fold.ranks.i2t_topk, naive_topk(fold_s, 3)[0])
    if dtype == np.float32:  # the same scores as the embeddings' own evaluation
        want = evaluate_protocols(im, cap, ci, "order", ["5cv", "all"], fold_size=12, device="cpu")
        assert got["5cv"].metrics == want["5cv"].metrics and got["all"].metrics == want["all"].metrics
    if dtype == np.float64:
        assert got["all"].fold_ranks[0].ranks.i2t_topk_scores.dtype == np.float64  # never rounded down
    transposed = RecordingMatrix(np.ascontiguousarray(s.T))
    again = evaluate_similarities(transposed, ci, ["all"], device="cpu", block_images=5, block_captions=13,
                                  transposed=True, log=quiet)
    assert again["all"].metrics == got["all"].metrics and max(transposed.reads) <= 5 * 13


def test_similarity_matrix_errors() -> None:
    ci = vsepp_caption_image(4, 5)
    with pytest.raises(UserError, match="transposed"):
        evaluate_similarities(np.zeros((20, 4), np.float32), ci)
    with pytest.raises(UserError, match="float16/32/64"):
        evaluate_similarities(np.zeros((4, 20), np.int32), ci)
    with pytest.raises(UserError, match="grouped by image"):
        evaluate_similarities(np.zeros((4, 20), np.float32), ci[::-1].copy())
    with pytest.raises(UserError, match="1k needs at least 1000 images, the similarity matrix has 4"):
        evaluate_similarities(np.zeros((4, 20), np.float32), ci, ["all", "1k"])
