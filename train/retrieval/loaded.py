"""A trained retrieval model read back from a run directory, with what it needs to embed new data:
:class:`LoadedRun` (``encode_text``, ``encode_images``, ``search``), :func:`embed_split` and
:func:`encode_texts` (the evaluation commands use them). :func:`train.retrieval.open.load_run` opens a run
directory or a model folder."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from features.featurize import Featurizer
from features.store.core import FeatureStore
from features.store.read import layout_digest, parse_spec
from prep.dataset import PreparedDataset
from train.config.run import (
    ACCEPT_CHANGED,
    changed_dataset_files,
    features_fingerprint,
    model_sizes,
    read_config,
    rebuild_model,
    settings_from_config,
)
from train.engine.codecs import TextCodec, codec_for
from train.engine.data import CaptionSet, load_caption_set, read_features, read_region_counts
from train.engine.inference import embed_caption_set, embed_codes, embed_images
from train.engine.settings import TrainSection
from train.models.family import model_spec
from train.models.joint import build_model
from train.retrieval.query import search
from train.run.layout import CONFIG, RunDir
from vsecore import console
from vsecore.device import resolve_device
from vsecore.errors import UserError


@dataclass
class Embeddings:
    """Embeddings of a split: caption ``k`` describes image row ``caption_image[k]``."""

    images: torch.Tensor  # (N, d) float32
    captions: torch.Tensor  # (M, d) float32
    caption_image: torch.Tensor  # (M,) int64, row in ``images``
    texts: list[str]
    imgids: np.ndarray  # (N,) int64, the prepared imgid of each image row


@dataclass
class LoadedRun:
    """A trained model read back from a run directory, with what it needs to embed new data."""

    run_dir: Path
    settings: TrainSection
    config: dict[str, Any]
    model: torch.nn.Module
    device: torch.device
    checkpoint: str
    epoch: int
    _dataset: PreparedDataset | None = field(default=None, repr=False)
    _features: tuple[Any, np.ndarray] | None = field(default=None, repr=False)
    _featurizer: Any = field(default=None, repr=False)
    _counts: np.ndarray | None = field(default=None, repr=False)
    #: use the run even when its dataset or features changed since training (a warning, not an error)
    accept_changed: bool = False

    def _changed(self, what: str, names: list[str], where: str) -> None:
        """Refuse (or with :attr:`accept_changed` warn about) inputs that differ from the run's record."""
        if not names:
            return
        text = (f"{self.run_dir}: the run's {what} changed since it was trained: {', '.join(names)} in "
                f"{where} differ from the fingerprints in {CONFIG}")
        if not self.accept_changed:
            raise UserError(f"{text}; train again on it, or add {ACCEPT_CHANGED} to use it anyway")
        console.warning(f"warning: {text} ({ACCEPT_CHANGED}: the results may be meaningless)")

    @property
    def dataset(self) -> PreparedDataset:
        """The prepared dataset the run was trained on (loaded on first use)."""
        if self._dataset is None:
            if not self.settings.data:
                raise UserError(f"{self.run_dir}: the run's config names no prepared dataset")
            self._changed("prepared dataset", changed_dataset_files(self.config, self.settings.data),
                          self.settings.data)
            self._dataset = PreparedDataset.load(self.settings.data)
        return self._dataset

    @property
    def features(self) -> tuple[Any, np.ndarray]:
        """``(x (N, *feature_shape), valid (N,) bool)`` of the run's feature store (read on first use; ``x``
        in the stored dtype, or read a batch at a time when large:
        :func:`train.engine.data.read_features`)."""
        if self._features is None:
            if not self.settings.features:
                raise UserError(f"{self.run_dir}: the run's config names no feature store")
            x, valid = read_features(self.settings.features, self.dataset)
            fingerprints = self.config.get("fingerprints") or {}
            recorded, layout = fingerprints.get("features"), fingerprints.get("features_layout")
            changed = []
            if recorded is not None and features_fingerprint(x, valid) != recorded:
                changed.append("the feature matrix")
            if layout is not None and layout_digest(self.settings.features) != layout:
                changed.append("its data type, shape, chunking or codecs")  # runs since 2026-11 record it
            self._changed("features", changed, self.settings.features)
            self._features = (x, valid)
            self._counts = read_region_counts(self.settings.features)
        return self._features

    @property
    def region_counts(self) -> np.ndarray | None:
        """``(N,)`` real regions per image of a region store with ``counts``, else None."""
        self.features  # noqa: B018 - reads the store once
        return self._counts

    @property
    def codec(self) -> TextCodec:
        """How the run's text encoder reads captions (its family's text input and the run's limits)."""
        return codec_for(self.settings, self.dataset, model_spec(self.settings).text_input)

    def feature_store_config(self) -> dict[str, Any]:
        """The ``config`` attribute of the run's feature store: how its rows were extracted."""
        return dict(FeatureStore(parse_spec(self.settings.features)[0]).attrs.get("config", {}))

    def encode_text(self, texts: list[str]) -> torch.Tensor:
        """Caption embeddings (M, d) of arbitrary texts (see :func:`encode_texts`)."""
        return encode_texts(self, list(texts))

    def encode_images(self, paths: list[str | os.PathLike]) -> torch.Tensor:
        """Image embeddings (N, d) of image files, featurized exactly as the run's feature store.

        An image that cannot be read is a :class:`UserError` naming it.
        """
        if self._featurizer is None:
            self._featurizer = Featurizer.from_store(self.settings.features, str(self.device))
        rows, failures = self._featurizer(list(paths))
        if failures:
            raise UserError(f"{failures[0]['path']}: cannot use this image: {failures[0]['reason']}")
        return embed_images(self.model, torch.from_numpy(rows), self.device, amp=self.settings.amp)

    def search(self, text: str | list[str] | None = None, image: str | list[str] | None = None, top: int = 5,
               split: str | None = "test", data: str | os.PathLike | None = None,
               features: str | None = None) -> list:
        """Ranked images for text queries or captions for image queries
        (:func:`train.retrieval.query.search`);
        ``data`` and ``features`` search another prepared dataset's images with its feature store."""
        return search(self, text=text, image=image, top=top, split=split, data=data, features=features)

    def embed(self, split: str, texts: list[str] | None = None, lang: str | None = None) -> Embeddings:
        """The embeddings of ``split`` (:func:`embed_split`)."""
        return embed_split(self, split, texts, lang)

    def caption_set(self, split: str, lang: str | None = None) -> CaptionSet:
        """The whole ``split`` in ``lang`` (default: the run's), all its images (not the val subset)."""
        x, valid = self.features
        return load_caption_set(self.dataset, x, valid, split, lang or self.settings.lang,
                                self.settings.max_chars,
                                codec=self.codec, counts=self.region_counts)


