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
