"""``train evaluate --gallery``: a self-contained HTML page, rendered in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import QUERY_PIPELINE
from PIL import Image

from train.cli import main as train_main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gallery")
    (root / "p.yaml").write_text(QUERY_PIPELINE.format(kind="cnn"))
    assert train_main(["pipeline", "tiny", "--pipelines", str(root / "p.yaml"), "--until", "train"]) == 0
    return root / "run"


def test_gallery_page_lists_queries_with_their_ranked_results(run_dir: Path, tmp_path: Path) -> None:
    """Every query of the test split (4 images, 20 captions) on the page, with its top 4.

    The top 4 of a text query is every test image, so each text query outlines its ground truth whatever
    the one-epoch model learnt (the check of the outlines is never vacuous); that the page shows varying
    ranks is a statistical property of the model: it fails only if all 24 queries share one rank, e.g.
    t2i R@1 = 100 (the model has t2i R@1 = 40 and text queries at ranks 1 to 4 under each kernel set of
    ``make test-kernels``)."""
    page = tmp_path / "g.html"
    csv = tmp_path / "ranks.csv"
    assert train_main(["evaluate", "--run", str(run_dir), "--device", "cpu", "--gallery", str(page),
                       "--gallery-queries", "20", "--topk", "4", "--ranks", str(csv)]) == 0
    text = page.read_text()
    assert text.count('class="query"') == 24  # 20 text queries + 4 image queries
    assert text.count("data:image/jpeg;base64,") >= 20 * 4 + 4  # thumbnails embedded, no external files
    assert "src=\"http" not in text and "src=\"file" not in text
    check_queries_against_the_ranks(text, csv.read_text())


def _csv_rows(csv_text: str, direction: str) -> list[dict[str, str]]:
    """The CSV's queries of one direction, in query order."""
    lines = csv_text.splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","), strict=True)) for line in lines[1:]]
    return sorted((r for r in rows if r["direction"] == direction), key=lambda r: int(r["query"]))


def check_queries_against_the_ranks(page: str, csv_text: str) -> None:
    """The page shows every query of the CSV, in its order (text queries, then image queries), each with
    the top-K scores and the rank the evaluation gave it, and outlines the ground truth exactly where the
    evaluation ranked it (no mark when it is beyond the top K): a gallery that marks nothing, or shows one
    query's rank or candidates for all, fails. Queries are matched by position, not by their scores:
    duplicate captions have the same scores but other ground truths."""
    blocks = page.split('<div class="query">')[1:]
    rows = _csv_rows(csv_text, "t2i") + _csv_rows(csv_text, "i2t")
    shown_ranks, marks = [], 0
    for block, row in zip(blocks, rows, strict=True):
        text_query = 'class="qtext"' in block
        assert text_query == (row["direction"] == "t2i")
        scores = [float(x) for x in re.findall(r'<span class="score">([-\d.]+)</span>', block)]
        # printed with 4 decimals (the CSV holds them with 8 digits)
        listed = [float(x) for x in row["topk_scores"].split()]
        np.testing.assert_allclose(scores, listed, rtol=0, atol=5.1e-5)
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
