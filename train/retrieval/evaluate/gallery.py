"""A self-contained HTML retrieval gallery: sampled queries, their top-K results, the ground truth marked.

``train evaluate --run R --gallery OUT.html`` samples text queries (caption -> images) and image
queries (image -> captions) of the evaluated split, and shows each query's K best candidates as the
evaluation ranked them (the same blocked pass, ``topk``), with the ground truth outlined and its
rank (pessimistic: tied candidates count against it). A ground truth the top K misses is shown beside
it, dashed, with its rank: the image of a text query, the captions of an image query. The page opens
with the protocol's recall table (the one ``train evaluate`` prints) and a legend saying what the
scores are under the run's measure (an order-violation score is ``-violation``: 0 = the caption is
entailed, the larger the better). Images are embedded as small JPEG thumbnails (base64 data URIs), so
the page is one file that opens anywhere.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from features.extractors.images import ImageError, load_image
from train.retrieval.evaluate.protocols import FoldRanks, ProtocolResult
from train.retrieval.evaluate.tables import format_results
from vsecore.io import atomic_file

THUMBNAIL = 160

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 2em; }
.query { border-top: 1px solid #ccc; padding: .8em 0; }
.qtext { font-weight: bold; margin-bottom: .4em; }
.rank { color: #555; font-size: .9em; }
.row { display: flex; flex-wrap: wrap; gap: .6em; align-items: flex-start; }
.cand { width: 170px; font-size: .8em; text-align: center; }
.cand img, .ph { width: 160px; height: 160px; object-fit: contain; background: #eee;
  border: 4px solid transparent; display: block; margin: 0 auto; }
.cand.gt img, .cand.gt .ph { border-color: #2a9d3a; }
.caps { list-style: none; padding: 0; margin: 0; }
.caps li { padding: .2em .4em; margin: .15em 0; border-left: 5px solid #ddd; }
.caps li.gt { border-left-color: #2a9d3a; background: #eaf6ec; }
.qimg img, .qimg .ph { border-color: #888; }
.score { color: #777; }
.metrics { background: #f6f6f6; padding: .6em; font-size: .85em; overflow-x: auto; }
.legend { color: #444; }
.cand.missed { margin-left: 1.2em; }
.cand.missed img, .cand.missed .ph { border: 4px dashed #c0392b; }
.caps li.missed { border-left: 5px dashed #c0392b; background: #fbeeee; }
.missed-label { color: #c0392b; font-size: .9em; margin-top: .4em; }
"""


def score_legend(measure: str | None, order_sqrt: bool = False) -> str:
    """What a score of the page is, in words, for ``measure`` (``order``, ``cosine``; None: unknown)."""
    if measure == "order":
        violation = "||max(0, c - i)||" if order_sqrt else "||max(0, c - i)||^2"
        return (f"score = -violation = -{violation} of caption embedding c and image embedding i: 0 = the "
                "caption is entailed by the image (no violation); more negative = a larger violation; higher "
                "is better")
    if measure == "cosine":
        return ("score = cosine similarity of the image and the caption: 1 = the same direction; higher is "
                "better")
    return "score = the run's similarity of the image and the caption: higher is better"


def thumbnail_uri(path: str | os.PathLike, size: int = THUMBNAIL) -> str | None:
    """A ``data:image/jpeg;base64,...`` thumbnail of an image file, or ``None`` if it cannot be read."""
    try:
        img = load_image(str(path))
    except ImageError:
        return None
    img.thumbnail((size, size))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _image_tag(path: str, cache: dict[str, str | None]) -> str:
    if path not in cache:
        cache[path] = thumbnail_uri(path)
    uri = cache[path]
    name = html.escape(Path(path).name)
    if uri is None:
        return f'<div class="ph" title="{name}">{name}<br>(unreadable)</div>'
    return f'<img src="{uri}" alt="{name}" title="{name}">'


def _header(result: ProtocolResult, title: str, n_images: int, n_captions: int, measure: str | None,
            order_sqrt: bool) -> list[str]:
    """The page's head, the recall table of ``result`` (as ``train evaluate`` prints it) and the legend."""
    folds = len(result.fold_ranks)
    averaged = f" (the table averages its {folds} folds; queries from the first fold)" if folds > 1 else ""
    table = format_results({result.protocol: result})
    return [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
            f'<pre class="metrics">{html.escape(table)}</pre>',
            f"<p>{n_images} images, {n_captions} captions; protocol {html.escape(result.protocol)}"
            f"{averaged}. "
            "Ground truth outlined in green; a ground truth the top K misses is shown after it, dashed in "
            "red, with its rank; ranks count tied candidates against the ground truth.</p>",
            f'<p class="legend">{html.escape(score_legend(measure, order_sqrt))}.</p>']


