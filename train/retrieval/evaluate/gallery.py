"""A self-contained HTML retrieval gallery: sampled queries, their top-K results, the ground truth marked.

``train evaluate --run R --gallery OUT.html`` samples text queries (caption -> images) and image
queries (image -> captions) of the evaluated split, and shows each query's K best candidates as the
evaluation ranked them (the same blocked pass, ``topk``), with the ground truth outlined and its
rank (pessimistic: tied candidates count against it). Images are embedded as small JPEG
thumbnails (base64 data URIs), so the page is one file that opens anywhere.
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
from train.retrieval.evaluate.protocols import ProtocolResult
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
"""


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


def gallery_html(result: ProtocolResult, texts: Sequence[str], image_paths: Sequence[str],
                 caption_image: np.ndarray, queries: int = 10, seed: int = 0,
                 title: str = "retrieval") -> str:
    """The page for the first fold of ``result`` (which must hold top-K candidates).

    Args:
        result: a protocol's result from :func:`train.retrieval.evaluate.evaluate_protocols` with ``topk >
        0``.
        texts: (M,) caption texts; ``image_paths``: (N,) image files, rows of the evaluated inputs.
        caption_image: (M,) image row of each caption.
        queries: sampled queries per direction; ``seed``: their sampling.
    """
    fold = result.fold_ranks[0]
    r = fold.ranks
    if r.i2t_topk is None or r.t2i_topk is None:
        raise ValueError("the gallery needs an evaluation with topk > 0")
    rng = np.random.default_rng(seed)
    images = np.arange(fold.start, fold.stop)
    captions = fold.caption_index
    caption_image = np.asarray(caption_image, dtype=np.int64)
    cache: dict[str, str | None] = {}
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p>{len(images)} images, {len(captions)} captions; protocol {html.escape(result.protocol)}"
             f"{' (first fold)' if len(result.fold_ranks) > 1 else ''}. Ground truth outlined in green; "
             "ranks count tied candidates against the ground truth.</p>",
             "<h2>Text to image</h2>"]
    for q in np.sort(rng.choice(len(captions), size=min(queries, len(captions)), replace=False)):
        gt = images[caption_image[captions[q]] - fold.start]
        cands = []
        for row, score in zip(images[r.t2i_topk[q]], r.t2i_topk_scores[q], strict=True):
            mark = " gt" if row == gt else ""
            cands.append(f'<div class="cand{mark}">{_image_tag(image_paths[row], cache)}'
                         f'<span class="score">{score:.4f}</span></div>')
        parts.append(f'<div class="query"><div class="qtext">{html.escape(texts[captions[q]])}</div>'
                     f'<div class="rank">ground truth at rank {int(r.t2i[q])}</div>'
                     f'<div class="row">{"".join(cands)}</div></div>')
    parts.append("<h2>Image to text</h2>")
    for q in np.sort(rng.choice(len(images), size=min(queries, len(images)), replace=False)):
        row = images[q]
        own = set(captions[caption_image[captions] == row].tolist())
        items = []
        for cap, score in zip(captions[r.i2t_topk[q]], r.i2t_topk_scores[q], strict=True):
            mark = ' class="gt"' if int(cap) in own else ""
            items.append(f'<li{mark}>{html.escape(texts[cap])} <span class="score">{score:.4f}</span></li>')
        parts.append(f'<div class="query"><div class="row"><div class="cand qimg">'
                     f'{_image_tag(image_paths[row], cache)}</div><div>'
                     f'<div class="rank">best ground-truth caption at rank {int(r.i2t[q])}</div>'
                     f'<ul class="caps">{"".join(items)}</ul></div></div></div>')
    parts.append("</body></html>")
    return "".join(parts)


def write_gallery(path: str | os.PathLike, result: ProtocolResult, texts: Sequence[str],
                  image_paths: Sequence[str], caption_image: np.ndarray, queries: int = 10, seed: int = 0,
                  title: str = "retrieval") -> Path:
    """Write :func:`gallery_html` atomically to ``path``; returns it."""
    page = gallery_html(result, texts, image_paths, caption_image, queries, seed, title)
    with atomic_file(path, "w") as fh:
        fh.write(page)
    return Path(path)
