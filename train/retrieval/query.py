"""Querying a trained run: text -> images and image -> captions, from Python or ``train query``.

Python::

    from train.retrieval.open import load_run
    run = load_run("runs/coco-sample-chain")
    run.encode_text(["a dog on a beach"])            # (1, d) caption embeddings
    run.encode_images(["photo.jpg"])                 # (1, d) image embeddings (same extractor as the store)
    hits = run.search(text="a dog on a beach", top=5)[0]   # the split's images, best first
    hits = run.search(image="photo.jpg", top=5)[0]         # the split's captions, best first

Candidates are the images (or captions) of one split of the run's prepared dataset (``split=None``:
every image with valid features, every caption of the run's language), or of another collection:
``run.search(..., data="work/mine/data", features="work/mine/feats.zarr")`` ranks the images of that
prepared dataset from their feature store, which must be extracted exactly as the run's (same kind,
network, weights, crops and sizes). Scores are the run's own
similarity (cosine or order violation); equal scores are ordered by candidate index, so results
are deterministic. The candidates' embeddings are computed once per run object and split.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from features.extractors.recipe import rows_description
from features.store.core import FeatureStore
from features.store.read import parse_spec
from prep.dataset import PreparedDataset
from train.engine.data import ImageRows, read_features
from train.engine.inference import embed_images
from train.engine.settings import TrainSection
from train.engine.similarity import similarity
from train.retrieval.evaluate.layout import scores_of_distinct
from train.run.config import model_sizes
from vsecore.errors import UserError
from vsecore.lines import printable


class SearchableRun(Protocol):
    """What a search reads of a run: :class:`train.retrieval.loaded.LoadedRun` has it, and offers
    :func:`search` as its ``search`` method. A protocol, so this module needs no import of that class."""

    run_dir: Path
    settings: TrainSection
    config: dict[str, Any]
    model: torch.nn.Module
    device: torch.device

    @property
    def dataset(self) -> PreparedDataset: ...

    def feature_store_config(self) -> dict[str, Any]: ...

    def encode_text(self, texts: list[str]) -> torch.Tensor: ...

    def encode_images(self, paths: list[str | os.PathLike]) -> torch.Tensor: ...

    def embed(self, split: str, texts: list[str] | None = None, lang: str | None = None) -> Any: ...


@dataclass(frozen=True)
class Hit:
    """One retrieved candidate: its 1-based rank, score, and what it is."""

    rank: int
    score: float
    imgid: int  # prepared imgid of the image (image hits) or of the caption's image (caption hits)
    path: str | None = None  # image hits: the image file
    text: str | None = None  # caption hits: the caption


@dataclass
class Candidates:
    """Embedded candidates of one split: images (N, d) with their imgids and paths, captions (M, d)."""

    images: torch.Tensor
    imgids: np.ndarray
    paths: list[str]
    captions: torch.Tensor
    caption_imgids: np.ndarray
    texts: list[str]


def candidates(run: SearchableRun, split: str | None = "test") -> Candidates:
    """Embed (once per run and split) the images and captions that queries are ranked against."""
    cache = run.__dict__.setdefault("_candidates", {})
    if split in cache:
        return cache[split]
    splits = [split] if split is not None else [s for s in ("train", "val", "test")
                                                 if run.dataset.images_of(s)]
    parts = [run.embed(s) for s in splits]
    paths = [str(im.path) for im in run.dataset.images]
    imgids = np.concatenate([p.imgids for p in parts])
    cache[split] = Candidates(
        images=torch.cat([p.images for p in parts]), imgids=imgids, paths=[paths[i] for i in imgids],
        captions=torch.cat([p.captions for p in parts]),
        caption_imgids=np.concatenate([p.imgids[p.caption_image.numpy()] for p in parts]),
        texts=[t for p in parts for t in p.texts])
    return cache[split]


def store_candidates(run: SearchableRun, data: str | Path, features: str,
                     split: str | None = None) -> Candidates:
    """Embed (once per run, collection and split) the images and captions of another prepared dataset.

    Args:
        run: a loaded run.
        data: a prepared dataset folder (e.g. one's own images, ``prep karpathy``).
        features: its feature store ``STORE[:KEY]``, extracted with the run's store's settings.
        split: only the images of this split (``None``: every image with valid features).

    Raises:
        UserError: the store was made for other images, with other extractor settings than the
            run's store, or is a Full-Network Embedding (standardised with its own train statistics,
            so its rows are not comparable with the run's).
    """
    key = (str(Path(data).resolve()), features, split)
    cache = run.__dict__.setdefault("_store_candidates", {})
    if key in cache:
        return cache[key]
    mine = run.feature_store_config()
    theirs = FeatureStore(parse_spec(features)[0]).attrs.get("config", {})
    if theirs.get("kind") == "fne" or mine.get("kind") == "fne":
        raise UserError(f"{features}: searching another Full-Network Embedding store is not supported: it is "
                        "standardised with its own train statistics, not the run's")
    mine_rows, theirs_rows = rows_description(mine), rows_description(theirs)
    for name in dict.fromkeys([*mine_rows, *theirs_rows]):  # what a row means: equal in both stores
        if mine_rows.get(name) != theirs_rows.get(name):
            raise UserError(f"{features}: extracted with {name} = {theirs.get(name)!r}, but the run's store "
                            f"{run.settings.features} with {mine.get(name)!r}; extract it with the run's "
                            "settings")
    dataset = PreparedDataset.load(data)
    x, valid = read_features(features, dataset)  # refuses a store made for other images
    width = model_sizes(run.config)[1]
    if [*x.shape[1:]] != width:
        raise UserError(f"{features}: rows of shape {[*x.shape[1:]]}, but the run {run.run_dir} reads rows "
                        f"of shape {width} (feature_shape); give the store extracted with the run's settings")
    rows = np.array([i for i in dataset.image_rows(split) if valid[i]], dtype=np.int64)
    if not len(rows):
        raise UserError(f"{data}: no images with valid features{f' in split {split}' if split else ''}")
    # embedded in blocks from the store's own dtype (a large store is read a block at a time)
    features = x if not isinstance(x, np.ndarray) else torch.from_numpy(np.ascontiguousarray(x))
    images = embed_images(run.model, ImageRows(features, rows), run.device, amp=run.settings.amp)
    lang = run.settings.lang
    texts, cap_img = dataset.captions(split, lang) if lang in dataset.languages else ([], [])
    keep = set(rows.tolist())
    pairs = [(t, i) for t, i in zip(texts, cap_img, strict=True) if i in keep]
    captions = run.encode_text([t for t, _ in pairs]) if pairs else torch.zeros(0, images.shape[1])
    cache[key] = Candidates(images=images, imgids=rows, paths=[str(dataset.images[i].path) for i in rows],
                            captions=captions, caption_imgids=np.array([i for _, i in pairs], dtype=np.int64),
                            texts=[t for t, _ in pairs])
    return cache[key]


def _top(scores: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``scores (Q, K)``: the ``top`` best ``(values, indices)``, ties by lower index."""
    values, indices = torch.sort(scores, dim=1, descending=True, stable=True)
    return values[:, :top], indices[:, :top]


def search(run: SearchableRun, text: str | Sequence[str] | None = None,
           image: str | Path | Sequence[str | Path] | None = None, top: int = 5,
           split: str | None = "test", data: str | Path | None = None, features: str | None = None
           ) -> list[list[Hit]]:
    """The ``top`` images for each text query, or the ``top`` captions for each image query.

    Args:
        run: a loaded run (:func:`train.retrieval.open.load_run`).
        text: one query text or a list (text -> image retrieval).
        image: one image path or a list (image -> text retrieval); give ``text`` or ``image``.
        top: hits per query.
        split: the split whose images / captions are the candidates (``None``: all).
        data: with ``features``, search this prepared dataset's images (and captions) instead of
            the run's (:func:`store_candidates`).
        features: the feature store of ``data``.

    Returns:
        One list of :class:`Hit` per query, best first.
    """
    if (text is None) == (image is None):
        raise UserError("give either text queries or image queries")
    if top < 1:
        raise UserError(f"--top must be at least 1, got {top}")
    if (data is None) != (features is None):
        raise UserError("give both --data and --features to search another collection")
    cands = candidates(run, split) if data is None else store_candidates(run, data, str(features), split)
    if image is not None and not len(cands.texts):
        raise UserError(f"{data}: no captions in the run's language ({run.settings.lang}) to rank")
    measure, sqrt = run.settings.measure, bool(run.settings.order_sqrt)
    if text is not None:
        queries = [text] if isinstance(text, str) else list(text)
        q = run.encode_text(queries)
        # (Q, N): images below captions; duplicate candidates scored once, so they tie on every kernel
        scores = scores_of_distinct(cands.images, lambda im: similarity(im, q, measure, sqrt)).t()
        values, indices = _top(scores, top)
        return [[Hit(r + 1, float(v), int(cands.imgids[i]), path=cands.paths[i])
                 for r, (v, i) in enumerate(zip(vs.tolist(), ix.tolist(), strict=True))]
                for vs, ix in zip(values, indices, strict=True)]
    paths = [image] if isinstance(image, str | Path) else list(image)
    q = run.encode_images(paths)
    # (Q, M)
    scores = scores_of_distinct(cands.captions, lambda cap: similarity(q, cap, measure, sqrt).t()).t()
    values, indices = _top(scores, top)
    return [[Hit(r + 1, float(v), int(cands.caption_imgids[i]), text=cands.texts[i])
             for r, (v, i) in enumerate(zip(vs.tolist(), ix.tolist(), strict=True))]
            for vs, ix in zip(values, indices, strict=True)]


def format_hits(query: str, hits: Sequence[Hit]) -> str:
    """A small table of one query's hits (control characters escaped, see
    :func:`vsecore.lines.printable`)."""
    lines = [f"query: {printable(str(query))}"]
    for h in hits:
        what = h.path if h.path is not None else h.text
        lines.append(f"  {h.rank:>3}  {h.score:>9.4f}  imgid {h.imgid:<7} {printable(str(what))}")
    return "\n".join(lines)
