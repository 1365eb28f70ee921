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
    for family in ("chain", "oecc", "seam", "vse", "clmr", "liwe"):
        steps = result[f"steps.{family}"]
        assert steps["float32"]["step_ms"] > 0 and steps["bf16"]["captions_per_s"] > 0
    assert result["evaluation"]["order"]["second_s"] >= 0 and "cosine" in result["evaluation"]
    assert result["loader"]["workers_2"]["captions_per_s"] > 0
    assert "all stages passed" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_no_cuda_is_one_line_and_no_cpu_fallback(tmp_path, capsys) -> None:
    assert load_script().main(["--json", str(tmp_path / "c.json")]) == 1
    assert not (tmp_path / "c.json").exists()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: error: device:"), lines


def test_full_sizes_on_the_cpu_are_refused(capsys) -> None:
    assert load_script().main(["--device", "cpu"]) == 1
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
