"""Noise-robustness and text-length analyses, with a deterministic toy text encoder."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from train.retrieval.evaluate import (
    ground_truth_ranks,
    metrics_from_ranks,
    select_image_rows,
    vsepp_caption_image,
)
from train.retrieval.evaluate.analysis import (
    add_character_noise,
    alphabet_from_chars_json,
    caption_alphabet,
    length_analysis,
    length_groups,
    noise_robustness,
    parse_ratio_range,
    plot_noise,
)
from vsecore.errors import UserError

DIM = 512


def bigram_encoder(texts: list[str]) -> torch.Tensor:
    """Toy text encoder: L2-normalised counts of character bigrams hashed into DIM buckets, (M, DIM)."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for row, text in enumerate(texts):
        padded = f" {text} "
        for a, b in zip(padded, padded[1:], strict=False):
            out[row, (ord(a) * 131 + ord(b)) % DIM] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return torch.from_numpy(out / np.maximum(norms, 1e-12))


WORDS = ("a man woman dog cat riding bike red blue green sitting table pizza plate street car bus train "
         "standing next to on the with holding small large white black young old grass field beach").split()


def toy_dataset(n_images: int, per_image: int, seed: int) -> tuple[torch.Tensor, list[str], np.ndarray]:
    """Images whose embedding is the mean encoding of their captions; captions share image-specific words."""
    rng = np.random.default_rng(seed)
    texts, caption_image = [], []
    for i in range(n_images):
        topic = list(rng.choice(WORDS, size=4, replace=False))
        for _ in range(per_image):
            extra = list(rng.choice(WORDS, size=int(rng.integers(1, 4 + i % 7))))
            words = topic + extra
            rng.shuffle(words)
            texts.append(" ".join(words))
            caption_image.append(i)
    ci = np.array(caption_image)
    cap = bigram_encoder(texts)
    images = torch.zeros(n_images, DIM).index_add_(0, torch.from_numpy(ci), cap)
    return torch.nn.functional.normalize(images, dim=1), texts, ci


def test_parse_ratio_range() -> None:
    ratios = parse_ratio_range("0.01:0.25:0.01")
    assert len(ratios) == 25 and ratios[0] == 0.01 and ratios[-1] == 0.25
    assert parse_ratio_range("0.05,0.1") == [0.05, 0.1]
    for bad in ("0.1:0.01:0.01", "a:b:c", "0:0.2:0.1", "1.5"):
        with pytest.raises(UserError):
            parse_ratio_range(bad)


def test_character_noise_changes_exactly_the_promised_count() -> None:
    texts = ["a dog on a bench", "x", "", "two cats sleeping on a red sofa in the sun"]
    alphabet = caption_alphabet(texts)
    for ratio in (0.01, 0.1, 0.25, 1.0):
        noisy = add_character_noise(texts, ratio, alphabet, np.random.default_rng(0))
        for before, after in zip(texts, noisy, strict=True):
            assert len(after) == len(before)
            changed = sum(x != y for x, y in zip(before, after, strict=True))
            want = 0 if not before else min(len(before), max(1, int(np.floor(ratio * len(before) + 0.5))))
            assert changed == want  # at least one character, and every replacement differs
            assert set(after) <= set(alphabet) | set(before)
    again = add_character_noise(texts, 0.1, alphabet, np.random.default_rng(0))
    assert again == add_character_noise(texts, 0.1, alphabet, np.random.default_rng(0))
    with pytest.raises(UserError):
        add_character_noise(texts, 0.1, ["a"], np.random.default_rng(0))


def test_alphabet_from_chars_json(tmp_path: Path) -> None:
    path = tmp_path / "chars.json"
    symbols = ["<pad>", "<unk>", " ", "a", "b"]
    path.write_text(json.dumps({"pad": "<pad>", "unk": "<unk>", "symbols": symbols}))
    assert alphabet_from_chars_json(path) == [" ", "a", "b"]


