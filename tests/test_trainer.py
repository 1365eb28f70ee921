"""The trainer, run directories and exact resume, on a tiny prepared dataset and feature store.

Models are tiny (CHAIN-VSE v1 at p=0.125, d=32) and torch runs one thread, so every run is
deterministic on CPU and takes about a second.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import (
    TINY,
    assert_same_weights,
    make_prepared,
    make_store,
    metrics_without_timings,
    safety_inputs,
    train_cli,
    train_subprocess,
)

from train.retrieval import fit
from train.retrieval.loaded import embed_split, encode_texts
from train.retrieval.open import load_run
from train.run.checkpoint import load_checkpoint
from vsecore.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


# one torch thread: bitwise-reproducible CPU kernels and no oversubscription of a shared machine
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, str]:
    return safety_inputs(tmp_path_factory.mktemp("tiny"))


def test_dry_run_prints_parameter_counts_without_data(capsys) -> None:
    assert train_cli(["oecc", "--arch", "B", "--dry-run"]) == 0
    out = capsys.readouterr().out
    counts = {}
    for line in out.splitlines()[1:]:
        *name, value = line.split()
        counts[" ".join(name)] = int(value.replace(",", ""))
    assert set(counts) == {"text encoder", "text projection", "image encoder", "total"}
    assert counts["image encoder"] == 4096 * 1024  # --image-dim default x d, no bias
    assert counts["total"] == counts["text encoder"] + counts["text projection"] + counts["image encoder"]
    assert "alphabet 72" in out


def test_dry_run_takes_sizes_from_data(data, capsys) -> None:
    prepared, features = data
    assert train_cli(["chain", "--data", str(prepared), "--features", features, "--dry-run", *TINY]) == 0
    out = capsys.readouterr().out
    assert "image features 16" in out
    assert re.search(r"image encoder\s+512\n", out)  # 16 x 32, no bias


def test_run_directory_layout_and_records(data, tmp_path, capsys) -> None:
    prepared, features = data
    run = tmp_path / "run"
    assert train_cli(["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "2",
                      "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "parameters: text encoder" in out and "skipped 1 images" in out and "Image-to-text" in out
    assert {p.name for p in (run / "checkpoints").iterdir()} == {"best.pt", "last.pt"}
    config = json.loads((run / "config.json").read_text())
    assert config["settings"]["family"] == "chain" and config["feature_shape"] == [16]
    assert config["vocab_size"] == len(json.loads((prepared / "chars.json").read_text())["symbols"])
    assert config["text_input"] == "chars"
    assert config["data"]["train"]["skipped_images"] == 1
    assert set(config["fingerprints"]) == {"dataset_json", "chars_json", "features", "features_layout"}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    for r in records:
        assert r["captions"] == config["data"]["train"]["captions"] and r["captions_per_s"] > 0
        assert r["lr"] == 1e-3 and r["loss"] > 0 and r["rsum"] == r["val"]["all"]["rsum"]
    test = json.loads((run / "eval" / "test.json").read_text())
    assert test["images"] == 8 and test["protocols"]["all"]["rsum"] > 0
    # the best checkpoint holds the epoch with the best validation rsum
    best_epoch = max(records, key=lambda r: (r["rsum"], -r["epoch"]))["epoch"]
    assert load_checkpoint(run / "checkpoints" / "best.pt")["epoch"] == best_epoch

    loaded = load_run(run, "best", "cpu")
    emb = embed_split(loaded, "val")
    assert emb.images.shape == (8, 32) and emb.captions.shape == (len(emb.texts), 32)
    assert torch.allclose(encode_texts(loaded, emb.texts[:3]), emb.captions[:3], atol=1e-6)
    noisy = embed_split(loaded, "val", texts=[t.upper() + "!" for t in emb.texts])
    assert torch.equal(noisy.images, emb.images) and not torch.equal(noisy.captions, emb.captions)

    # an existing run is never silently overwritten, and resuming checks the settings
    with pytest.raises(UserError, match="--resume.*--overwrite"):
        fit.run_training(loaded.settings)
    assert train_cli(["chain", "--out", str(run), "--resume", "--margin", "0.2"]) == 2
    assert "settings.margin was 0.05, now 0.2" in capsys.readouterr().err
    assert train_cli(["oecc", "--out", str(run), "--resume"]) == 2


def test_kill_mid_epoch_then_resume_equals_uninterrupted_run(data, tmp_path) -> None:
    prepared, features = data
    common = ["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "3",
              "--checkpoint-every", "5"]
    straight = tmp_path / "straight"
    assert train_cli([*common, "--out", str(straight)]) == 0

    killed = tmp_path / "killed"
    proc = train_subprocess([*common, "--out", str(killed)])
    last = killed / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 120
    state = None
    try:
        # wait for a mid-epoch checkpoint of the second epoch, so the resumed run also needs the
        # history, best rsum and scheduler of the first
        while time.monotonic() < deadline and proc.poll() is None:
            if last.exists():
                state = torch.load(last, weights_only=False)
                if state["epoch"] == 1 and state["position"] > 0:
                    proc.send_signal(signal.SIGKILL)
                    break
            time.sleep(0.01)
    finally:
        proc.kill()
        stderr = proc.communicate()[1]
    assert proc.returncode == -signal.SIGKILL, stderr
    state = load_checkpoint(last)
    assert state["epoch"] == 1 and state["position"] > 0 and not state["finished"]
    assert len(metrics_without_timings(killed)) == 1

    resumed = train_subprocess(["chain", "--out", str(killed), "--resume"])
    stderr = resumed.communicate(timeout=300)[1]
    assert resumed.returncode == 0, stderr
    assert metrics_without_timings(killed) == metrics_without_timings(straight)
    assert_same_weights(killed / "checkpoints" / "last.pt", straight / "checkpoints" / "last.pt")
    assert_same_weights(killed / "checkpoints" / "best.pt", straight / "checkpoints" / "best.pt")
    assert json.loads((killed / "eval" / "test.json").read_text())["protocols"] == \
        json.loads((straight / "eval" / "test.json").read_text())["protocols"]


def test_learning_rate_decay_and_early_stopping(data, tmp_path, monkeypatch) -> None:
    prepared, features = data
    scripted = iter([100.0, 120.0, 110.0, 119.0, 118.0, 117.0, 200.0])
    monkeypatch.setattr(fit.Trainer, "validate", lambda self: (next(scripted), {}))
    monkeypatch.setattr(fit, "evaluate_after_training", lambda *a, **k: None)
    run = tmp_path / "plateau"
    assert train_cli(["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "7",
                      "--lr-decay-patience", "2", "--early-stop", "3", "--batch-size", "64",
                      "--out", str(run)]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # best at epoch 2; 2 epochs (3, 4) without improvement -> lr / 10 from epoch 5 (the help's
    # "after this many epochs"); 3 without improvement -> stop after epoch 5
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["lr"] for r in records] == pytest.approx([1e-3, 1e-3, 1e-3, 1e-3, 1e-4])
    assert [r["best_rsum"] for r in records] == [100.0, 120.0, 120.0, 120.0, 120.0]
    assert load_checkpoint(run / "checkpoints" / "best.pt")["epoch"] == 2
    assert load_checkpoint(run / "checkpoints" / "last.pt")["finished"]


@pytest.mark.parametrize("option", [["--lr", "-1"], ["--batch-size", "0"], ["--p", "0"], ["--d", "0"],
                                    ["--epochs", "0"], ["--epochs", "-3"], ["--lr-decay-patience", "0"]])
def test_impossible_options_are_one_line_errors(data, tmp_path, capsys, option) -> None:
    prepared, features = data
    code = train_cli(["chain", "--data", str(prepared), "--features", features, "--out", str(tmp_path / "r"),
                      *option])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"train: error: {option[0]} {option[1]}") and "must be" in err
    assert not (tmp_path / "r").exists()


def test_a_second_trainer_on_one_run_directory_is_refused(data, tmp_path, capsys) -> None:
    prepared, features = data
    run = tmp_path / "locked"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom vsecore.io import exclusive_lock\n"
         f"with exclusive_lock({str(run)!r}):\n    print('held', flush=True)\n    time.sleep(60)\n"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code = train_cli(["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "1",
                          "--out", str(run)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and f"pid {holder.pid}" in err and len(err.splitlines()) == 1
    finally:
        holder.kill()
        holder.wait()
    # the killed holder's lock is stale: the run now starts
    assert train_cli(["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "1",
                      "--out", str(run)]) == 0


def test_curves_png_and_train_report(data, tmp_path, capsys) -> None:
    prepared, features = data
    runs = []
    for name, d in (("small", "16"), ("large", "48")):
        run = tmp_path / name
        args = [a if a != "32" else d for a in TINY]
        assert train_cli(["chain", "--data", str(prepared), "--features", features, *args, "--epochs", "2",
                          "--out", str(run)]) == 0
        png = run / "curves.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        runs.append(run)
    capsys.readouterr()
    from train.cli import main as train_main

    plot = tmp_path / "report.png"
    report = ["report", *map(str, runs), "--plot", str(plot), "--json", str(tmp_path / "r.json")]
    assert train_main(report) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [r["name"] for r in rows] == ["small", "large"] and rows[0]["parameters"] < rows[1]["parameters"]
    test = json.loads((runs[0] / "eval" / "test.json").read_text())["protocols"]["all"]
    assert rows[0]["test"]["rsum"] == pytest.approx(test["rsum"]) and rows[0]["epochs"] == 2
    assert "small" in out and f"{test['rsum']:.1f}" in out
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_a_store_made_for_other_images_is_refused(tmp_path, capsys) -> None:
    from features.store.core import FeatureStore
    from prep.dataset import PreparedDataset

    mine = make_prepared(tmp_path / "mine", n_train=20)
    store_path = make_store(tmp_path / "feats.zarr", mine)
    store = FeatureStore(store_path, mode="r+")
    store.set_attrs(config={"images_sha256": PreparedDataset.load(mine).images_fingerprint()},
                    provenance={"dataset": str(mine)})
    other = make_prepared(tmp_path / "other", n_train=20)  # same size and captions, one other image
    data = json.loads((other / "dataset.json").read_text())
    data["images"][0]["filename"] = "elsewhere.jpg"
    (other / "dataset.json").write_text(json.dumps(data))
    args = ["chain", "--features", f"{store_path}:global", *TINY, "--epochs", "1"]
    assert train_cli([*args, "--data", str(other), "--out", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(mine) in err and str(other) in err
    assert train_cli([*args, "--data", str(mine), "--out", str(tmp_path / "r2")]) == 0


def test_logs_without_a_terminal_quiet_and_the_run_log(data, tmp_path, capsys, monkeypatch) -> None:
    prepared, features = data
    monkeypatch.setenv("VSE_PROGRESS_SECONDS", "0")  # a progress line after every batch
    run = tmp_path / "logged"
    args = ["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "2"]
    assert train_cli([*args, "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "\r" not in out
    progress = [line for line in out.splitlines() if line.startswith("epoch 1/2: ")]
    assert progress and re.search(r"epoch 1/2: \d+/\d+ batch \(\d+%\), [\d.]+ batch/s, elapsed", progress[0])
    assert "epoch 2: loss" in out and "test split, best checkpoint" in out
    log = (run / "train.log").read_text()
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d epoch 1: loss", log, re.M)
    assert "test split, best checkpoint" in log
    # --quiet: the result (the test table) and nothing else; the run log still has everything. The result
    # names the best epoch, whichever it is on this CPU's kernels (read from metrics.jsonl), so look for the
    # progress and epoch lines themselves, not for the words "epoch 1"
    quiet = tmp_path / "quiet"
    assert train_cli([*args, "--out", str(quiet), "--quiet"]) == 0
    out = capsys.readouterr().out
    records = [json.loads(line) for line in (quiet / "metrics.jsonl").read_text().splitlines()]
    best = max(records, key=lambda r: (r["rsum"], -r["epoch"]))["epoch"]
    assert f"test split, best checkpoint (epoch {best})" in out
    assert not re.search(r"^epoch \d", out, re.M) and "loss" not in out and "parameters:" not in out
    assert "epoch 1: loss" in (quiet / "train.log").read_text()


def test_tensorboard_scalars_when_tensorboard_is_installed(data, tmp_path, monkeypatch) -> None:
    import types

    written: list[tuple[str, float, int]] = []

    class Writer:
        def __init__(self, logdir: str, purge_step: int) -> None:
            self.logdir = logdir
            written.append(("open", purge_step, 0))

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            written.append((tag, value, step))

        def flush(self) -> None:
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer))
    prepared, features = data
    run = tmp_path / "tb"
    assert train_cli(["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "2",
                      "--out", str(run)]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert ("val/rsum", records[1]["rsum"], 2) in written and ("train/loss", records[0]["loss"], 1) in written
    tags = {"open", "train/loss", "val/rsum", "train/lr", "train/captions_per_s"}
    assert {tag for tag, _, _ in written} == tags


def test_export_embeddings_reproduce_the_test_evaluation(data, tmp_path, capsys) -> None:
    import numpy as np

    from train.cli import main as train_main
    from train.retrieval.evaluate import evaluate_protocols

    prepared, features = data
    run = tmp_path / "exp"
    assert train_cli(["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "1",
                      "--out", str(run)]) == 0
    out = tmp_path / "emb"
    assert train_main(["export-embeddings", "--run", str(run), "--out", str(out), "--device", "cpu"]) == 0
    img, cap = np.load(out / "test_img.npy"), np.load(out / "test_cap.npy")
    caption_image = np.load(out / "test_caption_image.npy")
    ids = json.loads((out / "test_ids.json").read_text())
    assert img.shape[0] == len(ids["images"]) and cap.shape[0] == len(ids["captions"]) == len(caption_image)
    assert (np.diff(caption_image) >= 0).all()  # captions grouped by image, in image order
    assert len(set(np.bincount(caption_image).tolist())) > 1  # a ragged split: 2 or 3 captions per image
    metrics = evaluate_protocols(img, cap, caption_image, "order")["all"].metrics.to_dict()
    stored = json.loads((run / "eval" / "test.json").read_text())["protocols"]["all"]
    for direction in ("i2t", "t2i"):
        for key in ("r1", "r5", "r10", "medr", "meanr"):
            assert metrics[direction][key] == pytest.approx(stored[direction][key]), (direction, key)

    # the command line reads the export back: the caption-image file beside --cap-emb is found by itself,
    # or named (the run's own embeddings and evaluator: the stored numbers exactly)
    from train.engine.similarity import similarity

    sources = {"found": ["--img-emb", str(out / "test_img.npy"), "--cap-emb", str(out / "test_cap.npy"),
                         "--measure", "order"],
               "named": ["--img-emb", str(out / "test_img.npy"), "--cap-emb", str(out / "test_cap.npy"),
                         "--measure", "order", "--caption-image", str(out / "test_caption_image.npy")]}
    capsys.readouterr()

    def evaluated(name: str, source: list[str]) -> dict:
        assert train_main(["evaluate", *source, "--protocol", "all", "--device", "cpu", "--json",
                           str(tmp_path / f"{name}.json")]) == 0, name
        got = json.loads((tmp_path / f"{name}.json").read_text())
        return got.get("protocols", got)["all"]

    for name, source in sources.items():
        got = evaluated(name, source)
        for direction in ("i2t", "t2i"):
            assert got[direction] == stored[direction], (name, direction)
        assert got["rsum"] == stored["rsum"]
    assert "test_caption_image.npy (the image row of each caption, found beside" in capsys.readouterr().out

    # a similarity matrix of the same scores gives the same numbers as the embeddings. The matrix below comes
    # from another order-violation kernel than the evaluator's (eager vs fused: another float32 summation
    # order over d), so on trained embeddings two near-tied candidates may swap places on some CPU kernels.
    # Embeddings rounded to multiples of 2**-8 within [-1, 1] make every sum exact (each squared violation
    # is a multiple of 2**-16 below 4, a sum of 32 below 128 = 2**23 * 2**-16 < 2**24 ulps): every kernel
    # then computes the very same scores, ties included, on every CPU
    assert img.shape[1] == 32 and max(np.abs(img).max(), np.abs(cap).max()) <= 1
    q_img, q_cap = (np.round(a * 256).astype(np.float32) / 256 for a in (img, cap))
    np.save(tmp_path / "q_img.npy", q_img)
    np.save(tmp_path / "q_cap.npy", q_cap)
    sims = similarity(torch.from_numpy(q_img), torch.from_numpy(q_cap), "order").numpy()
    np.save(tmp_path / "sims.npy", sims)
    sources["sims"] = ["--sims", str(tmp_path / "sims.npy"), "--caption-image",
                       str(out / "test_caption_image.npy")]
    from_embeddings = evaluated("q", ["--img-emb", str(tmp_path / "q_img.npy"), "--cap-emb",
                                      str(tmp_path / "q_cap.npy"), "--measure", "order", "--caption-image",
                                      str(out / "test_caption_image.npy")])
    assert evaluated("sims", sources["sims"]) == from_embeddings

    # a caption-image file that does not fit: one line each
    bad = {"short.npy": caption_image[:-1], "range.npy": np.where(np.arange(len(caption_image)) == 0,
                                                                  len(img), caption_image),
           "gap.npy": np.where(caption_image == 0, 1, caption_image), "float.npy": caption_image * 1.0,
           "unsorted.npy": caption_image[::-1].copy()}
    expected = {"short.npy": "entries for", "range.npy": "outside 0..",
                "gap.npy": "without any caption cannot be ranked: 0", "float.npy": "1-D integer array",
                "unsorted.npy": "grouped by image"}
    for name, array in bad.items():
        np.save(tmp_path / name, array)
        source = (sources["sims"][:2] if name == "unsorted.npy" else sources["found"]) + [
            "--caption-image", str(tmp_path / name)]
        assert train_main(["evaluate", *source, "--device", "cpu"]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and expected[name] in err, (name, err)
    assert train_main(["evaluate", *sources["named"], "--captions-per-image", "2"]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.parametrize("checkpoint_every", [1, 1000])
def test_a_loss_that_is_not_finite_stops_the_run_at_its_step_and_no_checkpoint_keeps_it(
        data, tmp_path, capsys, monkeypatch, checkpoint_every) -> None:
    """The trainer reads each step's loss one step later (so the device is not waited on); a NaN loss is still
    named at its own step, and is found before any checkpoint could be written after it."""
    prepared, features = data
    real_step = fit.Trainer._step

    def step(self, batch):
        loss = real_step(self, batch)
        return torch.full_like(loss, float("nan")) if self.global_step + 1 == 3 else loss

    monkeypatch.setattr(fit.Trainer, "_step", step)
    run = tmp_path / "nan"
    code = train_cli(["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "1",
                      "--checkpoint-every", str(checkpoint_every), "--out", str(run)])
    err = capsys.readouterr().err
    assert code != 0 and "the loss is nan at epoch 1, step 3;" in err
    last = run / "checkpoints" / "last.pt"
    if checkpoint_every == 1:
        state = load_checkpoint(last)
        assert state["global_step"] == 2 and state["running"]["batches"] == 2
        assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    else:
        assert not last.exists()


def test_validation_says_the_tie_warning_once_per_run(capsys) -> None:
    """Issue 43.6: a run validating every epoch warns of tied ground truths at its first validation only;
    its other warnings, and a new run (a new scorer), are not silenced."""
    from types import SimpleNamespace

    from train.retrieval.validation import retrieval_scorer

    settings = SimpleNamespace(measure="cosine", order_sqrt=False, val_protocol="all")
    generator = torch.Generator().manual_seed(0)
    images = torch.nn.functional.normalize(torch.rand(4, 3, generator=generator), dim=1)
    caption_image = torch.arange(8) // 2
    captions = images[caption_image // 2 * 2]  # images 0 and 1 (2 and 3) have the same captions: tied
    for _run in range(2):
        score = retrieval_scorer(settings)  # type: ignore[arg-type]
        for _epoch in range(3):
            _, metrics = score(images, captions, caption_image)
            assert metrics["all"]["i2t"]["ties"] > 0  # every epoch still counts its ties
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("warning: the ground-truth score is tied"), lines
