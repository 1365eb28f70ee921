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
network, weights, crops and sizes). Scores are the run's own similarity (cosine or order violation);
equal scores are ordered by candidate index, so results are deterministic.

Only the side a query ranks is embedded (a text query: the images; an image query: the captions), once:
it is kept in a cache file keyed by the model's weights, the feature store, the dataset and the split
(:mod:`train.retrieval.query_cache`), so a later query, in this process or another, embeds only itself.
An image hit carries its file and its first captions, a caption hit its text and its image's file.
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
from features.store.spec import FeatureSpec
from prep.dataset import SPLITS, PreparedDataset
from train.config.run import model_sizes
from train.engine.caption_cache import codec_identity
from train.engine.codecs import TextCodec
from train.engine.data import CaptionSet, ImageRows, read_features
from train.engine.inference import embed_codes, embed_images
from train.engine.settings import TrainSection
from train.engine.similarity import similarity
from train.retrieval.evaluate.layout import scores_of_distinct
from train.retrieval.query_cache import (
    CAPTIONS,
    IMAGES,
    Side,
    cached_side,
    model_digest,
    side_key,
    store_identity,
)
from vsecore.errors import UserError
from vsecore.lines import printable

#: the captions an image hit shows
HIT_CAPTIONS = 2


class SearchableRun(Protocol):
    """What a search reads of a run: :class:`train.retrieval.loaded.LoadedRun` has it, and offers
    :func:`search` as its ``search`` method. A protocol, so this module needs no import of that class."""

    run_dir: Path
    settings: TrainSection
    config: dict[str, Any]
    model: torch.nn.Module
    device: torch.device
    checkpoint: str
    accept_changed: bool

    @property
    def dataset(self) -> PreparedDataset: ...

    @property
    def codec(self) -> TextCodec: ...

    def feature_store_config(self) -> dict[str, Any]: ...

    def encode_text(self, texts: list[str]) -> torch.Tensor: ...

    def encode_images(self, paths: list[str | os.PathLike]) -> torch.Tensor: ...

    def caption_set(self, split: str, lang: str | None = None) -> CaptionSet: ...


@dataclass(frozen=True)
class Hit:
    """One retrieved candidate: its 1-based rank, score, and what it is."""

    rank: int
    score: float
    imgid: int  # prepared imgid of the image (image hits) or of the caption's image (caption hits)
    path: str | None = None  # the image file (of a caption hit: its image's)
    text: str | None = None  # caption hits: the caption
    captions: tuple[str, ...] = ()  # image hits: the image's first captions in the run's language


@dataclass
class Candidates:
    """One side of the candidates, embedded, with what its hits show: ``embeddings`` (K, d), ``imgids``
    (K,) (the image, or the caption's image), ``texts`` (captions only) and the ``dataset`` they are from."""

    embeddings: torch.Tensor
    imgids: np.ndarray
    texts: list[str] | None
    dataset: PreparedDataset


def _candidates_of(dataset: PreparedDataset, side: Side, kind: str) -> Candidates:
    """The :class:`Candidates` of an embedded ``side`` of ``dataset``."""
    if kind == IMAGES:
        return Candidates(side.embeddings, side.rows, None, dataset)
    rows = dataset.rows
    return Candidates(side.embeddings, rows.sentence_image[side.rows], [rows.raws[int(k)] for k in side.rows],
                      dataset)


def _model_sha256(run: SearchableRun) -> str:
    """:func:`train.retrieval.query_cache.model_digest` of the run's model, once per run object."""
    memo = run.__dict__.setdefault("_query_model_sha256", {})
    if id(run.model) not in memo:
        memo.clear()
        memo[id(run.model)] = model_digest(run.model)
    return memo[id(run.model)]


def _text_identity(run: SearchableRun, kind: str) -> dict[str, Any] | None:
    """What the captions side also depends on: the language and the text codec (None for images)."""
    return None if kind == IMAGES else {"lang": run.settings.lang, "codec": codec_identity(run.codec)}


def sentence_rows(dataset: PreparedDataset, split: str | None, lang: str, imgids: np.ndarray,
                  texts: Sequence[str] | None = None) -> np.ndarray:
    """(M,) int64: the sentence rows of ``dataset`` of the captions in ``lang`` of the images ``imgids`` of
    ``split``, by image, then as the image lists them (the order of a split's :class:`CaptionSet`; with
    ``texts``, checked against its texts)."""
    rows = dataset.rows
    chosen = np.asarray(rows.sentence_rows(split, {lang}), dtype=np.int64)
    kept = chosen[np.isin(rows.sentence_image[chosen], imgids)]
    if texts is not None and [rows.raws[int(k)] for k in kept] != list(texts):
        raise RuntimeError(f"{dataset.root}: the captions of split {split} are not in the order of its "
                           "caption set")
    return kept