def test_noise_degrades_toy_retrieval_and_writes_plot(tmp_path: Path) -> None:
    images, texts, ci = toy_dataset(40, 5, seed=0)
    result = noise_robustness(images, texts, ci, bigram_encoder, "cosine", [0.02, 0.3, 0.6], protocol="1k",
                              fold_size=20, seed=1, device="cpu")
    assert result.clean.t2i.r10 > 80  # the toy encoder retrieves well without noise
    r10 = [m.t2i.r10 for m in result.metrics]
    r1 = [m.i2t.r1 for m in result.metrics]
    assert r10[0] > r10[2] and r1[0] > r1[2] and result.metrics[2].t2i.r1 < result.clean.t2i.r1
    again = noise_robustness(images, texts, ci, bigram_encoder, "cosine", [0.3], protocol="1k", fold_size=20,
                             seed=1, device="cpu")
    assert again.metrics[0] == result.metrics[1]  # a ratio's noise depends only on (seed, ratio)
    data = result.to_json()
    assert [e["ratio"] for e in data["ratios"]] == [0.02, 0.3, 0.6]
    assert set(data["ratios"][0]["i2t"]) == {"r1", "r10"}
    png = plot_noise(result, tmp_path / "noise.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_length_groups_and_restricted_evaluation() -> None:
    images, texts, ci = toy_dataset(40, 3, seed=2)
    longest, shortest = length_groups(texts, ci, 40, count=10)
    lengths = np.array([len(t) for t in texts])
    mean_len = np.array([lengths[ci == i].mean() for i in range(40)])
    assert mean_len[longest].min() >= np.sort(mean_len)[-10]
    assert mean_len[shortest].max() <= np.sort(mean_len)[9]
    assert not set(longest) & set(shortest)
    captions = bigram_encoder(texts)
    got = length_analysis(images, captions, ci, texts, "order", count=10, device="cpu")
    assert list(got) == ["10 longest", "10 shortest"]
    sub_img, sub_cap, sub_ci = select_image_rows(images, captions, torch.from_numpy(ci), shortest)
    assert sub_cap.shape[0] == 30 and sorted(sub_ci.tolist()) == sorted(list(range(10)) * 3)
    want = metrics_from_ranks(ground_truth_ranks(sub_img, sub_cap, sub_ci, "order", device="cpu"))
    assert got["10 shortest"] == want
    with pytest.raises(UserError, match="at least 200 images"):
        length_groups(texts, ci, 40)


def fake_run(tmp_path: Path, images: torch.Tensor, texts: list[str], ci: np.ndarray, monkeypatch,
             embedded: list[str] | None = None) -> None:
    """``evaluate_run`` opens and embeds with the toy encoder: a run on cosine whose test split is
    ``images``."""
    import train.retrieval.evaluate.run as runs

    sentences = [SimpleNamespace(imgid=int(i)) for i in ci]
    dataset = SimpleNamespace(sentences_of=lambda split, lang: sentences)
    fake = SimpleNamespace(settings=SimpleNamespace(measure="cosine", order_sqrt=False, data=str(tmp_path),
                                                    lang="en"),
                           device=torch.device("cpu"), epoch=3, dataset=dataset)
    emb = SimpleNamespace(images=images, captions=bigram_encoder(texts), caption_image=torch.from_numpy(ci),
                          texts=texts)

    def embed_split(run, split, lang=None):
        if embedded is not None:
            embedded.append(split)
        return emb

    monkeypatch.setattr(runs, "load_run", lambda run_dir, checkpoint, device: fake)
    monkeypatch.setattr(runs, "embed_split", embed_split)
    monkeypatch.setattr(runs, "encode_texts", lambda run, t: bigram_encoder(t))


def test_evaluate_run_writes_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """``train evaluate --run`` with the run loading replaced by the toy encoder."""
    from train.cli import main as train_main

    images, texts, ci = toy_dataset(24, 5, seed=3)
    fake_run(tmp_path, images, texts, ci, monkeypatch)
    run_dir = tmp_path / "run"
    code = train_main(["evaluate", "--run", str(run_dir), "--protocol", "1k", "--protocol", "all",
                       "--fold-size", "12", "--noise", "0.05:0.15:0.05", "--length-analysis",
                       "--length-count", "5"])
    printed = capsys.readouterr().out
    assert code == 0 and "Robustness to input noise" in printed and "5 longest" in printed
    data = json.loads((run_dir / "eval" / "test_best.json").read_text())
    assert set(data) == {"1k", "all"}
    noise = json.loads((run_dir / "eval" / "noise_test.json").read_text())
    assert [e["ratio"] for e in noise["ratios"]] == [0.05, 0.1, 0.15] and noise["protocol"] == "1k"
    assert (run_dir / "eval" / "noise_test.png").stat().st_size > 1000
    length = json.loads((run_dir / "eval" / "length_test.json").read_text())
    assert set(length) == {"5 longest", "5 shortest"}


def test_evaluate_run_checks_the_protocol_before_embedding(tmp_path: Path, monkeypatch, capsys) -> None:
    from train.cli import main as train_main

    images, texts, ci = toy_dataset(101, 5, seed=4)
    embedded: list[str] = []
    fake_run(tmp_path, images, texts, ci, monkeypatch, embedded)
    code = train_main(["evaluate", "--run", str(tmp_path / "run"), "--protocol", "all,5k"])
    err = capsys.readouterr().err
    assert code == 2 and "protocol 5k needs at least 5000 images, the test split has 101" in err
    code = train_main(["evaluate", "--run", str(tmp_path / "run"), "--length-analysis"])
    assert code == 2 and "needs at least 200 images" in capsys.readouterr().err
    assert embedded == []  # nothing was embedded
    ranks = tmp_path / "ranks.csv"
    assert train_main(["evaluate", "--run", str(tmp_path / "run"), "--protocol", "all", "--ranks", str(ranks),
                       "--topk", "3"]) == 0
    assert embedded == ["test"]
    rows = ranks.read_text().splitlines()
    assert rows[0] == "protocol,fold,direction,query,rank,ties,ground_truth,topk,topk_scores"
    assert len(rows) == 1 + 101 + 505
    assert rows[1].startswith("all,0,i2t,0,") and rows[102].startswith("all,0,t2i,0,")
    want = ground_truth_ranks(images, bigram_encoder(texts), ci, "cosine", device="cpu", topk=3)
    first = rows[1].split(",")
    assert int(first[4]) == want.i2t[0] and first[6] == "0 1 2 3 4"
    assert first[7] == " ".join(str(c) for c in want.i2t_topk[0])


def test_analyses_use_the_evaluator_and_its_tie_rule(tmp_path: Path) -> None:
    """Duplicate captions tie: the analyses rank pessimistically and warn, like ``train evaluate``."""
    images, texts, ci = toy_dataset(30, 2, seed=5)
    texts = [texts[0]] * len(texts)  # every caption the same text: all candidates tie
    captions = bigram_encoder(texts)
    lines: list[str] = []
    got = length_analysis(images, captions, ci, texts, "cosine", count=10, device="cpu", log=lines.append)
    for metrics in got.values():
        assert metrics.i2t.r1 == 0.0 and metrics.i2t.meanr == 20 - 2 + 1  # the worst rank among 10 x 2
        assert metrics.i2t.ties == 10
    assert sum("tied by another candidate" in line for line in lines) == 2  # once per evaluated group
    lines.clear()
    result = noise_robustness(images, texts, ci, bigram_encoder, "cosine", [0.5], protocol="all",
                              device="cpu", log=lines.append)
    assert result.clean.i2t.r1 == 0.0 and result.clean.i2t.ties == 30
    assert any("caption embeddings are constant" in line for line in lines)
    ranks = ground_truth_ranks(images, captions, vsepp_caption_image(30, 2), "cosine", device="cpu",
                               log=lambda line: None)
    assert metrics_from_ranks(ranks) == result.clean
