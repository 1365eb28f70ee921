"""``features`` command line with the real ImageMapper (timm ``efficientnet_lite0``, random weights).

Small inputs keep it fast: 64-pixel crops, a few blocks of a few real COCO images, one thread.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import (
    BASE,
    kill_after_first_block,
    make_image_dataset,
)

from features.cli import main
from features.store.core import FeatureStore
from features.store.read import read_matrix

# one torch thread: bitwise-reproducible CPU kernels and no oversubscription of a shared machine
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data(coco_sample, tmp_path_factory) -> Path:
    return make_image_dataset(tmp_path_factory.mktemp("prep"), coco_sample, 24)


def run(*args: str) -> int:
    return main([*args])


def test_resume_after_sigkill_equals_uninterrupted_run(data, tmp_path):
    out = tmp_path / "killed.zarr"
    small_blocks = [*BASE, "--block-size", "2"]  # 12 blocks: the kill lands mid-run even on a fast CPU
    done = kill_after_first_block(["cnn", "--data", str(data), "--out", str(out), *small_blocks], out)

    assert run("cnn", "--data", str(data), "--out", str(out), *small_blocks) == 0
    assert run("cnn", "--data", str(data), "--out", str(tmp_path / "clean.zarr"), *small_blocks) == 0
    resumed, clean = FeatureStore(out), FeatureStore(tmp_path / "clean.zarr")
    assert resumed.attrs["summary"]["rows_skipped"] == 2 * int(done.sum())
    for name in ("global", "valid", "imgid", "blocks_done"):
        np.testing.assert_array_equal(resumed.array(name)[:], clean.array(name)[:])
    x, valid = read_matrix(str(out))
    assert x.shape == (24, 1280) and valid.all() and np.isfinite(x).all()


def test_changed_configuration_error_and_overwrite(data, tmp_path, capsys):
    out = str(tmp_path / "s.zarr")
    assert run("cnn", "--data", str(data), "--out", out, *BASE) == 0
    assert run("cnn", "--data", str(data), "--out", out, *BASE, "--input-size", "96") == 2
    err = capsys.readouterr().err
    assert "features: error:" in err and "input_size=64" in err and "input_size=96" in err
    assert run("cnn", "--data", str(data), "--out", out, *BASE, "--input-size", "96", "--overwrite") == 0
    store = FeatureStore(out)
    assert store.attrs["config"]["input_size"] == 96 and store.attrs["summary"]["rows_skipped"] == 0
    # the same command again finds everything done
    assert run("cnn", "--data", str(data), "--out", out, *BASE, "--input-size", "96") == 0
    assert "wrote 0 rows, skipped 24" in capsys.readouterr().out


def test_fne_train_statistics_and_rethreshold(coco_sample, tmp_path, capsys):
    data = make_image_dataset(tmp_path / "prep", coco_sample, 8)  # rows 0-4 train
    out = str(tmp_path / "fne.zarr")
    assert run("fne", "--data", str(data), "--out", out, *BASE) == 0
    store = FeatureStore(out)
    raw = store.array("fne/raw")[:]
    assert raw.shape[0] == 8 and raw.shape[1] == store.attrs["provenance"]["outputs"]["fne/raw"]
    train = raw[:5]
    np.testing.assert_allclose(store.array("fne/mean")[:], train.mean(0), rtol=1e-4, atol=1e-5)
    assert store.attrs["config"]["thresholds"] == [-0.25, 0.15]
    before = store.array("fne/ternary")[:]
    assert run("fne", "--out", out, "--rethreshold", "--threshold-low", "-1", "--threshold-high", "1") == 0
    after = FeatureStore(out).array("fne/ternary")[:]
    assert (after == 0).sum() > (before == 0).sum()
    np.testing.assert_array_equal(FeatureStore(out).array("fne/raw")[:], raw)
    assert FeatureStore(out).attrs["config"]["thresholds"] == [-1.0, 1.0]
    # extraction asked with thresholds other than the store's says how to change them
    assert run("fne", "--data", str(data), "--out", out, *BASE) == 2
    assert "--rethreshold" in capsys.readouterr().err


def test_errors_are_one_line(data, tmp_path, capsys):
    assert run("regions", "--detector", "yolo", "--data", str(data), "--out", str(tmp_path / "r.zarr")) == 2
    assert "--detector 'yolo': use one of grid, fasterrcnn" in capsys.readouterr().err
    assert not (tmp_path / "r.zarr").exists()
    assert run("cnn", "--out", str(tmp_path / "x.zarr"), *BASE) == 2
    assert "--data is required" in capsys.readouterr().err
    assert run("cnn", "--data", str(data), "--out", str(tmp_path / "x.zarr"), *BASE,
               "--scheduler", "bogus") == 2
    assert "--scheduler must be" in capsys.readouterr().err


def test_help_explains_every_option(capsys):
    for command in ("cnn", "fne", "regions", "export", "import"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        for option in ("--out", "--data"):
            assert option in text
    with pytest.raises(SystemExit):
        main(["fne", "--help"])
    text = capsys.readouterr().out
    for option in ("--scheduler", "--workers", "--on-error", "--rethreshold", "--threshold-low", "--weights"):
        assert option in text


def test_bad_image_recorded_or_fatal(coco_sample, tmp_path, capsys):
    bad = tmp_path / "truncated.jpg"
    good = sorted((coco_sample / "images").iterdir())[0].read_bytes()
    bad.write_bytes(good[: len(good) // 4])
    data = make_image_dataset(tmp_path / "prep", coco_sample, 6, extra={5: bad})
    out = str(tmp_path / "f.zarr")
    assert run("cnn", "--data", str(data), "--out", out, *BASE, "--on-error", "fail") == 2
    err = capsys.readouterr().err
    assert "truncated.jpg" in err and "imgid 5" in err
    assert FeatureStore(tmp_path / "f.zarr").blocks_done().tolist() == [True, False]  # block 0 kept
    assert run("cnn", "--data", str(data), "--out", str(tmp_path / "f.zarr"), *BASE) == 0
    out = capsys.readouterr().out
    assert "wrote 2 rows, skipped 4 already done, 1 failed" in out and "truncated.jpg" in out
    store = FeatureStore(tmp_path / "f.zarr")
    assert [f["imgid"] for f in store.attrs["failures"]] == [5]
    x, valid = read_matrix(str(tmp_path / "f.zarr"))
    assert valid.tolist() == [True] * 5 + [False] and np.isnan(x[5]).all()


def test_settings_from_a_named_pipeline(data, tmp_path):
    file = tmp_path / "pipelines.yaml"
    file.write_text(f"""
pipelines:
  tiny:
    description: tiny test pipeline
    prep: {{dataset: synthetic, out: {data}}}
    features: {{kind: cnn, cnn: efficientnet_lite0, weights: none, crops: 1, input_size: 64,
               block_size: 8, device: cpu, out: {tmp_path / "p.zarr"}}}
""")
    assert run("cnn", "--pipeline", "tiny", "--pipelines", str(file), "--block-size", "12",
               "--no-progress") == 0
    config = FeatureStore(tmp_path / "p.zarr").attrs["config"]
    assert (config["cnn"], config["block_size"], config["n_rows"]) == ("efficientnet_lite0", 12, 24)
