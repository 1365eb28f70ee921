"""``train compare`` under faults (issue 29, items 6 and 7): it reports only what it computed from the
checkpoint it reports, and its Ctrl-C message says what resumes it (it has no ``--resume``).

The tiny comparison of ``test_compare`` (its fixture, imported), one entry; faults are injected by
patching the trainer at a named moment (the end of an epoch).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train.cli import main as train_main
from train.engine.trainer import Trainer
from train.run.checkpoint import load_checkpoint, save_checkpoint
from vsecore.io import sha256_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: what a hand-made noise analysis says (a number no 8-image test split gives)
FORGED = 77.7


def compare(inputs: dict[str, str], out: Path, *extra: str) -> int:
    return train_main(["compare", "--data", inputs["data"], "--features", inputs["features"],
                       "--pipelines", inputs["pipelines"], "--families", "tiny-chain", "--epochs", "2",
                       "--noise", "0.1,0.25", "--out", str(out), "--device", "cpu", "-q", *extra])


def forged_noise() -> dict:
    metrics = {"r1": FORGED, "r5": FORGED, "r10": FORGED}
    return {"clean": {"i2t": metrics, "t2i": metrics},
            "ratios": [{"ratio": r, "i2t": metrics, "t2i": metrics} for r in (0.1, 0.25)]}


def test_compare_reports_only_what_it_computed_from_the_checkpoint(request, tmp_path, monkeypatch) -> None:
    inputs = request.getfixturevalue("compare_inputs")
    original = Trainer._end_epoch

    def evaluated_by_hand_after_epoch_1(self: Trainer) -> None:
        original(self)
        if self.epoch == 1:  # `train evaluate --run RUN --noise ...` run by hand while the run trains
            eval_dir = self.run_dir / "eval"
            eval_dir.mkdir(exist_ok=True)
            (eval_dir / "noise_test.json").write_text(json.dumps(forged_noise()))
            (eval_dir / "test_best.json").write_text(json.dumps({"all": forged_noise()["clean"]}))

    monkeypatch.setattr(Trainer, "_end_epoch", evaluated_by_hand_after_epoch_1)
    out = tmp_path / "cmp"
    assert compare(inputs, out) == 0
    monkeypatch.undo()
    run = out / "runs" / "tiny-chain-seed0"
    row = json.loads((out / "compare.json").read_text())["runs"][0]
    assert row["noise"]["clean"]["i2t"]["r1"] != FORGED and row["i2t_r1"] != FORGED  # not the hand-made files
    own = json.loads((run / "eval" / "compare_test.json").read_text())
    assert own["checkpoint"]["sha256"] == sha256_file(run / "checkpoints" / "best.pt")
    assert own["checkpoint"]["epoch"] == load_checkpoint(run / "checkpoints" / "best.pt")["epoch"]
    assert row["noise"] == own["noise"] and row["noise"]["clean"]["i2t"]["r1"] != FORGED
    assert row["i2t_r1"] == own["protocols"]["all"]["i2t"]["r1"] != FORGED
    # the files train evaluate writes are compare's now, not the hand-made ones
    assert json.loads((run / "eval" / "noise_test.json").read_text()) == own["noise"]

    # another best.pt (here: its weights changed) is evaluated again; the same one is not
    state = load_checkpoint(run / "checkpoints" / "best.pt")
    state["model"] = {k: v + 0.01 if v.is_floating_point() else v for k, v in state["model"].items()}
    save_checkpoint(run / "checkpoints" / "best.pt", state)
    (run / "eval" / "noise_test.json").write_text(json.dumps(forged_noise()))
    assert train_main(["compare", "--runs", str(run), "--noise", "0.1,0.25", "--device", "cpu", "-q",
                       "--out", str(tmp_path / "again")]) == 0
    again = json.loads((run / "eval" / "compare_test.json").read_text())
    assert again["checkpoint"]["sha256"] == sha256_file(run / "checkpoints" / "best.pt") != \
        own["checkpoint"]["sha256"]
    reported = json.loads((tmp_path / "again" / "compare.json").read_text())["runs"][0]
    assert reported["noise"] == again["noise"] and reported["noise"]["clean"]["i2t"]["r1"] != FORGED
    before = (run / "eval" / "compare_test.json").stat().st_mtime_ns
    assert train_main(["compare", "--runs", str(run), "--noise", "0.1,0.25", "--device", "cpu", "-q"]) == 0
    assert (run / "eval" / "compare_test.json").stat().st_mtime_ns == before  # kept: same checkpoint


@pytest.mark.parametrize("moment", ["training", "evaluating"])
def test_ctrl_c_in_a_comparison_says_what_resumes_it(request, tmp_path, monkeypatch, capsys, moment) -> None:
    inputs = request.getfixturevalue("compare_inputs")
    from train.retrieval import compare as compare_module

    original, real_evaluate = Trainer._end_epoch, compare_module.evaluate_run

    def interrupted_after_epoch_1(self: Trainer) -> None:
        original(self)
        if self.epoch == 1:
            raise KeyboardInterrupt

    def interrupted_evaluation(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    if moment == "training":
        monkeypatch.setattr(Trainer, "_end_epoch", interrupted_after_epoch_1)
    else:
        monkeypatch.setattr(compare_module, "evaluate_run", interrupted_evaluation)
    out = tmp_path / "cmp"
    capsys.readouterr()
    assert compare(inputs, out) == 130
    err = capsys.readouterr().err.strip()
    kept = "epoch 1 kept" if moment == "training" else "the runs are kept"
    assert err == (f"train: interrupted ({kept}: re-run the same command (train compare, or train pipeline) "
                   "to resume it)")
    monkeypatch.setattr(Trainer, "_end_epoch", original)
    monkeypatch.setattr(compare_module, "evaluate_run", real_evaluate)
    assert compare(inputs, out) == 0  # what the message says resumes it
