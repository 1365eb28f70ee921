"""Packaging: the wheel carries pipelines.yaml, so `train pipeline demo` runs from a non-editable
install; without the optional extras, the features that need them stop with a one-line error naming
the extra to install (simulated by hiding the installed modules)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from features.cli import main as features_main
from prep import tokenize
from prep.cli import main as prep_main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="setuptools is not installed")
def test_the_wheel_carries_pipelines_yaml_and_runs_from_anywhere(tmp_path: Path) -> None:
    src = tmp_path / "src"
    skip = (".git", ".venv", "work", "runs", "build", "*.egg-info", "__pycache__", ".pytest_cache",
            ".ruff_cache")
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(*skip))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                    "-w", str(tmp_path / "wheel")], check=True, cwd=src, capture_output=True)
    wheel, = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("train/pipelines.yaml") == (ROOT / "pipelines.yaml").read_bytes()
        zf.extractall(tmp_path / "installed")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VSE_PIPELINES", "VSE_WORK", "VSE_RUNS")}
    env["PYTHONPATH"] = str(tmp_path / "installed")
    listed = subprocess.run([sys.executable, "-m", "train", "pipeline", "--list"], cwd=elsewhere, env=env,
                            capture_output=True, text=True, check=True).stdout
    assert "demo" in listed and "coco-chain-resnet152" in listed


@pytest.fixture
def fresh_tokenizers():
    tokenize._blank.cache_clear()
    tokenize._kakasi.cache_clear()
    yield
    tokenize._blank.cache_clear()
    tokenize._kakasi.cache_clear()


def test_japanese_without_the_ja_extra(monkeypatch, tmp_path, capsys, fresh_tokenizers) -> None:
    for name in ("sudachipy", "pykakasi"):
        monkeypatch.setitem(sys.modules, name, None)
    out = str(tmp_path / "d")
    assert prep_main(["synthetic", "--num-images", "30", "--languages", "ja", "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'vse-toolkit[ja]'" in err
    assert not (tmp_path / "d").exists()


def test_dask_scheduler_without_the_dask_extra(monkeypatch, tmp_path, capsys) -> None:
    for name in ("distributed", "dask", "dask.distributed"):
        monkeypatch.setitem(sys.modules, name, None)
    assert prep_main(["synthetic", "--num-images", "30", "--languages", "en", "--out", str(tmp_path / "d"),
                      "-q"]) == 0
    capsys.readouterr()
    assert features_main(["cnn", "--data", str(tmp_path / "d"), "--cnn", "efficientnet_lite0", "--weights",
                          "none", "--crops", "1", "--input-size", "32", "--out", str(tmp_path / "s.zarr"),
                          "--scheduler", "local", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'vse-toolkit[dask]'" in err
