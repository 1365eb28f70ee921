"""Opening a run must not execute code (issue 21) and a run killed while saving resumes (issue 22, item 1).

Tiny CHAIN-VSE runs on the tiny prepared dataset of ``test_data`` (one torch thread, about a second
each). The planted payload only creates a marker file in ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    ROOT,
    TINY,
    VSE_SMALL,
    assert_same_weights,
    copy_run,
    legacy_copy,
    metrics_without_timings,
    safety_inputs,
    train_cli,
    train_subprocess,
    train_tiny_chain,
)

from train.cli import main as train_main
from train.retrieval import fit
from train.retrieval.open import load_run
from train.run import checkpoint
from train.run.checkpoint import (
    FORMAT,
    check_plain,
    load_checkpoint,
    restore_rng_states,
    rng_states,
    save_checkpoint,
)
from vsecore.errors import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Payload:
    """What a hostile checkpoint carries: unpickling it runs a shell command (here: touch a marker)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch '{self.marker}'",)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, str]:
    return safety_inputs(tmp_path_factory.mktemp("tiny-safety"))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    return train_tiny_chain(data, tmp_path_factory.mktemp("trained") / "run")


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_checkpoints_hold_no_pickled_objects(trained: Path) -> None:
    for name in ("best.pt", "last.pt"):
        path = trained / "checkpoints" / name
        state = torch.load(path, weights_only=True)  # the safe loader reads the whole state
        assert state["format"] == FORMAT
        check_plain(state)
        assert isinstance(state["rng"]["numpy"]["keys"], torch.Tensor)


def test_rng_states_round_trip_exactly() -> None:
    random.seed(5)
    np.random.seed(7)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's legacy state
    random.gauss(0, 1)  # and one in Python's
    saved = rng_states()
    check_plain(saved)
    def draw() -> tuple:
        return (np.random.random(4).tolist(), random.random(), np.random.standard_normal(),
                random.gauss(0, 1), torch.rand(3))

    expected = draw()
    restore_rng_states(saved)
    got = draw()
    assert got[:4] == expected[:4] and torch.equal(got[4], expected[4])


def test_a_planted_pickle_is_refused_by_every_reader(data, trained, tmp_path, capsys) -> None:
    prepared, features = data
    marker = tmp_path / "payload-ran"
    run = copy_run(trained, tmp_path / "shared-run")
    for name in ("best.pt", "last.pt"):
        path = run / "checkpoints" / name
        state = torch.load(path, weights_only=True)
        state["note"] = Payload(marker)
        torch.save(state, path)
    # the payload is live: the unsafe loader every reader used before runs it
    torch.load(run / "checkpoints" / "best.pt", weights_only=False)
    assert marker.exists()
    marker.unlink()
    capsys.readouterr()

    readers = [
        ["evaluate", "--run", str(run), "--device", "cpu"],
        ["query", "--run", str(run), "--text", "a red thing", "--device", "cpu"],
        ["export-embeddings", "--run", str(run), "--out", str(tmp_path / "emb"), "--device", "cpu"],
        ["export-model", "--run", str(run), "--out", str(tmp_path / "model")],
        ["report", str(run)],
    ]
    for argv in readers:
        assert train_main(argv) == 2, argv
        err = one_line_error(capsys)
        assert "not a checkpoint this toolkit wrote" in err and "convert-checkpoints" in err, (argv, err)
    assert train_cli(["chain", "--out", str(run), "--resume"]) == 2
    assert "not a checkpoint this toolkit wrote" in one_line_error(capsys)
    for which in ("best", "last"):
        with pytest.raises(UserError, match="not a checkpoint this toolkit wrote") as info:
            load_run(run, which, "cpu")
        assert len(str(info.value).splitlines()) == 1
    assert not marker.exists()
    assert not (tmp_path / "emb").exists() and not (tmp_path / "model").exists()