def _text_query(q: int, fold: FoldRanks, texts: Sequence[str], image_paths: Sequence[str],
                caption_image: np.ndarray, thumbs: dict[str, str | None]) -> str:
    """One text query (fold caption ``q``): its top K images, the ground truth outlined, or shown after
    them when they miss it."""
    r, images, captions = fold.ranks, np.arange(fold.start, fold.stop), fold.caption_index
    gt = images[caption_image[captions[q]] - fold.start]
    shown = images[r.t2i_topk[q]]
    cands = []
    for row, score in zip(shown, r.t2i_topk_scores[q], strict=True):
        mark = " gt" if row == gt else ""
        cands.append(f'<div class="cand{mark}">{_image_tag(image_paths[row], thumbs)}'
                     f'<span class="score">{score:.4f}</span></div>')
    if gt not in shown:
        cands.append(f'<div class="cand missed"><div class="missed-label">missed: the ground truth, rank '
                     f'{int(r.t2i[q])}</div>{_image_tag(image_paths[gt], thumbs)}</div>')
    return (f'<div class="query"><div class="qtext">{html.escape(texts[captions[q]])}</div>'
            f'<div class="rank">ground truth at rank {int(r.t2i[q])}</div>'
            f'<div class="row">{"".join(cands)}</div></div>')


def _image_query(q: int, fold: FoldRanks, texts: Sequence[str], image_paths: Sequence[str],
                 caption_image: np.ndarray, thumbs: dict[str, str | None]) -> str:
    """One image query (fold image ``q``): its top K captions, its own outlined, or listed after them
    when they miss every one."""
    r, captions = fold.ranks, fold.caption_index
    row = fold.start + q
    own = captions[caption_image[captions] == row]
    shown = captions[r.i2t_topk[q]]
    items = []
    for cap, score in zip(shown, r.i2t_topk_scores[q], strict=True):
        mark = ' class="gt"' if cap in own else ""
        items.append(f'<li{mark}>{html.escape(texts[cap])} <span class="score">{score:.4f}</span></li>')
    missed = ""
    if not np.isin(own, shown).any():
        missed = (f'<div class="missed-label">missed: the image\'s own captions (the best at rank '
                  f'{int(r.i2t[q])})</div><ul class="caps">'
                  + "".join(f'<li class="missed">{html.escape(texts[cap])}</li>' for cap in own) + "</ul>")
    return (f'<div class="query"><div class="row"><div class="cand qimg">'
            f'{_image_tag(image_paths[row], thumbs)}</div><div>'
            f'<div class="rank">best ground-truth caption at rank {int(r.i2t[q])}</div>'
            f'<ul class="caps">{"".join(items)}</ul>{missed}</div></div></div>')


def gallery_html(result: ProtocolResult, texts: Sequence[str], image_paths: Sequence[str],
                 caption_image: np.ndarray, queries: int = 10, seed: int = 0,
                 title: str = "retrieval", measure: str | None = None, order_sqrt: bool = False) -> str:
    """The page for the first fold of ``result`` (which must hold top-K candidates).

    Args:
        result: a protocol's result from :func:`train.retrieval.evaluate.evaluate_protocols` with ``topk >
        0``.
        texts: (M,) caption texts; ``image_paths``: (N,) image files, rows of the evaluated inputs.
        caption_image: (M,) image row of each caption.
        queries: sampled queries per direction; ``seed``: their sampling.
        measure: the similarity the scores are (``order``, ``cosine``; None: unknown), and ``order_sqrt``
            whether an order violation's square root was taken: the legend explains them.
    """
    fold = result.fold_ranks[0]
    if fold.ranks.i2t_topk is None or fold.ranks.t2i_topk is None:
        raise ValueError("the gallery needs an evaluation with topk > 0")
    rng = np.random.default_rng(seed)
    n_images, n_captions = fold.stop - fold.start, len(fold.caption_index)
    caption_image = np.asarray(caption_image, dtype=np.int64)
    thumbs: dict[str, str | None] = {}
    parts = [*_header(result, title, n_images, n_captions, measure, order_sqrt), "<h2>Text to image</h2>"]
    for q in np.sort(rng.choice(n_captions, size=min(queries, n_captions), replace=False)):
        parts.append(_text_query(int(q), fold, texts, image_paths, caption_image, thumbs))
    parts.append("<h2>Image to text</h2>")
    for q in np.sort(rng.choice(n_images, size=min(queries, n_images), replace=False)):
        parts.append(_image_query(int(q), fold, texts, image_paths, caption_image, thumbs))
    parts.append("</body></html>")
    return "".join(parts)


def write_gallery(path: str | os.PathLike, result: ProtocolResult, texts: Sequence[str],
                  image_paths: Sequence[str], caption_image: np.ndarray, queries: int = 10, seed: int = 0,
                  title: str = "retrieval", measure: str | None = None, order_sqrt: bool = False) -> Path:
    """Write :func:`gallery_html` atomically to ``path``; returns it."""
    page = gallery_html(result, texts, image_paths, caption_image, queries, seed, title, measure, order_sqrt)
    with atomic_file(path, "w") as fh:
        fh.write(page)
    return Path(path)
