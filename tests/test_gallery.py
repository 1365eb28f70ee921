"""``train evaluate --gallery``: a self-contained HTML page, rendered in headless Chromium."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import QUERY_PIPELINE
from PIL import Image

from train.cli import main as train_main  # every train command, train pipeline too

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


def _evaluated(run_dir: Path, tmp_path: Path, topk: int) -> tuple[str, str, dict, list[str], list[str]]:
    """``train evaluate --gallery`` of every test query with its top ``topk``: the page, the ranks CSV, the
    evaluation JSON, the split's image files (rows of the evaluation) and caption texts."""
    from train.retrieval.loaded import embed_split
    from train.retrieval.open import load_run

    page, csv, result = tmp_path / f"g{topk}.html", tmp_path / f"r{topk}.csv", tmp_path / f"e{topk}.json"
    assert train_main(["evaluate", "--run", str(run_dir), "--device", "cpu", "--gallery", str(page),
                       "--gallery-queries", "20", "--topk", str(topk), "--ranks", str(csv),
                       "--json", str(result)]) == 0
    run = load_run(run_dir, device="cpu")
    emb = embed_split(run, "test")
    paths = [str(run.dataset.images[i].path) for i in emb.imgids]
    return page.read_text(), csv.read_text(), json.loads(result.read_text()), paths, emb.texts


def test_the_page_shows_what_the_top_k_missed_under_the_recall_table(run_dir: Path, tmp_path: Path) -> None:
    """Top 1 of 4 images: most text queries miss their image. A missed ground truth is shown after the top K
    (the image's thumbnail and rank; an image query's own captions), exactly when the top K lacks it; the
    page opens with the evaluation's recall table and a legend of the scores."""
    from train.retrieval.evaluate.gallery import thumbnail_uri

    page, csv_text, evaluation, paths, texts = _evaluated(run_dir, tmp_path, topk=1)
    check_queries_against_the_ranks(page, csv_text)
    head, first_query = page.split('<div class="query">', 1)[0], page.index('<div class="query">')
    table = re.search(r'<pre class="metrics">(.*?)</pre>', head, re.S).group(1)
    metrics = evaluation["all"]
    row = next(line for line in table.splitlines() if line.startswith("all"))
    numbers = [float(x) for x in re.findall(r"\d+\.\d", row.split("|", 1)[1])]
    expected = [metrics[d][k] for d in ("i2t", "t2i") for k in ("r1", "r5", "r10", "medr", "meanr")]
    assert numbers == pytest.approx([round(v, 1) for v in [*expected, metrics["rsum"]]])
    assert page.index('class="legend"') < first_query and "higher is better" in head
    missed = {"t2i": 0, "i2t": 0}
    rows = _csv_rows(csv_text, "t2i") + _csv_rows(csv_text, "i2t")
    for block, row in zip(page.split('<div class="query">')[1:], rows, strict=True):
        truth = [int(x) for x in row["ground_truth"].split()]
        shown = {int(x) for x in row["topk"].split()}
        if shown & set(truth):
            assert "missed" not in block
            continue
        missed[row["direction"]] += 1
        assert f"missed: the {'ground truth' if row['direction'] == 't2i' else 'image'}" in block
        assert f"rank {row['rank']}" in block.split("missed:", 1)[1]
        if row["direction"] == "t2i":  # the ground-truth image's own thumbnail, after the top K
            after = block.split('class="cand missed"', 1)[1]
            assert thumbnail_uri(paths[truth[0]]) in after
        else:  # every caption of the image, after the top K
            listed = re.findall(r'<li class="missed">([^<]*)</li>', block)
            assert listed == [html.escape(texts[c]) for c in truth]
    assert missed["t2i"] > 0  # the check is not vacuous (t2i R@1 is 40 on every kernel set)