def test_hostile_config_json_is_a_one_line_error(trained, tmp_path, capsys) -> None:
    run = copy_run(trained, tmp_path / "r")
    config = json.loads((run / "config.json").read_text())
    cases = {
        "binary": b"\x80\x04\x95\x00\xff\xfe garbage",
        "not an object": b"[1, 2, 3]",
        "bad setting": json.dumps({**config, "settings": {**config["settings"], "d": "huge"}}).encode(),
        "unknown family": json.dumps({**config, "settings": {**config["settings"], "family": "x"}}).encode(),
        "huge vocabulary": json.dumps({**config, "vocab_size": 10**12}).encode(),
        "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    }
    for what, content in cases.items():
        (run / "config.json").write_bytes(content)
        for argv in (["evaluate", "--run", str(run), "--device", "cpu"], ["report", str(run)]):
            assert train_main(argv) == 2, (what, argv)
            assert "config.json" in one_line_error(capsys), what
        with pytest.raises(UserError, match="config.json"):
            load_run(run, "best", "cpu")


def test_a_checkpoint_of_another_shape_names_the_parameter(trained, tmp_path) -> None:
    run = copy_run(trained, tmp_path / "r")
    path = run / "checkpoints" / "best.pt"
    state = load_checkpoint(path)
    name = next(k for k in state["model"] if k.endswith("weight") and state["model"][k].dim() == 2)
    state["model"][name] = torch.zeros(3, 3)
    save_checkpoint(path, state)
    with pytest.raises(UserError, match=f"'{name}' has shape \\(3, 3\\)"):
        load_run(run, "best", "cpu")


def test_a_checkpoint_needing_unknown_types_is_refused_at_save(tmp_path) -> None:
    with pytest.raises(TypeError, match=r"state\.extra.*needs pickle"):
        save_checkpoint(tmp_path / "x.pt", {"model": {}, "epoch": 0, "extra": Path("/")})
    assert not list(tmp_path.iterdir())


def test_old_checkpoints_convert_once_when_asked(trained, tmp_path, capsys) -> None:
    run = copy_run(trained, tmp_path / "old")
    originals = {}
    for name in ("best.pt", "last.pt"):
        path = run / "checkpoints" / name
        originals[name] = load_checkpoint(path)
        torch.save(legacy_copy(originals[name]), path)
    capsys.readouterr()
    assert train_main(["evaluate", "--run", str(run), "--device", "cpu"]) == 2
    assert "train convert-checkpoints --run" in one_line_error(capsys)

    assert train_main(["convert-checkpoints", "--run", str(run)]) == 0
    captured = capsys.readouterr()
    assert "unpickles" in captured.err + captured.out
    assert captured.out.count("converted to checkpoint format 2") == 2
    for name, original in originals.items():
        converted = load_checkpoint(run / "checkpoints" / name)
        assert converted["format"] == FORMAT
        draws = []
        for rng in (converted["rng"], original["rng"]):
            restore_rng_states(rng)
            draws.append((np.random.random(3).tolist(), random.random(), torch.rand(3).tolist()))
        assert draws[0] == draws[1]
        for key, tensor in original["model"].items():
            assert torch.equal(converted["model"][key], tensor)
    assert train_main(["evaluate", "--run", str(run), "--device", "cpu"]) == 0
    assert train_main(["convert-checkpoints", "--run", str(run)]) == 0
    assert capsys.readouterr().out.count("already format 2") == 2


def test_sigint_during_a_checkpoint_write_finishes_the_write(tmp_path, monkeypatch) -> None:
    real_save = torch.save

    def interrupted_save(obj, fh) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C arrives while the file is being written
        real_save(obj, fh)

    monkeypatch.setattr(checkpoint.torch, "save", interrupted_save)
    state = {"model": {"w": torch.arange(100_000, dtype=torch.float32)}, "epoch": 1}
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "last.pt", state)
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(tmp_path / "last.pt")["model"]["w"], state["model"]["w"])
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_run_killed_writing_its_first_last_checkpoint_resumes_from_best(data, tmp_path, monkeypatch,
                                                                          capsys) -> None:
    prepared, features = data
    common = ["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "3"]
    straight = tmp_path / "straight"
    assert train_cli([*common, "--out", str(straight)]) == 0

    killed = tmp_path / "killed"
    real_save = fit.Trainer.save

    def die_writing_last(self, name: str) -> None:
        if name == "last.pt":  # the process dies half-way: a torn temporary, no last.pt
            (self.checkpoint_dir / ".last.pt.k1ll3d.tmp").write_bytes(b"PK\x03\x04 torn")
            raise KeyboardInterrupt
        real_save(self, name)

    monkeypatch.setattr(fit.Trainer, "save", die_writing_last)
    assert train_cli([*common, "--out", str(killed)]) == 130
    monkeypatch.undo()
    assert {p.name for p in (killed / "checkpoints").iterdir()} == {"best.pt", ".last.pt.k1ll3d.tmp"}
    capsys.readouterr()

    assert train_cli(["chain", "--out", str(killed), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "from checkpoints/best.pt at the end of epoch 1" in out
    assert metrics_without_timings(killed) == metrics_without_timings(straight)
    assert_same_weights(killed / "checkpoints" / "last.pt", straight / "checkpoints" / "last.pt")
    assert_same_weights(killed / "checkpoints" / "best.pt", straight / "checkpoints" / "best.pt")
    assert not list((killed / "checkpoints").glob(".*.tmp"))


def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"model": {"w": torch.ones(2)}, "epoch": 1})

    def full(obj, fh) -> None:
        fh.write(b"PK partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(UserError, match="could not write the checkpoint.*unexpected pos"):
        save_checkpoint(path, {"model": {"w": torch.zeros(2)}, "epoch": 2})
    monkeypatch.undo()
    assert load_checkpoint(path)["epoch"] == 1 and [p.name for p in tmp_path.iterdir()] == ["last.pt"]


# -- a model made for sharing --------------------------------------------------------------------------
def test_export_model_gives_the_same_rankings_and_evaluation(trained, tmp_path, capsys) -> None:
    model = tmp_path / "model"
    assert train_main(["export-model", "--run", str(trained), "--out", str(model)]) == 0
    assert {p.name for p in model.iterdir()} == {"model.json", "weights.safetensors"}
    meta = json.loads((model / "model.json").read_text())
    assert meta["family"] == "chain" and meta["vocab_size"] == len(meta["vocabulary"]["symbols"])
    from vsecore.io import sha256_file

    assert meta["sha256"]["weights.safetensors"] == sha256_file(model / "weights.safetensors")
    capsys.readouterr()

    hits = {}
    for name, where in (("run", trained), ("model", model)):
        out = tmp_path / f"{name}.json"
        assert train_main(["query", "--run", str(where), "--text", "a red thing", "--text", "blue",
                           "--top", "5", "--device", "cpu", "--json", str(out)]) == 0
        hits[name] = json.loads(out.read_text())
    assert hits["model"] == hits["run"]
    shared = load_run(model, device="cpu")
    assert not hasattr(shared, "optimizer")
    ev = tmp_path / "ev"
    assert train_main(["evaluate", "--run", str(model), "--device", "cpu", "--out", str(ev)]) == 0
    evaluated = json.loads(next(ev.glob("*.json")).read_text())
    stored = json.loads((trained / "eval" / "test.json").read_text())
    assert evaluated["all"]["rsum"] == pytest.approx(stored["protocols"]["all"]["rsum"])
    capsys.readouterr()
    # evaluation and queries only
    assert train_cli(["chain", "--out", str(model), "--resume"]) == 2
    assert "not resumed" in one_line_error(capsys)
    assert train_main(["query", "--run", str(model), "--text", "x", "--checkpoint", "last"]) == 2
    assert "one set of weights" in one_line_error(capsys)


def test_a_tampered_model_folder_is_refused(trained, tmp_path, capsys) -> None:
    model = tmp_path / "model"
    assert train_main(["export-model", "--run", str(trained), "--out", str(model)]) == 0
    weights = model / "weights.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 0xFF
    weights.write_bytes(bytes(blob))
    capsys.readouterr()
    assert train_main(["query", "--run", str(model), "--text", "x", "--device", "cpu"]) == 2
    assert "SHA-256" in one_line_error(capsys)
    (model / "model.json").write_bytes(b"\xff\xfe\x00binary")
    assert train_main(["query", "--run", str(model), "--text", "x", "--device", "cpu"]) == 2
    assert "model.json" in one_line_error(capsys)


SIGTERM_DURING_SAVE = """
import os, signal, sys, torch
from train.run import checkpoint
real_save = torch.save
def terminated_save(obj, fh):
    os.kill(os.getpid(), signal.SIGTERM)  # `kill` arrives while the file is being written
    real_save(obj, fh)
checkpoint.torch.save = terminated_save
checkpoint.save_checkpoint(sys.argv[1], {"model": {"w": torch.arange(100000.0)}, "epoch": 1})
print("not reached: SIGTERM takes effect once the file is in place", flush=True)
"""


def test_sigterm_during_a_checkpoint_write_terminates_after_the_write(tmp_path) -> None:
    import subprocess
    import sys

    path = tmp_path / "last.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SIGTERM_DURING_SAVE, str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert "not reached" not in proc.stdout
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.arange(100000.0))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_ctrl_c_right_after_the_first_checkpoint_stops_cleanly_and_resumes_exactly(data, tmp_path) -> None:
    """SIGINT as soon as ``best.pt`` appears (usually while ``last.pt`` is being written): one line,
    exit 130, no torn file, and ``--resume`` ends where an uninterrupted run ends."""
    import time

    prepared, features = data
    common = ["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "3"]
    straight = tmp_path / "straight"
    assert train_cli([*common, "--out", str(straight)]) == 0
    stopped = tmp_path / "stopped"
    proc = train_subprocess([*common, "--out", str(stopped)])
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (stopped / "checkpoints" / "best.pt").exists():
                proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.001)
        stderr = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip() == "train: interrupted (a checkpoint of epoch 1 kept: re-run with --resume)", stderr
    assert not list((stopped / "checkpoints").glob(".*.tmp"))
    resumed = train_subprocess(["chain", "--out", str(stopped), "--resume"])
    stderr = resumed.communicate(timeout=300)[1]
    assert resumed.returncode == 0, stderr
    assert metrics_without_timings(stopped) == metrics_without_timings(straight)
    assert_same_weights(stopped / "checkpoints" / "last.pt", straight / "checkpoints" / "last.pt")


def test_killed_writing_last_pt_at_a_curriculum_switch_resumes_into_the_next_phase(data, tmp_path,
                                                                                 monkeypatch) -> None:
    """POE: the epoch that ends the sum phase (its epoch budget) is also the best, so best.pt is written
    just before the switch; killed while writing last.pt, the run resumes from best.pt into phase 2."""
    prepared, features = data
    script = [10.0, 12.0, 13.0, 14.0, 9.0, 8.0]
    monkeypatch.setattr(fit.Trainer, "validate", lambda self: (script[self.epoch], {}))
    common = ["vse", "--data", str(prepared), "--features", features, "--kind", "POE", *VSE_SMALL,
              "--epochs", "3", "--early-stop", "1"]
    straight = tmp_path / "straight"
    assert train_cli([*common, "--out", str(straight)]) == 0

    killed = tmp_path / "killed"
    real_save = fit.Trainer.save

    def die_writing_last_at_the_switch(self, name: str) -> None:
        if name == "last.pt" and self.epoch == 3:
            raise KeyboardInterrupt
        real_save(self, name)

    monkeypatch.setattr(fit.Trainer, "save", die_writing_last_at_the_switch)
    assert train_cli([*common, "--out", str(killed)]) == 130
    monkeypatch.setattr(fit.Trainer, "save", real_save)
    assert load_checkpoint(killed / "checkpoints" / "best.pt")["epoch"] == 3
    assert load_checkpoint(killed / "checkpoints" / "last.pt")["epoch"] == 2
    assert train_cli(["vse", "--out", str(killed), "--resume"]) == 0
    assert [r["phase"] for r in metrics_without_timings(killed)] == ["sum"] * 3 + ["max"] * 2
    assert metrics_without_timings(killed) == metrics_without_timings(straight)
    assert_same_weights(killed / "checkpoints" / "last.pt", straight / "checkpoints" / "last.pt")


def test_a_checkpoint_position_past_its_epoch_is_one_line(tiny_chain_run, tmp_path, capsys) -> None:
    """Issue 30.4: a checkpoint whose batch position lies past the epoch's batches (an edited file, or one
    written for other data) is refused in one line before any step, not resumed into an empty epoch."""
    run = copy_run(tiny_chain_run, tmp_path / "r")
    for name in ("best.pt", "last.pt"):
        path = run / "checkpoints" / name
        state = load_checkpoint(path)
        state["position"] = 10**6
        save_checkpoint(path, state)
    before = metrics_without_timings(run)
    capsys.readouterr()
    assert train_cli(["chain", "--out", str(run), "--resume", "--epochs", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "position (batch 1000000) is past the" in err, err
    assert metrics_without_timings(run) == before


# -- a run starts in one step (issue 41, item 9) ---------------------------------------------------------
def test_a_run_starts_with_its_marker_and_config_in_one_step(trained, tmp_path, monkeypatch) -> None:
    """Nothing is written into --out before the run starts; then its marker and config.json appear in one
    rename (of ``.NAME.start-PID``), over an absent or empty folder (whose permissions stay), or in place
    where the folder cannot be replaced (the working directory). ``--overwrite`` clears the old marker too;
    a start killed before its rename leaves its folder beside the run, removed by the next start unless it
    holds a file train did not write."""
    from train.run.layout import RunDir

    config = {"settings": {}, "task": "x"}
    for case in ("absent", "empty", "working directory", "overwrite"):
        out = tmp_path / case.replace(" ", "-")
        if case == "overwrite":
            copy_run(trained, out)
        elif case != "absent":
            out.mkdir(mode=0o750)
        run = RunDir(out)
        run.prepare(resume=False, overwrite=case == "overwrite")
        assert not out.exists() if case == "absent" else not any(out.iterdir()), case
        if case == "working directory":
            monkeypatch.chdir(out)
        run.write_config(config)
        monkeypatch.chdir(tmp_path)
        assert run.has_started() and json.loads(run.config.read_text()) == config, case
        assert sorted(p.name for p in out.iterdir()) == [".vse-run", "config.json"], case
        if case == "empty":
            assert out.stat().st_mode & 0o777 == 0o750
    assert sorted(p.name for p in tmp_path.iterdir()) == ["absent", "empty", "overwrite", "working-directory"]
    killed, kept = tmp_path / ".new.start-1", tmp_path / ".new.start-2"
    for folder in (killed, kept):
        folder.mkdir()
        (folder / ".vse-run").write_text("")
        (folder / ".config.json.host-1.x.tmp").write_text("{")
    (kept / "notes.txt").write_text("mine")
    RunDir(tmp_path / "new").prepare(resume=False, overwrite=False)
    assert not killed.exists() and (kept / "notes.txt").is_file()


def test_a_run_stopped_in_its_data_load_is_no_run(data, trained, tmp_path, monkeypatch, capsys) -> None:
    """Stopped while it loads its data (before, it had written its marker, and config.json only after the
    load: --resume then said "no run at R (no config.json)"), a new run leaves no folder and an --overwrite
    an empty one: ``--resume`` says there is no run and the same command starts it."""
    prepared, features = data
    common = ["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "1"]

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    new, old = tmp_path / "new", copy_run(trained, tmp_path / "old")
    for run, extra in ((new, []), (old, ["--overwrite"])):
        monkeypatch.setattr(fit, "_load_data", stopped)
        assert train_cli([*common, "--out", str(run), *extra]) == 130
        monkeypatch.undo()
        assert not run.exists() if run == new else list(run.iterdir()) == []
        capsys.readouterr()
        assert train_cli(["chain", "--out", str(run), "--resume"]) == 2
        assert one_line_error(capsys) == f"train: error: no run at {run} to resume; drop --resume to start " \
            "one"
        assert train_cli([*common, "--out", str(run)]) == 0
        assert (run / ".vse-run").is_file() and (run / "checkpoints" / "last.pt").is_file()
