"""bench/bench_scale.py's quick mode runs end to end (so the script does not rot): a 0.2%-size synthetic
COCO prepared by ``prep coco``, its four stores, and one family's three phases in subprocesses, here with
the features read a batch at a time."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from features.store.core import FeatureStore
from prep.dataset import PreparedDataset

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_scale.py"


def test_quick_mode_builds_real_stores_and_measures_a_family(tmp_path, monkeypatch, capsys) -> None:
    spec = importlib.util.spec_from_file_location("bench_scale", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setenv("VSE_FEATURE_MEMORY_MB", "0")  # the phases read every store on demand
    out = tmp_path / "results.json"
    argv = ["--root", str(tmp_path / "scale"), "--scale", "0.002", "--families", "seam", "--steps", "1",
            "--load-seconds", "1", "--eval-captions", "8", "--json", str(out)]
    assert bench.main(argv) == 0
    results = json.loads(out.read_text())
    ds = PreparedDataset.load(tmp_path / "scale" / "data")
    sizes = bench.split_sizes(0.002)
    assert len(ds.images) == sum(sizes.values()) and len(ds.sentences_of("test", "en")) == 5 * sizes["test"]
    regions = FeatureStore(tmp_path / "scale" / "grid-regions.zarr").array("regions")
    assert regions.shape == (len(ds.images), 49, 1280) and regions.dtype == np.float16
    assert FeatureStore(tmp_path / "scale" / "vgg16-fne.zarr").array("fne/ternary").shape[1] == 12_416
    seam = results["results"]["seam"]
    assert seam["load"]["features_in_memory"] is False
    assert seam["load"]["train_captions"] == 5 * (sizes["train"] + sizes["restval"])
    assert seam["train"]["steps"] == 1 and seam["train"]["step_flops"] > 0
    assert seam["eval"]["test_images"] == sizes["test"] and seam["eval"]["protocols"] == ["all"]
    assert "| seam | vgg19-global.zarr:global | no (per batch) |" in capsys.readouterr().out
