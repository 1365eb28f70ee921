"""``train clmr`` / ``train liwe`` end to end on the synthetic dataset (en/de/ja captions and aligned pairs)
over a small region store: the families' wiring, the eta schedule, the cross-language loss, multilingual
training, per-language evaluation and exact resume.

Regions are made from the image's English caption (one fixed random vector per word, plus noise), so they
describe the image as its captions do; ``counts`` varies per image, so padding is masked. Models are tiny
(d = 16) and torch runs one thread: every run is deterministic on CPU and takes a second or two.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    REGION_DIM,
    REGION_K,
    assert_same_weights,
    make_region_store,
    metrics_without_timings,
    train_cli,
)

from pipelines.schema import load_pipelines
from prep.cli import main as prep_main
from train.engine.data import PairBatch, read_region_counts
from train.engine.losses import hard_negative_weight, scheduled_contrastive_loss
from train.engine.objectives import ScheduledContrastiveObjective
from train.models.family import train_settings, with_family_defaults
from train.retrieval.open import load_run
from train.run.checkpoint import load_checkpoint
from vsecore.errors import UserError

K, DIM = REGION_K, REGION_DIM
TINY = ["--d", "16", "--batch-size", "16", "--seed", "1", "--device", "cpu", "--val-images", "6"]
LIWE = ["--layers", "8,8", "--word-length", "8"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("liwe")
    prepared = root / "prepared"
    assert prep_main(["synthetic", "--out", str(prepared), "--num-images", "48", "--image-size", "32",
                      "--captions-per-image", "2", "-q"]) == 0
    store = make_region_store(root / "regions.zarr", prepared)
    return prepared, f"{store}:regions"


def test_dry_run_prints_the_papers_word_embedder_count(capsys) -> None:
    assert train_cli(["liwe", "--dry-run", "--alphabet-size", "101", "--word-length", "26",
                      "--layers", "128,256", "--vocab-size", "20000"]) == 0
    out = capsys.readouterr().out
    assert "image features 36 x 2048" in out
    counts = {" ".join(line.split()[:-1]): int(line.split()[-1].replace(",", ""))
              for line in out.splitlines()[1:7]}
    assert counts["word embedder"] == 115_064  # 101 x 24 + 24 x 26 x 128 + 128 x 256
    assert counts["text encoder"] == counts["word embedder"] + counts["caption gru"]
    assert counts["text projection"] == 0
    assert "CLMR word table for the same data: 20,000 words x 300 = 6,000,000" in out
    assert train_cli(["clmr", "--dry-run", "--vocab-size", "20000"]) == 0
    assert "word table        6,000,000" in capsys.readouterr().out


def test_other_families_reject_the_liwe_keys(tmp_path) -> None:
    for key, value in (("eta", 0.9), ("cross_lang", ["de"]), ("langs", ["en"]), ("layers", [8])):
        with pytest.raises(ValueError, match=f"'{key}' applies to family"):
            train_settings(family="chain", out="r", **{key: value})
    with pytest.raises(ValueError, match="'layers' applies to family liwe"):
        train_settings(family="clmr", out="r", layers=[8])
    with pytest.raises(ValueError, match="cosine"):
        train_settings(family="liwe", out="r", measure="order")
    with pytest.raises(ValueError, match="use eta 0"):
        train_settings(family="clmr", out="r", loss="max")
    with pytest.raises(ValueError, match="must include lang"):
        train_settings(family="liwe", out="r", langs=["de"])
    # the family's defaults (LAVSE), applied by the registry as for every family
    liwe = with_family_defaults(train_settings(family="liwe", out="r"))
    assert (liwe.margin, liwe.measure) == (0.2, "cosine")
    assert with_family_defaults(train_settings(family="liwe", out="r", margin=0.1)).margin == 0.1
    assert train_settings(family="chain", out="r").margin == 0.05
    yaml = tmp_path / "pipelines.yaml"
    yaml.write_text("pipelines:\n  p:\n    description: d\n    prep: {dataset: synthetic, out: data}\n"
                    "    train: {family: oecc, cross_lang: [de], out: run}\n")
    with pytest.raises(UserError, match="'cross_lang' applies to family clmr/liwe"):
        load_pipelines(yaml)
    with pytest.raises(SystemExit):
        train_cli(["chain", "--dry-run", "--eta", "0.5"])


def test_region_counts_come_from_the_store(synthetic, tmp_path) -> None:
    prepared, features = synthetic
    counts = read_region_counts(features)
    assert counts is not None and counts.min() >= 1 and counts.max() == K and (counts < K).any()
    bare = make_region_store(tmp_path / "no_counts.zarr", prepared, with_counts=False)
    assert read_region_counts(f"{bare}:regions") is None  # then every region is real


def test_objective_adds_the_mean_cross_language_loss() -> None:
    torch.manual_seed(0)
    from train.models.joint import build_model

    settings = train_settings(family="liwe", out="r", d=8, layers=[4, 4], word_length=5)
    model = build_model(settings, 20, (K, DIM))
    text = torch.randint(2, 20, (4, 3, 5))
    lengths = torch.tensor([3, 2, 3, 1])
    pairs = tuple(PairBatch(torch.randint(2, 20, (4, 3, 5)), lengths, torch.randint(2, 20, (4, 2, 5)),
                            torch.tensor([2, 2, 1, 2]), lang) for lang in ("de", "ja"))
    from train.engine.data import Batch

    batch = Batch(torch.randn(4, K, DIM), text, lengths, torch.arange(4), torch.tensor([6, 3, 1, 4]))
    objective = ScheduledContrastiveObjective(eta=0.5, margin=0.2, iteration=3)
    plain = objective(model, batch, 3, torch.no_grad)
    objective.iteration = 3
    with_pairs = objective(model, batch._replace(pairs=pairs), 3, torch.no_grad)
    weight = hard_negative_weight(0.5, 4)  # the 4th step: 1 - eta^4, as LAVSE counts
    assert objective.last_terms["lambda"] == pytest.approx(weight) == 0.9375
    expected = [scheduled_contrastive_loss(model.encode_captions(p.text, p.lengths),
                                           model.encode_captions(p.other_text, p.other_lengths), weight)
                for p in pairs]
    assert with_pairs.item() == pytest.approx(plain.item() + (expected[0] + expected[1]).item() / 2, rel=1e-5)
    assert objective.last_terms["cross_de"] == pytest.approx(expected[0].item(), rel=1e-5)
    assert objective.state_dict() == {"iteration": 4, "eta": 0.5}
    # at iteration 0 the loss is the sum of hinges, at lambda = 1 the max of hinges
    from train.engine.losses import contrastive_loss

    a, b = torch.nn.functional.normalize(torch.randn(5, 8), dim=1), torch.nn.functional.normalize(
        torch.randn(5, 8), dim=1)
    for reduction, w in (("sum", hard_negative_weight(0.991, 0)), ("max", 1.0)):
        assert scheduled_contrastive_loss(a, b, w).item() == pytest.approx(
            contrastive_loss(a, b, "cosine", 0.2, reduction).item(), rel=1e-6)


def test_multilingual_liwe_run_with_cross_language_loss(synthetic, tmp_path, capsys) -> None:
    prepared, features = synthetic
    run = tmp_path / "liwe"
    assert train_cli(["liwe", "--data", str(prepared), "--features", features, *TINY, *LIWE, "--epochs", "2",
                      "--langs", "en,de,ja", "--cross-lang", "de,ja", "--eta", "0.9", "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "cross-language loss:" in out and "en-ja" in out
    for lang in ("en", "de", "ja"):
        assert f"test split, {lang} captions" in out
    config = json.loads((run / "config.json").read_text())
    data = json.loads((prepared / "dataset.json").read_text())
    n_train = sum(im["split"] == "train" for im in data["images"])
    assert config["data"]["train"]["captions"] == 3 * 2 * n_train  # every language's captions
    train_pairs = sum(p["split"] == "train" for p in data["pairs"])
    assert config["data"]["train_pairs"] == {"en-de": train_pairs, "en-ja": train_pairs}
    assert config["feature_shape"] == [K, DIM] and config["text_input"] == "word_chars"
    assert config["settings"]["measure"] == "cosine" and config["settings"]["word_length"] == 8
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    assert state["objective"] == {"iteration": state["global_step"], "eta": 0.9}
    test = json.loads((run / "eval" / "test.json").read_text())
    assert set(test["languages"]) == {"en", "de", "ja"} and test["lang"] == "en"
    assert test["protocols"] == test["languages"]["en"]["protocols"]
    assert all(v["protocols"]["all"]["rsum"] > 0 for v in test["languages"].values())
    # train evaluate --lang gives the same numbers as the run's own per-language evaluation
    from train.retrieval.evaluate.run import evaluate_run

    evaluate_run(run, "test", ["all"], lang="de", device="cpu", log=lambda _: None)
    de = json.loads((run / "eval" / "test_best_de.json").read_text())
    assert de["all"]["rsum"] == pytest.approx(test["languages"]["de"]["protocols"]["all"]["rsum"])
    loaded = load_run(run, "best", "cpu")
    assert np.array_equal(loaded.region_counts, read_region_counts(features))

    # the paper's setting (LAVSE's adapt runs): English image-caption loss, de and ja only through the
    # cross-language loss, evaluated in all three. Without that term (same seed, batches) the weights differ
    plain = tmp_path / "plain"
    assert train_cli(["liwe", "--data", str(prepared), "--features", features, *TINY, *LIWE, "--epochs", "1",
                      "--eta", "0.9", "--out", str(plain)]) == 0
    assert set(json.loads((plain / "eval" / "test.json").read_text())["languages"]) == {"en"}
    one = tmp_path / "one"
    assert train_cli(["liwe", "--data", str(prepared), "--features", features, *TINY, *LIWE, "--epochs", "1",
                      "--cross-lang", "de,ja", "--eta", "0.9", "--out", str(one)]) == 0
    assert set(json.loads((one / "eval" / "test.json").read_text())["languages"]) == {"en", "de", "ja"}
    a = load_checkpoint(plain / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(one / "checkpoints" / "last.pt")["model"]
    assert not torch.equal(a["text_encoder.word_embedder.layers.0.weight"],
                           b["text_encoder.word_embedder.layers.0.weight"])


def test_clmr_loss_decreases(synthetic, tmp_path) -> None:
    prepared, features = synthetic
    run = tmp_path / "clmr"
    # eta = 1: lambda stays 0, the sum of hinges throughout, so epoch losses are comparable
    assert train_cli(["clmr", "--data", str(prepared), "--features", features, *TINY, "--epochs", "3",
                      "--eta", "1", "--lr", "0.003", "--out", str(run)]) == 0
    losses = [r["loss"] for r in metrics_without_timings(run)]
    assert losses[0] > losses[1] > losses[2]
    config = json.loads((run / "config.json").read_text())
    assert config["text_input"] == "words" and "text_encoder.word_table" in config["parameters"]


def test_resume_mid_epoch_is_exact(synthetic, tmp_path, monkeypatch) -> None:
    prepared, features = synthetic
    args = ["liwe", "--data", str(prepared), "--features", features, *TINY, *LIWE, "--epochs", "2",
            "--langs", "en,de", "--cross-lang", "de,ja", "--eta", "0.95", "--checkpoint-every", "4"]
    whole = tmp_path / "whole"
    assert train_cli([*args, "--out", str(whole)]) == 0

    class Killed(Exception):
        pass

    original = ScheduledContrastiveObjective.__call__

    def dies_at_step_14(self, model, batch, step, autocast):
        if step == 14:  # mid-epoch 2 (10 steps per epoch); the newest checkpoint is step 12's
            raise Killed
        return original(self, model, batch, step, autocast)

    monkeypatch.setattr(ScheduledContrastiveObjective, "__call__", dies_at_step_14)
    cut = tmp_path / "cut"
    with pytest.raises(Killed):
        train_cli([*args, "--out", str(cut)])
    state = load_checkpoint(cut / "checkpoints" / "last.pt")
    assert state["global_step"] == 12 and state["position"] > 0 and state["objective"]["iteration"] == 12
    monkeypatch.setattr(ScheduledContrastiveObjective, "__call__", original)
    assert train_cli(["liwe", "--out", str(cut), "--resume"]) == 0
    assert_same_weights(whole / "checkpoints" / "last.pt", cut / "checkpoints" / "last.pt")
    assert metrics_without_timings(whole) == metrics_without_timings(cut)
    assert (json.loads((whole / "eval" / "test.json").read_text())
            == json.loads((cut / "eval" / "test.json").read_text()))