def _place(run: SearchableRun, dataset: PreparedDataset, features: str | None, split: str | None,
           side: str) -> dict[str, Any]:
    """Where a side's cache file belongs (:func:`train.retrieval.query_cache.cache_file`): the model's folder
    and checkpoint, the dataset, the store, the split, the side and the language."""
    spec = FeatureSpec.parse(features) if features else None
    return {"model": str(Path(run.run_dir).resolve()), "checkpoint": run.checkpoint,
            "data": str(dataset.root), "features": None if spec is None else str(spec.store.resolve()),
            "key": None if spec is None else spec.key, "split": split, "side": side,
            "lang": run.settings.lang}


def _split_side(run: SearchableRun, split: str, kind: str) -> Side:
    """One side of ``split`` of the run's dataset, embedded as :func:`train.retrieval.loaded.embed_split`
    embeds it (the same rows, batches and calls: the same floats)."""
    cs = run.caption_set(split)
    amp = run.settings.amp
    if kind == IMAGES:
        return Side(embed_images(run.model, cs.images, run.device, amp=amp), cs.imgids)
    codes = [cs.caption_codes(k) for k in range(len(cs))]
    return Side(embed_codes(run.model, codes, cs.codec, run.device, amp=amp),
                sentence_rows(run.dataset, split, run.settings.lang, cs.imgids, cs.texts))


def _joined(parts: list[Side]) -> Side:
    return parts[0] if len(parts) == 1 else Side(torch.cat([p.embeddings for p in parts]),
                                                 np.concatenate([p.rows for p in parts]))


def candidates(run: SearchableRun, split: str | None = "test", side: str = IMAGES) -> Candidates:
    """The images (``side=IMAGES``, what a text query ranks) or captions (``CAPTIONS``) of ``split`` of
    the run's dataset, embedded once per run object and read from the query cache after the first time
    (:func:`train.retrieval.query_cache.cached_side`)."""
    memo = run.__dict__.setdefault("_candidates", {})
    if (split, side) in memo:
        return memo[split, side]
    dataset = run.dataset
    splits = [split] if split is not None else [s for s in SPLITS if dataset.split_mask(s).any()]
    features = run.settings.features
    place = _place(run, dataset, features, split, side)
    key = side_key(_model_sha256(run), store_identity(features) if features else {}, dataset.dataset_sha256,
                   split, side, _text_identity(run, side), run.settings, run.device)
    most = len(dataset.images) if side == IMAGES else len(dataset.sentences)
    # a run used with changed inputs (--accept-changed-inputs) is embedded, never kept
    embedded = cached_side(place, key, most, lambda: _joined([_split_side(run, s, side) for s in splits]),
                           write=not run.accept_changed)
    memo[split, side] = _candidates_of(dataset, embedded, side)
    return memo[split, side]


def _store_rows(run: SearchableRun, dataset: PreparedDataset, features: str, split: str | None
                ) -> tuple[Any, np.ndarray]:
    """``(x (N_all, *feature_shape), rows (R,))``: the store's features and the rows of ``split`` with valid
    features, after checking the store was extracted as the run's (see :func:`store_candidates`)."""
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
    x, valid = read_features(features, dataset)  # refuses a store made for other images
    width = model_sizes(run.config)[1]
    if [*x.shape[1:]] != width:
        raise UserError(f"{features}: rows of shape {[*x.shape[1:]]}, but the run {run.run_dir} reads rows "
                        f"of shape {width} (feature_shape); give the store extracted with the run's settings")
    rows = np.array([i for i in dataset.image_rows(split) if valid[i]], dtype=np.int64)
    if not len(rows):
        where = f" in split {split}" if split else ""
        raise UserError(f"{dataset.root}: no images with valid features{where}")
    return x, rows


def _store_side(run: SearchableRun, dataset: PreparedDataset, features: str, split: str | None, kind: str
                ) -> Side:
    """One side of ``split`` of another collection, embedded from its feature store (images, in blocks from
    the store's own dtype) or its captions."""
    x, rows = _store_rows(run, dataset, features, split)
    if kind == CAPTIONS:
        sentences = sentence_rows(dataset, split, run.settings.lang, rows)
        return Side(run.encode_text([dataset.rows.raws[int(k)] for k in sentences]), sentences)
    tensor = x if not isinstance(x, np.ndarray) else torch.from_numpy(np.ascontiguousarray(x))
    return Side(embed_images(run.model, ImageRows(tensor, rows), run.device, amp=run.settings.amp), rows)