def test_the_legend_explains_the_measure(run_dir: Path) -> None:
    """Order violation: ``-violation``, 0 = entailed; cosine: the similarity; unknown: higher is better."""
    from train.retrieval.evaluate import evaluate_protocols
    from train.retrieval.evaluate.gallery import gallery_html, score_legend
    from train.retrieval.loaded import embed_split
    from train.retrieval.open import load_run

    run = load_run(run_dir, device="cpu")
    emb = embed_split(run, "test")
    result = evaluate_protocols(emb.images, emb.captions, emb.caption_image, run.settings.measure, topk=2,
                                device="cpu", log=lambda _: None)["all"]
    paths = [str(run.dataset.images[i].path) for i in emb.imgids]
    page = gallery_html(result, emb.texts, paths, emb.caption_image.numpy(), queries=2, measure="order")
    legend = re.search(r'<p class="legend">(.*?)</p>', page).group(1)
    assert "-violation" in legend and "0 = the caption is entailed" in legend
    assert "||max(0, c - i)||^2" in html.unescape(legend)
    assert "||max(0, c - i)|| " in score_legend("order", order_sqrt=True)
    assert "cosine similarity" in score_legend("cosine") and "higher is better" in score_legend(None)
    scores = [float(x) for x in re.findall(r'<span class="score">([-\d.]+)</span>', page)]
    assert scores and max(scores) <= 0  # what the legend says of order-violation scores


#: appended to a copy of the page: once it has loaded, the boxes and styles of what the tests look for, as
#: JSON in an element that Chromium's --dump-dom prints
_LAYOUT_SCRIPT = """<script>
window.addEventListener('load', () => {
  const box = e => {
    const r = e.getBoundingClientRect();
    return {top: r.top, height: r.height, width: r.width};
  };
  const out = {
    metrics: box(document.querySelector('pre.metrics')),
    legend: box(document.querySelector('.legend')),
    firstQuery: box(document.querySelector('.query')),
    missedImages: [...document.querySelectorAll('.cand.missed img')].map(i => ({
      ...box(i), natural: i.naturalWidth, border: getComputedStyle(i).borderTopStyle})),
    missedCaptions: [...document.querySelectorAll('.caps li.missed')].map(li => ({
      ...box(li), text: li.innerText})),
  };
  const pre = document.createElement('pre');
  pre.id = 'layout';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
                           "--window-size=1200,1400", *args],
                          check=True, capture_output=True, timeout=120, text=True)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian package 'chromium')")
def test_gallery_renders_in_headless_chromium(run_dir: Path, tmp_path: Path) -> None:
    """Rendered: text and thumbnails, the recall table and the legend above the first query, and the missed
    ground truth visible (decoded thumbnails dashed beside the top K, the missed captions' text)."""
    page = tmp_path / "g.html"
    assert train_main(["evaluate", "--run", str(run_dir), "--device", "cpu", "--gallery", str(page),
                       "--gallery-queries", "4", "--topk", "1"]) == 0
    shot = tmp_path / "shot.png"
    _chromium(tmp_path, f"--screenshot={shot}", page.as_uri())
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)
    not_white = (pixels < 240).any(axis=2).mean()
    colours = len(np.unique(pixels.reshape(-1, 3)[::7], axis=0))
    assert not_white > 0.05 and colours > 200, (not_white, colours)  # text and thumbnails, not a blank page

    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", _LAYOUT_SCRIPT + "</body>"))
    dom = _chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()).stdout
    layout = json.loads(html.unescape(re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S).group(1)))
    assert layout["metrics"]["height"] > 40 and layout["metrics"]["top"] < layout["legend"]["top"]
    assert layout["legend"]["top"] < layout["firstQuery"]["top"]
    images, captions = layout["missedImages"], layout["missedCaptions"]
    assert images or captions  # top 1 of 4: something is missed
    assert all(i["natural"] > 0 and i["height"] > 100 and i["border"] == "dashed" for i in images), images
    assert all(c["height"] > 0 and c["text"].strip() for c in captions), captions
