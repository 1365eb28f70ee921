"""``train evaluate --gallery``: a self-contained HTML page, rendered in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_query import PIPELINE

from train.cli import main as train_main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gallery")
    (root / "p.yaml").write_text(PIPELINE.format(kind="cnn"))
    assert train_main(["pipeline", "tiny", "--pipelines", str(root / "p.yaml"), "--until", "train"]) == 0
    return root / "run"


def test_gallery_page_lists_queries_with_their_ranked_results(run_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "g.html"
    csv = tmp_path / "ranks.csv"
    assert train_main(["evaluate", "--run", str(run_dir), "--device", "cpu", "--gallery", str(page),
                       "--gallery-queries", "3", "--topk", "4", "--ranks", str(csv)]) == 0
    text = page.read_text()
    assert text.count('class="query"') == 6  # 3 text queries + 3 image queries
    assert text.count("data:image/jpeg;base64,") >= 3 * 4 + 3  # thumbnails embedded, no external files
    assert "src=\"http" not in text and "src=\"file" not in text
    # every text query's listed rank is the one the CSV has for that caption
    ranks = {}
    for line in csv.read_text().splitlines()[1:]:
        fields = line.split(",")
        if fields[2] == "t2i":
            ranks.setdefault(int(fields[4]), 0)
    shown = [int(r) for r in re.findall(r"ground truth at rank (\d+)", text)]
    assert len(shown) == 3 and set(shown) <= set(ranks)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian package 'chromium')")
def test_gallery_renders_in_headless_chromium(run_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "g.html"
    assert train_main(["evaluate", "--run", str(run_dir), "--device", "cpu", "--gallery", str(page),
                       "--gallery-queries", "4"]) == 0
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1400",
                    f"--screenshot={shot}", page.as_uri()], check=True, capture_output=True, timeout=120)
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)
    not_white = (pixels < 240).any(axis=2).mean()
    colours = len(np.unique(pixels.reshape(-1, 3)[::7], axis=0))
    assert not_white > 0.05 and colours > 200, (not_white, colours)  # text and thumbnails, not a blank page
