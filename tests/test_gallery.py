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
    check_queries_against_the_ranks(text, csv.read_text())


def _csv_rows(csv_text: str, direction: str) -> dict[tuple[str, ...], dict[str, str]]:
    """The CSV's queries of one direction keyed by their top-K scores as the page prints them."""
    lines = csv_text.splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]
    return {tuple(f"{float(x):.4f}" for x in r["topk_scores"].split()): r
            for r in rows if r["direction"] == direction}


def check_queries_against_the_ranks(page: str, csv_text: str) -> None:
    """Every query of the page shows the rank the evaluation gave it, and outlines the ground truth exactly
    where the evaluation ranked it (no mark when it is beyond the top K): a gallery that marks nothing,
    or shows one query's rank for all, fails."""
    blocks = page.split('<div class="query">')[1:]
    t2i, i2t = _csv_rows(csv_text, "t2i"), _csv_rows(csv_text, "i2t")
    shown_ranks, marks = [], 0
    for block in blocks:
        scores = tuple(re.findall(r'<span class="score">([-\d.]+)</span>', block))
        text_query = 'class="qtext"' in block
        row = (t2i if text_query else i2t)[scores]  # the CSV row of this query
        rank = int(re.search(r"at rank (\d+)", block).group(1))
        assert rank == int(row["rank"])
        shown_ranks.append(rank)
        candidates = re.findall(r'<div class="cand( gt)?">', block) if text_query else \
            re.findall(r"<li( class=\"gt\")?>", block)
        outlined = [k + 1 for k, mark in enumerate(candidates) if mark]
        truth = set(row["ground_truth"].split())
        expected = [k + 1 for k, c in enumerate(row["topk"].split()) if c in truth]
        assert outlined == expected, (outlined, expected)
        marks += len(outlined)
        if rank <= len(candidates) and int(row["ties"]) == 0:
            assert outlined[0] == rank  # no tie: the first outlined candidate sits at the rank shown
    assert marks > 0 and len(set(shown_ranks)) > 1  # the page shows real, varying ranks


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
