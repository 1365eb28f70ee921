"""A pipeline's stages write folders of their own; a hand-made prepared dataset is the user's (issue 30.7)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def pipelines_file(folder: Path, prep_out: str, features_out: str) -> Path:
    path = folder / "p.yaml"
    path.write_text(f"""pipelines:
  tiny:
    description: a tiny pipeline
    paper: chain-vse
    prep: {{dataset: synthetic, out: {prep_out}, num_images: 24, image_size: 32, seed: 0}}
    features: {{kind: cnn, cnn: resnet152, weights: none, crops: 1, resize: 32, input_size: 32,
               batch_size: 8, block_size: 8, out: {features_out}}}
""")
    return path


def pipeline(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "train", "pipeline", "tiny", "--pipelines", str(path),
                           "--until", "prep", *extra], capture_output=True, text=True, timeout=300,
                          cwd=path.parent)


@pytest.mark.parametrize("prep_out,features_out,says", [
    ("data", "data/feats.zarr", "features.out"),
    ("/", "feats.zarr", "prep.out is the file system root"),
    ("data", "data", "lies inside"),
])
def test_stage_outputs_are_folders_of_their_own(tmp_path: Path, prep_out: str, features_out: str,
                                                says: str) -> None:
    done = pipeline(pipelines_file(tmp_path, prep_out, features_out))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert says in lines[0] and not (tmp_path / "data").exists()


def test_a_hand_made_prepared_dataset_is_replaced_only_with_overwrite(tmp_path: Path) -> None:
    mine = tmp_path / "data"
    made = subprocess.run([sys.executable, "-m", "prep", "synthetic", "--num-images", "36", "--out",
                           str(mine), "-q"], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    before = (mine / "dataset.json").read_bytes()
    path = pipelines_file(tmp_path, "data", "feats.zarr")
    done = pipeline(path)  # 36 images by hand, 24 in the pipeline: other settings
    assert done.returncode == 2 and "that no pipeline made, with other settings" in done.stderr, done.stderr
    assert (mine / "dataset.json").read_bytes() == before
    done = pipeline(path, "--overwrite")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (mine / "dataset.json").read_bytes() != before  # 24 images now
    again = pipeline(path)  # the pipeline's own prepared dataset: up to date, no refusal
    assert again.returncode == 0 and "up to date" in again.stdout, again.stderr[-2000:]


def test_a_hand_made_prepared_dataset_of_the_same_settings_is_taken_as_it_is(tmp_path: Path) -> None:
    mine = tmp_path / "data"
    made = subprocess.run([sys.executable, "-m", "prep", "synthetic", "--num-images", "24", "--image-size",
                           "32", "--seed", "0", "--out", str(mine), "-q"], capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    before = (mine / "dataset.json").stat().st_mtime_ns
    done = pipeline(pipelines_file(tmp_path, "data", "feats.zarr"))
    assert done.returncode == 0 and "prepared with the same settings" in done.stdout, done.stderr[-2000:]
    assert (mine / "dataset.json").stat().st_mtime_ns == before


# -- issue 43.3: a COCO sample prepared by hand as datasets/coco.md shows, then its pipeline ----------------
def _prep_coco_sample_by_hand(coco_sample: Path, cwd: Path, out: str, *extra: str) -> None:
    """``prep coco --flat`` with the sample's files given relative to the working directory, as a user types
    them (``datasets/coco.md``)."""
    import os

    flat = [os.path.relpath(coco_sample / name, cwd) for name in ("train.json", "val.json")]
    made = subprocess.run([sys.executable, "-m", "prep", "coco", "--flat", *flat, "--out", out, "-q", *extra],
                          capture_output=True, text=True, timeout=300, cwd=cwd)
    assert made.returncode == 0, made.stderr[-2000:]


def _coco_sample_pipeline(work: Path, shared: Path) -> subprocess.CompletedProcess:
    import os

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "VSE_WORK": str(work), "VSE_RUNS": str(work / "runs"),
           "VSE_SHARED_DATA": str(shared)}
    return subprocess.run([sys.executable, "-m", "train", "pipeline", "coco-sample-chain", "--pipelines",
                           str(root / "pipelines.yaml"), "--until", "prep"], capture_output=True, text=True,
                          timeout=300, cwd=work, env=env)


def test_a_hand_made_coco_sample_is_adopted_and_a_difference_is_named(tmp_path: Path, coco_sample: Path
                                                                      ) -> None:
    """Issue 43.3: ``prep coco --flat`` with the pipeline's settings, its files given by relative paths, is
    the pipeline's prepared dataset (paths compare as absolute paths); with another ``--flat-val-images`` the
    refusal names that setting with both values."""
    work = tmp_path / "work"
    work.mkdir()
    out = work / "coco_sample" / "data"
    _prep_coco_sample_by_hand(coco_sample, work, "coco_sample/data")
    before = (out / "dataset.json").stat().st_mtime_ns
    done = _coco_sample_pipeline(work, coco_sample.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"prep: up to date ({out}, prepared with the same settings)" in done.stdout
    assert (out / "dataset.json").stat().st_mtime_ns == before

    other = tmp_path / "other"
    other.mkdir()
    _prep_coco_sample_by_hand(coco_sample, other, "coco_sample/data", "--flat-val-images", "50")
    done = _coco_sample_pipeline(other, coco_sample.parent)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert ("that no pipeline made, with other settings (prep.flat_val_images: 50 in the folder, 100 in the "
            "pipeline); set prep.out to a new folder, or run `train pipeline coco-sample-chain --overwrite`"
            in lines[0]), lines[0]
