"""``train seam`` and ``train vse``: wiring into the one trainer, family defaults, the step schedule,
the PH/POE curriculum (with exact resume across its phase switch) and training on an int8 FNE store.

Small models (d=32, a few hops, tiny GRUs) and one torch thread: every run takes a few seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    VSE_SMALL,
    assert_same_weights,
    make_prepared,
    make_store,
    metrics_without_timings,
    train_cli,
)

from prep.dataset import PreparedDataset
from train.engine.objectives import ContrastiveObjective, CurriculumObjective
from train.models.family import build_objective, model_spec, train_settings, with_family_defaults
from train.retrieval import fit
from train.run.checkpoint import load_checkpoint
from vsecore.errors import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COMMON = ["--d", "32", "--batch-size", "8", "--seed", "1", "--device", "cpu"]
SEAM_SMALL = ["--hops", "2", *COMMON]

#: SEAM table 2, text side, vocabulary 11,360 (the issue's four rows)
TABLE_2 = {("E", 10): 6_574_024, ("E", 30): 12_724_024, ("C", 5): 6_273_724, ("C", 20): 13_967_224}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("words")
    prepared = make_prepared(root / "prepared", n_train=60, n_val=8, n_test=8)
    store = make_store(root / "feats.zarr", prepared)
    return prepared, f"{store}:global"


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def dry_run_counts(out: str) -> dict[str, int]:
    counts = {}
    for line in out.splitlines()[1:]:
        name, value = line.split("  (")[0].rsplit(None, 1)
        counts[name.strip()] = int(value.replace(",", ""))
    return counts


@pytest.mark.parametrize(("variant", "hops"), list(TABLE_2))
def test_seam_dry_run_prints_table_2_text_side_counts(variant, hops, capsys) -> None:
    assert train_cli(["seam", "--variant", variant, "--hops", str(hops), "--dry-run",
                      "--vocab-size", "11360"]) == 0
    counts = dry_run_counts(capsys.readouterr().out)
    assert counts["text side"] == TABLE_2[variant, hops]
    assert counts["text side"] == counts["text encoder"] + counts["text projection"]
    assert counts["image encoder"] == 4096 * 1024


def test_family_keys_belong_to_their_family(capsys) -> None:
    for family, key, value in (("chain", "hops", 3), ("oecc", "variant", "C"), ("seam", "kind", "PH"),
                               ("vse", "penalty", 0.5), ("chain", "word_dim", 300)):
        with pytest.raises(ValueError, match=f"'{key}' applies to family"):
            train_settings(family=family, out="r", **{key: value})
    with pytest.raises(SystemExit):
        train_cli(["chain", "--hops", "3", "--dry-run"])
    assert "unrecognized arguments: --hops" in capsys.readouterr().err


def test_family_defaults_resolve_seam_and_the_vse_presets() -> None:
    seam = with_family_defaults(train_settings(family="seam", out="r", variant="C"))
    assert (seam.hops, seam.lr_schedule, seam.lr_step, seam.epochs) == (5, "step", 15, 30)
    assert (seam.measure, seam.loss, seam.margin, seam.lr, seam.batch_size) == \
        ("order", "sum", 0.05, 1e-3, 128)
    spec = model_spec(seam)
    assert spec.text_encoder == "seam_c" and spec.text_projection_bias and spec.absolute
    assert spec.text_input == "words"
    # explicit settings win over the family's defaults
    assert with_family_defaults(train_settings(family="seam", out="r", hops=7, lr_schedule="plateau")).hops \
        == 7
    assert with_family_defaults(train_settings(family="seam", out="r", lr_schedule="plateau")).lr_schedule \
        == "plateau"

    # FNE paper table 1: d depends on the dataset, everything else on the pipeline
    mh = {name: with_family_defaults(train_settings(family="vse", out="r", kind="MH"), name)
          for name in ("f8k", "f30k", "coco", "synthetic")}
    assert [mh[n].d for n in ("f8k", "f30k", "coco", "synthetic")] == [1024, 1536, 2048, 2048]
    m = mh["coco"]
    assert (m.loss, m.measure, m.margin, m.lr, m.word_dim, m.absolute) == \
        ("max", "cosine", 0.2, 2e-4, 1024, False)
    assert (m.captions_per_epoch, m.lr_schedule, m.epochs) == ("one", "constant", 200)
    moe_bl = with_family_defaults(train_settings(family="vse", out="r", kind="MOE-bl"), "f8k")
    assert (moe_bl.measure, moe_bl.loss, moe_bl.absolute, moe_bl.margin, moe_bl.lr) == \
        ("order", "max", False, 0.2, 2e-4)
    sh_bl = with_family_defaults(train_settings(family="vse", out="r", kind="SH-bl"), "coco")
    assert (sh_bl.word_dim, sh_bl.lr, sh_bl.d) == (2000, 2.5e-4, 2048)
    poe = with_family_defaults(train_settings(family="vse", out="r", kind="POE"), "coco")
    assert (poe.d, poe.loss, poe.measure, poe.absolute, poe.lr, poe.finetune_lr) == \
        (2048, "sum", "order", True, 1e-3, 1e-4)
    objective = build_objective(poe)
    assert isinstance(objective, CurriculumObjective) and objective.phases == ("sum", "max")
    assert not isinstance(build_objective(m), CurriculumObjective) and build_objective(m).reduction == "max"
    spec = model_spec(poe)
    assert (spec.text_encoder, spec.text_projection, spec.absolute) == ("uvs_gru", False, True)


def test_train_seam_step_schedule_and_penalty(data, tmp_path, monkeypatch) -> None:
    prepared, features = data
    # each training step's loss and the model's penalty in it (the objective's own numbers)
    steps: list[tuple[float, float | None]] = []
    real_call = ContrastiveObjective.__call__

    def spy(self, model, batch, step, autocast):
        loss = real_call(self, model, batch, step, autocast)
        penalty = model.penalty()
        steps.append((float(loss.detach()), None if penalty is None else float(penalty.detach())))
        return loss

    monkeypatch.setattr(ContrastiveObjective, "__call__", spy)
    args = ["seam", "--data", str(prepared), "--features", features, "--variant", "C", *SEAM_SMALL,
            "--epochs", "3", "--lr-step", "2"]
    run = tmp_path / "seam"
    assert train_cli([*args, "--penalty", "0.5", "--out", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["text_input"] == "words" and config["settings"]["lr_schedule"] == "step"
    assert config["vocab_size"] == len(PreparedDataset.load(prepared).words)
    assert set(config["fingerprints"]) == {"dataset_json", "chars_json", "words_json", "features",
                                           "features_layout"}
    recs = records(run)
    # /10 after every --lr-step epochs: epochs 1-2 at 1e-3, epoch 3 at 1e-4 (no plateau decay)
    assert [r["lr"] for r in recs] == pytest.approx([1e-3, 1e-3, 1e-4])
    # every caption each epoch (SEAM), not one per image
    assert recs[0]["captions"] == config["data"]["train"]["captions"]
    state = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    assert any(k.startswith("text_encoder.convs.") for k in state) and "text_projection.bias" in state
    # the penalty is part of the loss. Compared on the first step, where both runs hold the same weights
    # (same seed) and the same batch, so that the ranking part is the same float: with lambda = 0.5 the loss
    # is that plus a positive penalty, with lambda = 0 nothing is added. (Epoch means would compare two
    # trajectories, which the CPU's kernels decide.)
    penalised = steps[0]
    steps.clear()
    plain = tmp_path / "plain"
    assert train_cli([*args, "--epochs", "1", "--out", str(plain)]) == 0
    unpenalised = steps[0]
    assert unpenalised[1] is None and penalised[1] > 0
    assert penalised[0] == pytest.approx(unpenalised[0] + penalised[1], rel=1e-6)
    assert json.loads((run / "eval" / "test.json").read_text())["protocols"]["all"]["rsum"] > 0


def test_train_vse_one_caption_per_image_and_its_preset(data, tmp_path) -> None:
    prepared, features = data
    run = tmp_path / "vse"
    assert train_cli(["vse", "--data", str(prepared), "--features", features, "--kind", "SOE", *VSE_SMALL,
                      "--epochs", "2", "--out", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())
    s = config["settings"]
    assert (s["kind"], s["measure"], s["loss"], s["margin"], s["absolute"], s["captions_per_epoch"]) == \
        ("SOE", "order", "sum", 0.05, True, "one")
    assert s["d"] == 32 and s["word_dim"] == 16  # explicit options beat the preset
    recs = records(run)
    assert [r["lr"] for r in recs] == [1e-3, 1e-3]  # constant
    assert all(r["captions"] == config["data"]["train"]["images"] for r in recs)
    assert "phase" not in recs[0]
    test = json.loads((run / "eval" / "test.json").read_text())
    assert test["measure"] == "order" and test["protocols"]["all"]["rsum"] > 0


def _scripted_validation(monkeypatch, script: list[float]) -> None:
    # the rsum of epoch k (0-based) is script[k], whatever the run: a resumed run sees the same values
    monkeypatch.setattr(fit.Trainer, "validate", lambda self: (script[self.epoch], {}))


def test_poe_curriculum_switches_to_max_from_the_best_checkpoint(data, tmp_path, monkeypatch, capsys) -> None:
    prepared, features = data
    _scripted_validation(monkeypatch, [10.0, 12.0, 11.0, 13.0, 9.0, 8.0, 7.0])
    monkeypatch.setattr(fit, "evaluate_after_training", lambda *a, **k: None)
    run = tmp_path / "poe"
    assert train_cli(["vse", "--data", str(prepared), "--features", features, "--kind", "POE", *VSE_SMALL,
                      "--epochs", "5", "--early-stop", "1", "--out", str(run)]) == 0
    recs = records(run)
    # sum until an epoch without improvement (early_stop 1), then max from the best (epoch 2) weights
    # at the fine-tuning rate, until an epoch without improvement again
    assert [r["phase"] for r in recs] == ["sum", "sum", "sum", "max", "max"]
    assert [r["lr"] for r in recs] == pytest.approx([1e-3, 1e-3, 1e-3, 1e-4, 1e-4])
    assert [r["best_rsum"] for r in recs] == [10.0, 12.0, 12.0, 13.0, 13.0]
    assert "phase 2 (max of hinges) from the best checkpoint (epoch 2" in capsys.readouterr().out
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    assert last["objective"] == {"phase": 1} and last["phase_start_epoch"] == 3 and last["finished"]
    assert load_checkpoint(run / "checkpoints" / "best.pt")["epoch"] == 4


def test_curriculum_phase_switch_reloads_the_best_weights(data, tmp_path, monkeypatch) -> None:
    prepared, features = data
    _scripted_validation(monkeypatch, [10.0, 9.0, 8.0])
    monkeypatch.setattr(fit, "evaluate_after_training", lambda *a, **k: None)
    seen: dict[str, dict] = {}
    original = fit.Trainer._next_phase

    def spy(self) -> None:
        original(self)
        seen["after"] = {k: v.clone() for k, v in self.model.state_dict().items()}

    monkeypatch.setattr(fit.Trainer, "_next_phase", spy)
    run = tmp_path / "ph"
    assert train_cli(["vse", "--data", str(prepared), "--features", features, "--kind", "PH", *VSE_SMALL,
                      "--epochs", "1", "--early-stop", "5", "--out", str(run)]) == 0
    # PH: same learning rate in both phases; the phase budget is --epochs each
    recs = records(run)
    assert [r["phase"] for r in recs] == ["sum", "max"] and [r["lr"] for r in recs] == [2e-4, 2e-4]
    best = load_checkpoint(run / "checkpoints" / "best.pt")
    assert best["epoch"] == 1
    for key, value in best["model"].items():
        assert torch.equal(seen["after"][key], value), key


def test_resume_across_the_curriculum_switch_equals_an_uninterrupted_run(data, tmp_path, monkeypatch) -> None:
    prepared, features = data
    _scripted_validation(monkeypatch, [10.0, 12.0, 11.0, 13.0, 14.0, 9.0, 8.0])
    common = ["vse", "--data", str(prepared), "--features", features, "--kind", "POE", *VSE_SMALL,
              "--epochs", "3", "--early-stop", "1"]
    straight = tmp_path / "straight"
    assert train_cli([*common, "--out", str(straight)]) == 0

    killed = tmp_path / "killed"
    original = fit.Trainer.save

    def die_after_switch(self, name: str) -> None:
        original(self, name)
        if name == "last.pt" and self.epoch == 3:  # the checkpoint written right after the switch
            raise RuntimeError("killed")

    monkeypatch.setattr(fit.Trainer, "save", die_after_switch)
    with pytest.raises(RuntimeError, match="killed"):
        train_cli([*common, "--out", str(killed)])
    monkeypatch.setattr(fit.Trainer, "save", original)
    state = load_checkpoint(killed / "checkpoints" / "last.pt")
    assert state["objective"] == {"phase": 1} and state["epoch"] == 3 and not state["finished"]
    assert train_cli(["vse", "--out", str(killed), "--resume"]) == 0
    assert metrics_without_timings(killed) == metrics_without_timings(straight)
    assert [r["phase"] for r in records(killed)] == ["sum", "sum", "sum", "max", "max", "max"]
    assert_same_weights(killed / "checkpoints" / "last.pt", straight / "checkpoints" / "last.pt")
    assert_same_weights(killed / "checkpoints" / "best.pt", straight / "checkpoints" / "best.pt")


def make_fne_store(path: Path, prepared: Path, width: int = 40, seed: int = 0) -> Path:
    """A complete FNE store (``fne/raw`` with a class signal, train statistics, int8 ``fne/ternary``)."""
    from features.store.core import FeatureStore
    from features.store.ternary import finish_fne

    dataset = json.loads((prepared / "dataset.json").read_text())
    n = len(dataset["images"])
    rng = np.random.default_rng(seed)
    raw = rng.normal(0, 1, (n, width)).astype(np.float32)
    raw[np.arange(n), np.arange(n) % 6] += 3.0
    store = FeatureStore.create(path, np.arange(n), {"fne/raw": width}, block_size=n, config={"test": True},
                                provenance={"network": "synthetic"})
    store.write_block(0, {"fne/raw": raw}, np.ones(n, dtype=bool), [])
    store.set_attrs(complete=True)
    train = np.array([im["split"] == "train" for im in dataset["images"]])
    finish_fne(store, train, -0.25, 0.15)
    return path


def test_vse_and_seam_train_on_the_int8_fne_without_a_float_copy(data, tmp_path, monkeypatch) -> None:
    prepared, _ = data
    store = make_fne_store(tmp_path / "fne.zarr", prepared)
    seen = []
    original = fit._load_data

    def spy(settings, spec, dataset):
        train_set, val_set, config = original(settings, spec, dataset)
        seen.append((train_set.images.features.dtype, val_set.images.features.data_ptr(),
                     train_set.images.features.data_ptr()))
        return train_set, val_set, config

    monkeypatch.setattr(fit, "_load_data", spy)
    for family, extra in (("vse", ["--kind", "MH", *VSE_SMALL]), ("seam", SEAM_SMALL)):
        run = tmp_path / family
        assert train_cli([family, "--data", str(prepared), "--features", f"{store}:fne", *extra,
                          "--epochs", "1", "--out", str(run)]) == 0
        assert json.loads((run / "config.json").read_text())["feature_shape"] == [40]
    # the ternary array stays int8, one array shared by the splits (no per-split or float32 copy)
    assert [(dtype, a == b) for dtype, a, b in seen] == [(torch.int8, True), (torch.int8, True)]


def test_word_runs_are_evaluated_and_queried_like_the_others(data, tmp_path) -> None:
    from train.retrieval.loaded import embed_split, encode_texts
    from train.retrieval.open import load_run

    prepared, features = data
    run = tmp_path / "g"
    assert train_cli(["seam", "--data", str(prepared), "--features", features, "--variant", "G",
                      "--gru-units", "8", *SEAM_SMALL, "--epochs", "1", "--out", str(run)]) == 0
    loaded = load_run(run, "best", "cpu")
    assert loaded.settings.variant == "G" and loaded.settings.gru_units == 8
    emb = embed_split(loaded, "val")
    # new texts are tokenized as prep does (the fixture's tokens leave out the final '.')
    texts = [t.rstrip(".") for t in emb.texts[:3]]
    assert torch.allclose(encode_texts(loaded, texts), emb.captions[:3], atol=1e-6)
    assert not torch.allclose(encode_texts(loaded, emb.texts[:3]), emb.captions[:3], atol=1e-6)
    with pytest.raises(UserError, match="settings.hops was 2, now 3"):
        fit.run_training(train_settings(family="seam", out=str(run), data=str(prepared), features=features,
                                      variant="G", gru_units=8, hops=3, d=32, batch_size=8, seed=1,
                                      device="cpu"), resume=True)


@pytest.fixture(scope="module")
def coco_words(coco_sample, tmp_path_factory) -> tuple[Path, str]:
    """The real COCO sample prepared by ``prep coco --flat`` (600 / 100 / 101 images, real captions and
    words.json), with a synthetic 16-d feature store in its image order."""
    from prep.cli import main as prep_main

    root = tmp_path_factory.mktemp("coco_words")
    prepared = root / "data"
    assert prep_main(["coco", "--flat", str(coco_sample / "train.json"), str(coco_sample / "val.json"),
                      "--out", str(prepared), "-q"]) == 0
    return prepared, f"{make_store(root / 'feats.zarr', prepared)}:global"


def test_seam_and_vse_on_real_coco_captions_with_the_noise_analysis(coco_words, tmp_path) -> None:
    from train.cli import main as train_main

    prepared, features = coco_words
    words = PreparedDataset.load(prepared).words
    assert len(words) > 2000  # the real train-split vocabulary (2,562 words + <pad>, <unk>)
    for family, extra in (("seam", ["--variant", "E", *SEAM_SMALL, "--batch-size", "128"]),
                          ("vse", ["--kind", "SOE", *VSE_SMALL, "--batch-size", "128"])):
        run = tmp_path / family
        assert train_cli([family, "--data", str(prepared), "--features", features, *extra, "--epochs", "1",
                          "--out", str(run)]) == 0
        config = json.loads((run / "config.json").read_text())
        assert config["vocab_size"] == len(words) and config["data"]["train"]["images"] == 600
        captions = config["data"]["train"]["captions"] if family == "seam" else 600
        assert records(run)[0]["captions"] == captions
        # noisy captions are re-tokenized as prep tokenized the real ones: at 0 noise the analysis
        # reproduces the test evaluation exactly
        assert train_main(["evaluate", "--run", str(run), "--noise", "0.1:0.2:0.1", "--device", "cpu"]) == 0
        noise = json.loads((run / "eval" / "noise_test.json").read_text())
        test = json.loads((run / "eval" / "test.json").read_text())["protocols"]["all"]
        assert [r["ratio"] for r in noise["ratios"]] == pytest.approx([0.1, 0.2])
        for direction in ("i2t", "t2i"):
            assert noise["clean"][direction]["r1"] == pytest.approx(test[direction]["r1"])


def test_the_seam_and_vse_pipelines_resolve_to_their_papers_settings(monkeypatch) -> None:
    from pipelines.schema import load_pipelines

    monkeypatch.setenv("VSE_SHARED_DATA", "/nowhere")
    pipes = load_pipelines(Path(__file__).resolve().parents[1] / "pipelines.yaml")
    seam = with_family_defaults(pipes["coco-sample-seam"].train, "coco")
    assert (seam.family, seam.variant, seam.hops, seam.penalty, seam.lr_schedule, seam.lr_step) == \
        ("seam", "C", 5, 0.5, "step", 15)
    fne = with_family_defaults(pipes["coco-sample-vse-fne"].train, "coco")
    pooled = with_family_defaults(pipes["coco-sample-vse-pooled"].train, "coco")
    assert fne.features.endswith("efficientnet_lite0-fne-10crop.zarr:fne")
    assert pooled.features.endswith("efficientnet_lite0-10crop.zarr:global")
    # the two differ in their features (and run directory) only
    same = {k: v for k, v in fne.model_dump().items() if k not in ("features", "out")}
    assert same == {k: v for k, v in pooled.model_dump().items() if k not in ("features", "out")}
    assert (fne.kind, fne.measure, fne.loss, fne.captions_per_epoch, fne.absolute) == \
        ("SOE", "order", "sum", "one", True)
    f8k = with_family_defaults(pipes["f8k-fne-vse"].train, "f8k")
    assert (f8k.kind, f8k.d, f8k.word_dim, f8k.loss, f8k.measure, f8k.epochs) == \
        ("MH", 1024, 1024, "max", "cosine", 400)
    assert pipes["f8k-fne-vse"].train.features.endswith("vgg16-fne.zarr:fne")
    assert pipes["f8k-fc7-vse"].train.features.endswith("vgg16-10crop.zarr:global")
