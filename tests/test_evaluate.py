"""The blocked ranking metrics against a naive per-query full sort, the protocols, the report and the CLI."""

from __future__ import annotations

import json
import math
import os
import warnings

import numpy as np
import pytest
import torch

import train.evaluate as ev
import train.similarity as similarity_module
from prep.errors import UserError
from train.cli import main as train_main
from train.evaluate import (
    TileStats,
    chance_metrics,
    default_block_sizes,
    evaluate_protocols,
    ground_truth_ranks,
    protocol_folds,
    vsepp_caption_image,
)
from train.report import format_results, results_json
from train.similarity import order_violation, similarity

# --------------------------------------------------------------------------- naive reference


def naive_ranks(images: np.ndarray, captions: np.ndarray, caption_image: np.ndarray, measure: str,
                order_sqrt: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Full similarity matrix, then per query a full sort (descending score, ground truth first on ties)."""
    s = similarity(torch.as_tensor(images), torch.as_tensor(captions), measure, order_sqrt).numpy()
    n, m = s.shape
    i2t = np.empty(n, dtype=np.int64)
    for i in range(n):
        is_gt = caption_image == i
        order = np.lexsort((~is_gt, -s[i]))  # primary: score descending; ties: ground truth first
        i2t[i] = np.flatnonzero(is_gt[order])[0] + 1
    t2i = np.empty(m, dtype=np.int64)
    for c in range(m):
        is_gt = np.arange(n) == caption_image[c]
        order = np.lexsort((~is_gt, -s[:, c]))
        t2i[c] = np.flatnonzero(is_gt[order])[0] + 1
    return i2t, t2i


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


def test_varying_captions_per_image_and_exact_ties() -> None:
    rng = np.random.default_rng(3)
    per_image = rng.integers(1, 8, size=37)
    ci = np.repeat(np.arange(37), per_image)
    rng.shuffle(ci)  # captions need not be grouped by image
    # quarter-integer values: every similarity is exact in float32, so ties are real ties
    im = rng.integers(0, 4, size=(37, 6)).astype(np.float32) / 4
    cap = rng.integers(0, 4, size=(len(ci), 6)).astype(np.float32) / 4
    im[5] = im[9]  # duplicated images and captions tie exactly
    cap[10] = cap[20]
    for measure in ("cosine", "order"):
        s = similarity(torch.as_tensor(im), torch.as_tensor(cap), measure).numpy()
        assert len(np.unique(s)) < s.size / 4  # many ties
        ranks = ground_truth_ranks(im, cap, ci, measure, device="cpu", block_images=5, block_captions=9)
        i2t, t2i = naive_ranks(im, cap, ci, measure)
        np.testing.assert_array_equal(ranks.i2t, i2t)
        np.testing.assert_array_equal(ranks.t2i, t2i)


@pytest.fixture(params=["blocked", pytest.param("compiled", marks=pytest.mark.skipif(
    os.environ.get("VSE_TEST_COMPILE", "1") == "0", reason="VSE_TEST_COMPILE=0"))])
def fused_kernel(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every gradient-free CPU order tile takes the fused kernel named by the parameter."""
    monkeypatch.delenv("VSE_NO_COMPILE", raising=False)
    monkeypatch.setattr(similarity_module, "_fused_backend", None)
    monkeypatch.setattr(similarity_module, "_compiled_kernel", None)
    if request.param == "blocked":
        monkeypatch.setenv("VSE_NO_COMPILE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the VSE_NO_COMPILE line
        order_violation(torch.zeros(2, 3), torch.zeros(2, 3), fused=True)
    assert similarity_module.fused_backend() == request.param
    monkeypatch.setattr(similarity_module, "FUSED_MIN_WORK", 0)
    return request.param


def eager_order(images, captions, measure, order_sqrt=False):
    return order_violation(images, captions, order_sqrt, fused=False)


def test_fused_kernels_rank_like_the_naive_sort(fused_kernel: str, monkeypatch) -> None:
    # exact quarter-integer values with ties: every kernel computes the same float32 scores
    rng = np.random.default_rng(13)
    ci = np.repeat(np.arange(41), rng.integers(1, 7, size=41))
    rng.shuffle(ci)
    im = rng.integers(0, 4, size=(41, 6)).astype(np.float32) / 4
    cap = rng.integers(0, 4, size=(len(ci), 6)).astype(np.float32) / 4
    im[3] = im[8]
    ranks = ground_truth_ranks(im, cap, ci, "order", device="cpu", block_images=6, block_captions=17)
    monkeypatch.setitem(globals(), "similarity", eager_order)  # the reference: the eager kernel
    i2t, t2i = naive_ranks(im, cap, ci, "order")
    np.testing.assert_array_equal(ranks.i2t, i2t)
    np.testing.assert_array_equal(ranks.t2i, t2i)
    # continuous values, default tiles: the same ranks as the eager kernel (no near-ties here)
    ci = vsepp_caption_image(60, 5)
    im, _ = random_embeddings(60, 300, 64, "order", seed=14)
    cap = correlated(im, ci, 15, "order")
    for order_sqrt in (False, True):
        ranks = ground_truth_ranks(im, cap, ci, "order", order_sqrt, device="cpu")
        i2t, t2i = naive_ranks(im, cap, ci, "order", order_sqrt)
        np.testing.assert_array_equal(ranks.i2t, i2t)
        np.testing.assert_array_equal(ranks.t2i, t2i)
        assert len(np.unique(t2i)) > 5


def test_tie_rule_favours_ground_truth() -> None:
    im = np.ones((4, 3), dtype=np.float32)
    cap = np.ones((8, 3), dtype=np.float32)
    ranks = ground_truth_ranks(im, cap, vsepp_caption_image(4, 2), "cosine", device="cpu")
    assert ranks.i2t.tolist() == [1, 1, 1, 1] and ranks.t2i.tolist() == [1] * 8


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


def test_every_pair_is_scored_once_in_bounded_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    shapes = []

    def recording_similarity(images, captions, measure, order_sqrt=False):
        shapes.append((images.shape[0], captions.shape[0]))
        return similarity(images, captions, measure, order_sqrt)

    monkeypatch.setattr(ev, "similarity", recording_similarity)
    n, m = 50, 250
    seen = np.zeros((n, m), dtype=np.int64)

    def on_tile(i0: int, i1: int, c0: int, c1: int) -> None:
        seen[i0:i1, c0:c1] += 1

    im, cap = random_embeddings(n, m, 8, "order", seed=6)
    ground_truth_ranks(im, cap, vsepp_caption_image(n), "order", device="cpu", block_images=8,
                       block_captions=32, on_tile=on_tile)
    assert (seen == 1).all()  # the counting pass covers the matrix exactly once
    assert max(a for a, _ in shapes) <= 8 and max(b for _, b in shapes) <= 32
    assert all(a * b <= 8 * 32 for a, b in shapes)  # never a whole row, column or the N x M matrix


def test_default_blocks_bound_memory_at_5k_by_8192() -> None:
    cpu = torch.device("cpu")
    for dim in (1024, 8192):
        order = default_block_sizes("order", dim, cpu)
        assert order.images * order.captions <= 1 << 23  # the fused kernel's memory: the tile
        # ... and the tile is large enough to take the fused kernel (no N x M x d broadcast)
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
    with pytest.raises(UserError, match="differ in size"):
        ground_truth_ranks(im, cap[:, :3], ci, "cosine", device="cpu")
    with pytest.raises(UserError, match="unknown protocol"):
        protocol_folds("10k", 10)


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


# --------------------------------------------------------------------------- report and CLI


def test_json_shape_and_table() -> None:
    ci = vsepp_caption_image(24)
    im, _ = random_embeddings(24, 120, 8, "cosine", seed=9)
    cap = correlated(im, ci, 10, "cosine")
    results = evaluate_protocols(im, cap, ci, "cosine", ["1k", "all"], fold_size=12, device="cpu")
    data = results_json(results)
    assert list(data) == ["1k", "all"]
    for entry in data.values():
        assert set(entry) == {"i2t", "t2i", "rsum"}
        assert set(entry["i2t"]) == set(entry["t2i"]) == {"r1", "r5", "r10", "medr", "meanr"}
    table = format_results(results, {"1k": chance_metrics(ci[:60], 12)})
    assert "COCO-1k" in table and "chance (1k)" in table and "all (24 img)" in table
    assert f"{results['1k'].metrics.rsum:.1f}" in table


def test_cli_on_vsepp_files(tmp_path, capsys) -> None:
    ci = vsepp_caption_image(30)
    im, _ = random_embeddings(30, 150, 8, "order", seed=11)
    cap = correlated(im, ci, 12, "order")
    np.save(tmp_path / "img.npy", np.repeat(im, 5, axis=0))  # VSE++ saves each image five times
    np.save(tmp_path / "cap.npy", cap)
    out = tmp_path / "res.json"
    files = ["--img-emb", str(tmp_path / "img.npy"), "--cap-emb", str(tmp_path / "cap.npy")]
    code = train_main(["evaluate", *files, "--measure", "order", "--protocol", "1k,5cv", "--protocol", "all",
                       "--fold-size", "6", "--json", str(out), "--device", "cpu"])
    printed = capsys.readouterr().out
    assert code == 0 and "taking every 5th row" in printed and "COCO-5cv" in printed
    data = json.loads(out.read_text())
    want = naive_protocol(im, cap, ci, "order", "5cv", fold_size=6)
    assert data["5cv"]["t2i"]["meanr"] == pytest.approx(want["t2i"]["meanr"])
    want_all = naive_protocol(im, cap, ci, "order", "all", 6)
    assert data["all"]["i2t"]["r1"] == pytest.approx(want_all["i2t"]["r1"])

    np.save(tmp_path / "short.npy", im[:29])
    code = train_main(["evaluate", "--img-emb", str(tmp_path / "short.npy"), "--cap-emb",
                       str(tmp_path / "cap.npy"), "--measure", "order"])
    assert code == 2 and "29 images x 5 captions per image != 150" in capsys.readouterr().err