def load_run_directory(run_dir: str | os.PathLike, checkpoint: str = "best", device: str = "auto"
                       ) -> LoadedRun:
    """Rebuild the model of ``run_dir`` from ``checkpoints/<checkpoint>.pt`` (``best`` or ``last``).

    The run's dataset and features are checked against the fingerprints of its ``config.json`` when
    first read: a change is a :class:`UserError` naming it, or a warning once ``accept_changed`` is set
    on the returned run.

    A run directory of a retrieval family only: :func:`train.retrieval.open.load_run` also opens model
    folders, :func:`train.classification.run.load_classification_run` classification runs.
    """
    run_dir = Path(run_dir)
    path = RunDir(run_dir).checkpoint(checkpoint)
    config = read_config(run_dir)
    settings = settings_from_config(config["settings"])
    dev = resolve_device(device)
    model, epoch = rebuild_model(lambda: build_model(settings, *model_sizes(config)), path, config, dev)
    return LoadedRun(run_dir=run_dir, settings=settings, config=config, model=model, device=dev,
                     checkpoint=checkpoint, epoch=epoch)


def embed_split(run: LoadedRun, split: str, texts: list[str] | None = None, lang: str | None = None
                ) -> Embeddings:
    """Embed the images and captions of ``split`` in ``lang`` (default: the run's) with the run's model.

    ``texts``, when given, replace the split's captions one for one (same count and order as
    ``embed_split(run, split).texts``), e.g. with characters replaced for the noise analysis.
    """
    cs = run.caption_set(split, lang)
    if texts is None:
        images, captions = embed_caption_set(run.model, cs, run.device, amp=run.settings.amp)
        texts_out = cs.texts
    else:
        if len(texts) != len(cs):
            raise UserError(f"{len(texts)} texts given for split '{split}', which has {len(cs)} captions")
        images, _ = embed_caption_set(run.model, _no_captions(cs), run.device, amp=run.settings.amp)
        captions = encode_texts(run, texts)
        texts_out = list(texts)
    return Embeddings(images=images, captions=captions, caption_image=torch.from_numpy(cs.caption_image),
                      texts=texts_out, imgids=cs.imgids)


def _no_captions(cs: CaptionSet) -> CaptionSet:
    return CaptionSet(split=cs.split, lang=cs.lang, images=cs.images, imgids=cs.imgids, codes=cs.codes[:0],
                      offsets=cs.offsets[:1], caption_image=cs.caption_image[:0], texts=[],
                      skipped_images=cs.skipped_images, codec=cs.codec)


def encode_texts(run: LoadedRun, texts: list[str]) -> torch.Tensor:
    """Embed arbitrary texts with the run's text encoder: (M, d) float32 on the CPU.

    Texts are encoded as the run's captions were (characters, or words tokenized as ``prep`` does).
    """
    codec = run.codec
    return embed_codes(run.model, codec.encode_texts(texts), codec, run.device, amp=run.settings.amp)
