"""bench/gpu_check.py runs every stage in its CPU dry mode (so the script is ready when a GPU is lent), and
ends in one line on the first error, after the JSON of the stages before it, with no fall-back to the CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_dry_mode_runs_every_stage(tmp_path) -> None:
    out = tmp_path / "check.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--dry", "--json", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["error"] is None and result["machine"]["device"] == "cpu"
    for kind in ("global", "fne"):
        for precision in ("float32", "amp"):
            assert result["extraction"][f"{kind}_{precision}"]["images_per_s"] > 0
            assert result["extraction"][f"{kind}_{precision}"]["prepared_images_per_s"] > 0
            # on the CPU the "device" is the CPU: its rows are the reference's, bit for bit
            assert result["extraction"][f"{kind}_{precision}"]["rel_diff_vs_cpu"] == 0
        assert result["extraction"][f"{kind}_cpu"]["images_per_s"] > 0
    assert result["extraction"]["crops_equal_cpu"] is True
    jpeg = result["extraction"]["jpeg"]  # features cnn from JPEG files, host and device decoding
    for decoder in ("pil", "torchvision"):
        for precision in ("float32", "bf16"):
            run = jpeg[f"{decoder}_{precision}"]
            assert run["images_per_s"] > 0 and run["failed"] == 0 and run["rel_diff_vs_cpu"] == 0
    assert jpeg["decoder_rel_diff_float32"] > 0  # libjpeg-turbo through torchvision and resized by torch
    assert jpeg["targets_images_per_s"] == {"bf16": 1000, "float32": 500}
    assert "cudnn_allow_tf32" in jpeg["tf32"]
    for family in ("chain", "oecc", "seam", "vse", "clmr", "liwe"):
        steps = result[f"steps.{family}"]
        assert steps["float32"]["step_ms"] > 0 and steps["bf16"]["captions_per_s"] > 0
        assert steps["cpu"]["step_ms"] > 0 and steps["first_loss"]["cpu"] > 0
        assert steps["float32"]["loss_rel_diff_vs_cpu"] == 0
    for measure in ("order", "cosine"):
        evaluation = result["evaluation"][measure]
        assert evaluation["second_s"] >= 0 and result["evaluation"][f"{measure}_cpu"]["first_s"] >= 0
        assert evaluation["ranks_differ_vs_cpu"] == 0 and evaluation["max_recall_diff_vs_cpu"] == 0
        assert evaluation["max_rank_change_vs_cpu"] == 0 and len(evaluation["tied_queries_device_cpu"]) == 2
        assert evaluation["rsum"]["all"] > 300  # captions near their images: ranks that mean something
    loader = result["loader"]
    for key in ("workers_0", "workers_1", "clmr_step_fed_workers_0", "clmr_step_fed_workers_1"):
        assert loader[key]["captions_per_s"] > 0 and loader[key]["first_batch_s"] > 0
    training = result["training"]  # issue 44: each way of stepping against the eager step
    for family in ("chain", "oecc", "seam", "vse", "clmr", "liwe"):
        ways = training[family]
        assert ways["eager_8"]["captions_per_s"] > 0 and ways["eager_8"]["first_loss_rel_diff_vs_cpu"] == 0
        assert ways["eager_16"]["captions_per_s"] > 0  # the larger batch
        assert ways["eager_foreach_8"]["loss_rel_diff_vs_eager"] == 0  # on the CPU both are the same Adam
        assert ways["graphs_8"]["refused"].startswith("CUDA graphs need a CUDA device")
        assert training["targets"][family]["target_x"] == (1.5 if family in ("vse", "clmr", "liwe") else 3.0)
    assert training["checkpoint"]["background_s"] > 0 and training["checkpoint"]["bytes"] > 0
    assert training["targets"]["fed_clmr"]["target"] == 0.9
    assert "all stages passed" in done.stdout


def test_stages_runs_only_those_named(tmp_path, monkeypatch) -> None:
    check = load_script()
    ran: list[str] = []
    for name in ("extraction", "evaluation", "loader"):
        monkeypatch.setattr(check, name, lambda c, record, n=name: ran.append(n))
    monkeypatch.setattr(check, "family_steps", lambda c, family, record: ran.append(family))
    out = tmp_path / "check.json"
    argv = ["--device", "cpu", "--dry", "--stages", "steps", "loader", "--families", "vse",
            "--json", str(out)]
    assert check.main(argv) == 0
    assert ran == ["vse", "loader"]
    assert set(json.loads(out.read_text())) == {"machine", "sizes", "error", "steps.vse", "loader", "wall_s"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_no_cuda_is_one_line_and_no_cpu_fallback(tmp_path, capsys) -> None:
    assert load_script().main(["--json", str(tmp_path / "c.json")]) == 1
    assert not (tmp_path / "c.json").exists()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: error: device:"), lines


def test_full_sizes_on_the_cpu_are_refused(tmp_path, capsys) -> None:
    assert load_script().main(["--device", "cpu", "--json", str(tmp_path / "c.json")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "gpu_check: error: a full check runs on a GPU (--device cuda); use --dry for the CPU"


def test_the_first_error_ends_the_check_in_one_line_after_the_json(tmp_path, monkeypatch, capsys) -> None:
    check = load_script()
    monkeypatch.setattr(check, "extraction", lambda c, record: record.update(stub=True))

    def fail(c, record) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCompile with "
                           "TORCH_USE_CUDA_DSA to enable device-side assertions.")

    monkeypatch.setattr(check, "evaluation", fail)
    out = tmp_path / "check.json"
    argv = ["--device", "cpu", "--dry", "--families", "seam", "--json", str(out)]
    assert check.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpu_check: error: evaluation: RuntimeError: CUDA error: an illegal memory access was "
                   "encountered"]
    result = json.loads(out.read_text())
    assert result["error"] == err[0].removeprefix("gpu_check: error: ")
    assert result["extraction"]["stub"] and result["steps.seam"]["float32"]["step_ms"] > 0
    assert "loader" not in result


def test_keep_going_runs_every_stage_and_names_each_error(tmp_path, monkeypatch, capsys) -> None:
    check = load_script()
    monkeypatch.setattr(check, "extraction", lambda c, record: record.update(stub=True))

    def fail(c, record) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore text")

    monkeypatch.setattr(check, "evaluation", fail)
    monkeypatch.setattr(check, "family_steps", lambda c, family, record: fail(c, record))
    out = tmp_path / "check.json"
    argv = ["--device", "cpu", "--dry", "--families", "seam", "vse", "--keep-going", "--json", str(out)]
    assert check.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    errors = [f"{stage}: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
              for stage in ("steps.seam", "steps.vse", "evaluation")]
    assert err == [f"gpu_check: error: {e}" for e in errors] + [
        f"gpu_check: 3 stage(s) failed; numbers in {out}"]
    result = json.loads(out.read_text())
    assert result["errors"] == errors and result["error"] == errors[0]
    assert result["extraction"]["stub"] and result["loader"]["workers_1"]["captions_per_s"] > 0


def test_relative_difference() -> None:
    check = load_script()
    assert check.relative_difference(torch.ones(4), torch.ones(4)) == 0
    assert check.relative_difference(torch.tensor([3.0, 4.0]), torch.tensor([0.0, 4.0])) == 0.75
    assert check.relative_difference(torch.zeros(2), torch.zeros(2)) == 0
    assert check.relative_difference(torch.ones(2), torch.zeros(2)) == float("inf")
    assert check.relative_difference(torch.tensor([float("nan")]), torch.ones(1)) == float("inf")


def _no_work(monkeypatch) -> object:
    """The script with every stage, and the device's resolution, failing the test if it runs."""
    check = load_script()

    def work(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    for name in ("extraction", "family_steps", "evaluation", "loader", "resolve_device"):
        monkeypatch.setattr(check, name, work)
    return check


@pytest.mark.parametrize("argv, message", [
    (["--steps", "-1"], "--steps -1: must be 1 to 1,000,000"),
    (["--steps", "0"], "--steps 0: must be 1 to 1,000,000"),
    (["--cpu-steps", "-2"], "--cpu-steps -2: must be 0 to 1,000,000"),
    (["--images", "0"], "--images 0: must be 1 to 2,000"),
    (["--images", "100000"], "--images 100000: must be 1 to 2,000"),
])
def test_a_count_out_of_range_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, argv,
                                                          message) -> None:
    """Issue 41.8: ``--steps -1`` reported "all stages passed" with captions_per_s -1471129."""
    out = tmp_path / "check.json"
    assert _no_work(monkeypatch).main(["--device", "cpu", "--dry", "--json", str(out), *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [f"gpu_check: error: {message}"] and captured.out == ""
    assert not out.exists()


def test_an_existing_json_is_replaced_only_with_overwrite(tmp_path, monkeypatch, capsys) -> None:
    """Issue 41.8: ``--json`` naming a file of the user's overwrote it silently; the rule of the other
    commands (vsecore.outputs.check_output_file): an existing file only with --overwrite, checked before any
    work."""
    out = tmp_path / "notes.json"
    out.write_text("my own notes\n", encoding="utf-8")
    assert _no_work(monkeypatch).main(["--device", "cpu", "--dry", "--json", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gpu_check: error: --json {out}: exists; add --overwrite to replace it"]
    assert out.read_text(encoding="utf-8") == "my own notes\n"
    check = load_script()
    for name in ("extraction", "evaluation", "loader"):
        monkeypatch.setattr(check, name, lambda c, record: record.update(stub=True))
    monkeypatch.setattr(check, "family_steps", lambda c, family, record: record.update(stub=True))
    argv = ["--device", "cpu", "--dry", "--families", "vse", "--json", str(out), "--overwrite"]
    assert check.main(argv) == 0
    assert json.loads(out.read_text(encoding="utf-8"))["loader"]["stub"] is True
    assert [p.name for p in tmp_path.iterdir()] == ["notes.json"]  # written whole, no temporary left


def test_a_json_in_a_missing_folder_or_at_a_folder_is_one_line_before_any_work(tmp_path, monkeypatch,
                                                                               capsys) -> None:
    """Issue 41.8: ``--json`` in a missing folder was a traceback after all the work."""
    check = _no_work(monkeypatch)
    missing = tmp_path / "no" / "such" / "check.json"
    assert check.main(["--device", "cpu", "--dry", "--json", str(missing)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gpu_check: error: --json {missing}: no folder {missing.parent}; create it or write elsewhere"]
    assert not (tmp_path / "no").exists()
    assert check.main(["--device", "cpu", "--dry", "--json", str(tmp_path), "--overwrite"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gpu_check: error: --json {tmp_path}: is a folder; give a file name"]