def store_candidates(run: SearchableRun, data: str | Path, features: str, split: str | None = None,
                     side: str = IMAGES) -> Candidates:
    """The images (or captions) of another prepared dataset, embedded once per run object and collection
    and read from the query cache after the first time.

    Args:
        run: a loaded run.
        data: a prepared dataset folder (e.g. one's own images, ``prep karpathy``).
        features: its feature store ``STORE[:KEY]``, extracted with the run's store's settings.
        split: only the images of this split (``None``: every image with valid features).
        side: ``IMAGES`` or ``CAPTIONS`` (the captions of those images in the run's language).

    Raises:
        UserError: the store was made for other images, with other extractor settings than the
            run's store, or is a Full-Network Embedding (standardised with its own train statistics,
            so its rows are not comparable with the run's); no captions in the run's language.
    """
    memo = run.__dict__.setdefault("_store_candidates", {})
    mkey = (str(Path(data).resolve()), features, split, side)
    if mkey in memo:
        return memo[mkey]
    dataset = PreparedDataset.load(data)
    lang = run.settings.lang
    if side == CAPTIONS and (lang not in dataset.languages or not dataset.captions(split, lang)[0]):
        raise UserError(f"{data}: no captions in the run's language ({lang}) to rank")
    place = _place(run, dataset, features, split, side)
    key = side_key(_model_sha256(run), store_identity(features), dataset.dataset_sha256, split, side,
                   _text_identity(run, side), run.settings, run.device)
    most = len(dataset.images) if side == IMAGES else len(dataset.sentences)
    embedded = cached_side(place, key, most, lambda: _store_side(run, dataset, features, split, side))
    memo[mkey] = _candidates_of(dataset, embedded, side)
    return memo[mkey]


def _top(scores: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``scores (Q, K)``: the ``top`` best ``(values, indices)``, ties by lower index."""
    values, indices = torch.sort(scores, dim=1, descending=True, stable=True)
    return values[:, :top], indices[:, :top]


def image_captions(dataset: PreparedDataset, imgid: int, lang: str, most: int = HIT_CAPTIONS
                   ) -> tuple[str, ...]:
    """The first ``most`` captions in ``lang`` of image ``imgid``, as ``dataset.json`` lists them."""
    rows = dataset.rows
    found: list[str] = []
    for k in range(int(rows.starts[imgid]), int(rows.starts[imgid + 1])):
        if len(found) == most:
            break
        if rows.langs[k] == lang:
            found.append(rows.raws[k])
    return tuple(found)


def _hits(cands: Candidates, values: torch.Tensor, indices: torch.Tensor, lang: str) -> list[list[Hit]]:
    """Each query's hits from its ``top`` ``(values, indices)`` (Q, top) into the candidates."""
    out = []
    for vs, ix in zip(values.tolist(), indices.tolist(), strict=True):
        hits = []
        for r, (v, i) in enumerate(zip(vs, ix, strict=True)):
            imgid = int(cands.imgids[i])
            path = str(cands.dataset.images[imgid].path)
            if cands.texts is None:
                hits.append(Hit(r + 1, float(v), imgid, path=path,
                                captions=image_captions(cands.dataset, imgid, lang)))
            else:
                hits.append(Hit(r + 1, float(v), imgid, path=path, text=cands.texts[i]))
        out.append(hits)
    return out


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
        One list of :class:`Hit` per query, best first: an image hit with its file and first captions, a
        caption hit with its text and its image's file.
    """
    if (text is None) == (image is None):
        raise UserError("give either text queries or image queries")
    if top < 1:
        raise UserError(f"--top must be at least 1, got {top}")
    if (data is None) != (features is None):
        raise UserError("give both --data and --features to search another collection")
    side = IMAGES if text is not None else CAPTIONS
    cands = (candidates(run, split, side) if data is None
             else store_candidates(run, data, str(features), split, side))
    if side == CAPTIONS and not len(cands.imgids):
        raise UserError(f"{data or run.settings.data}: no captions in the run's language "
                        f"({run.settings.lang}) to rank")
    measure, sqrt = run.settings.measure, bool(run.settings.order_sqrt)
    if text is not None:
        q = run.encode_text([text] if isinstance(text, str) else list(text))
        # (Q, N): images below captions; duplicate candidates scored once, so they tie on every kernel
        scores = scores_of_distinct(cands.embeddings, lambda im: similarity(im, q, measure, sqrt)).t()
    else:
        q = run.encode_images([image] if isinstance(image, str | Path) else list(image))
        # (Q, M)
        scores = scores_of_distinct(cands.embeddings, lambda cap: similarity(q, cap, measure, sqrt).t()).t()
    values, indices = _top(scores, top)
    return _hits(cands, values, indices, run.settings.lang)


def format_hits(query: str, hits: Sequence[Hit]) -> str:
    """A small table of one query's hits: an image hit's file, then its captions; a caption hit's text,
    then its image's file (control characters escaped, see :func:`vsecore.lines.printable`)."""
    lines = [f"query: {printable(str(query))}"]
    for h in hits:
        head = f"  {h.rank:>3}  {h.score:>9.4f}  imgid {h.imgid:<7} "
        lines.append(head + printable(str(h.text if h.text is not None else h.path)))
        indent = " " * len(head)
        if h.text is not None and h.path is not None:
            lines.append(f"{indent}image: {printable(h.path)}")
        lines += [f"{indent}- {printable(c)}" for c in h.captions]
    return "\n".join(lines)
