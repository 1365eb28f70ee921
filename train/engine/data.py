"""The caption data pipeline: prepared captions and stored image features -> training batches.

A split is loaded once into a :class:`CaptionSet`: the image features of its usable images (rows
of the feature store whose ``valid`` flag is set; the others are skipped and counted), every
caption of the chosen language encoded by the family's :class:`TextCodec` (character indices of
the prepared ``chars.json``, word indices of ``words.json``, or words spelled in characters;
unknown symbols -> ``<unk>`` = 1), and ``caption_image``, the row of each caption's image.
Captions are encoded once per prepared dataset and codec and read back from a cache beside the dataset
(:mod:`train.engine.caption_cache`), and kept as one flat array plus offsets, so COCO's 600k captions cost
a few tens of megabytes instead of 600k Python lists; image features stay in the store's dtype, in one array
shared by the splits (:class:`ImageRows`). Features larger than :func:`feature_memory_limit` (Karpathy
COCO's grid regions: 15.5 GB) are not read at all: :class:`features.store.rows.StoreRows` reads each batch's
rows from the store, with the same checks and bit-identical batches (``docs/scale.md``).

An epoch is a fixed list of batches drawn up front from a seeded :class:`torch.Generator`
(:func:`epoch_batches`): that list, plus the index of the next batch, is all a mid-epoch
checkpoint needs to continue exactly where a killed run stopped.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from features.store.core import FeatureStore
from features.store.read import parse_spec, read_matrix, stored_region_counts
from features.store.rows import open_rows, stored_bytes
from features.store.spec import FeatureSpec
from prep.dataset import PAD_INDEX, PreparedDataset
from train.engine.caption_cache import split_captions
from train.engine.codecs import TextCodec, text_codec
from train.engine.compiled import padded_length
from vsecore.errors import UserError

if TYPE_CHECKING:
    from features.store.rows import StoreRows

#: features up to this many bytes (in their stored dtype) are read into memory whole, larger ones a batch
#: at a time from the store; ``VSE_FEATURE_MEMORY_MB`` overrides it (results are the same either way)
FEATURE_MEMORY_BYTES = 4 * 2**30


class PairBatch(NamedTuple):
    """A batch of aligned sentence pairs (cross-language loss): row ``i`` of ``text`` and of ``other_text``
    say the same thing in the run's ``lang`` and in ``other_lang``."""

    text: torch.Tensor  # (P, T) or (P, T, C) int64, the ``lang`` side
    lengths: torch.Tensor  # (P,) int64
    other_text: torch.Tensor  # (P, T', ...) int64, the ``other_lang`` side
    other_lengths: torch.Tensor  # (P,) int64
    other_lang: str


class Batch(NamedTuple):
    """One training or embedding batch; ``T`` is the longest caption of the batch."""

    #: (B, *feature_shape) in the features' stored dtype (float32 CNN features, int8 FNE, float16 regions):
    #: :func:`train.engine.inference.batch_to` converts it to float32 on the device it moves it to, so a
    #: loader ships (and pins) the stored bytes, half or a quarter of float32's, and a GPU converts them
    image_features: torch.Tensor
    text: torch.Tensor  # (B, T) or (B, T, C) int64, padded with 0 (see train.models.registry.TEXT_INPUTS)
    lengths: torch.Tensor  # (B,) int64, >= 1 (characters or words)
    image_index: torch.Tensor  # (B,) int64, row of the caption's image in the CaptionSet
    #: (B,) int64 real regions of each image (region features with a ``counts`` array), else None
    image_counts: torch.Tensor | None = None
    #: one batch of aligned pairs per cross-language (``--cross-lang``), else empty
    pairs: tuple[PairBatch, ...] = ()


def feature_spec(features: str, regions: bool = False) -> str:
    """Check that ``STORE[:key]`` names features the model can read; returns it unchanged.

    The key is ``global`` or ``fne`` (or ``fne_raw``) for models with a linear image side, and
    ``regions`` for region models (``regions=True``, which need the key); a bare store path lets the
    reader pick for the others.
    """
    named_regions = FeatureSpec.parse(features).is_regions
    if regions and not named_regions:
        raise UserError(f"{features}: this family reads region features ('STORE:regions')")
    if not regions and named_regions:
        raise UserError(f"{features}: region features need the clmr/liwe families, not a model with a "
                        "linear image side (use ':global' or ':fne')")
    return features


class ImageRows:
    """The image features of a split: rows ``rows`` of one feature array shared by every split.

    The array keeps its stored dtype (float32 CNN features, int8 ternary FNE, float16 regions):
    rows are gathered per batch (:meth:`gather`, in that dtype) and converted to float32 where they are used
    (indexing converts on the spot; a training :class:`Batch` on its device), so an int8 FNE is never
    expanded to a dense float32 copy and the train and val splits share one array.

    Args:
        features: (N_all, *feature_shape) tensor, any real dtype, in the prepared dataset's imgid order, or
            the store's rows read on demand (:class:`features.store.rows.StoreRows`, same values).
        rows: (N,) int64, the feature row (imgid) of each image of the split.
        counts: (N_all,) int64 real regions per image of region features (rows after them are padding),
            or None (every region real, or not region features).
    """

    def __init__(self, features: torch.Tensor | StoreRows, rows: np.ndarray,
                 counts: torch.Tensor | None = None) -> None:
        self.features = features
        self.rows = np.asarray(rows, dtype=np.int64)
        self.counts = counts

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def shape(self) -> tuple[int, ...]:
        """``(N, *feature_shape)``."""
        return (len(self.rows), *self.features.shape[1:])

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one image's features: ``(C,)`` or ``(k, D)``."""
        return tuple(self.features.shape[1:])

    def __getitem__(self, index: int | slice | np.ndarray | torch.Tensor) -> torch.Tensor:
        """Rows ``index`` of the split as float32 ``(B, *feature_shape)`` (one row for an int index)."""
        return self.gather(index).float()

    def gather(self, index: int | slice | np.ndarray | torch.Tensor) -> torch.Tensor:
        """Rows ``index`` of the split in the stored dtype: ``(B, *feature_shape)`` (one row for an int
        index). Converting to float32 is exact from every stored dtype (float32, float16, int8)."""
        if isinstance(index, torch.Tensor):
            index = index.cpu().numpy()
        rows = np.atleast_1d(self.rows[index])
        gathered = (self.features[torch.from_numpy(rows)] if isinstance(self.features, torch.Tensor)
                    else torch.from_numpy(self.features.take(rows)))
        return gathered.reshape(
            (-1, *self.feature_shape) if not isinstance(index, int | np.integer) else self.feature_shape)

    def numpy(self) -> np.ndarray:
        """All rows as a float32 array ``(N, *feature_shape)`` (a copy: for small splits and tests)."""
        return self[:].numpy()

    def counts_of(self, index: slice | np.ndarray | torch.Tensor) -> torch.Tensor | None:
        """Real regions ``(B,)`` int64 of rows ``index`` of the split, or None without counts."""
        if self.counts is None:
            return None
        if isinstance(index, torch.Tensor):
            index = index.cpu().numpy()
        return self.counts[torch.from_numpy(np.atleast_1d(self.rows[index]))]


@dataclass
class CaptionSet:
    """The captions of one split and language, with the features of the images they describe."""

    split: str
    lang: str
    images: ImageRows  # (N, *feature_shape), usable images of the split in imgid order
    imgids: np.ndarray  # (N,) int64, the prepared imgid (feature row) of each image
    codes: np.ndarray  # (sum of lengths * width,) int16/int32, every caption's codes end to end
    offsets: np.ndarray  # (M + 1,) int64, caption k is codes[offsets[k]:offsets[k + 1]]
    caption_image: np.ndarray  # (M,) int64, row in ``images`` of each caption's image
    texts: list[str]
    skipped_images: int  # images of the split whose features are invalid
    codec: TextCodec

    def __len__(self) -> int:
        return len(self.caption_image)

    @property
    def num_images(self) -> int:
        """Number of usable images N."""
        return len(self.images)

    def caption_codes(self, k: int) -> np.ndarray:
        """Codes of caption ``k``: ``(L,)``, or ``(L, word_length)`` for ``word_chars``."""
        flat = self.codes[self.offsets[k]: self.offsets[k + 1]]
        width = self.codec.item_width
        return flat if width == 1 else flat.reshape(-1, width)

    def batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """The batch of captions ``indices`` (M-indices) with their images' features."""
        idx = np.asarray(indices, dtype=np.int64)
        tokens, lengths = self.codec.collate([self.caption_codes(int(k)) for k in idx])
        image_index = torch.from_numpy(self.caption_image[idx])
        counts = self.images.counts_of(image_index)
        return Batch(self.images.gather(image_index), tokens, lengths, image_index, counts)


def feature_memory_limit() -> int:
    """Bytes of features :func:`read_features` reads whole: :data:`FEATURE_MEMORY_BYTES`, or
    ``VSE_FEATURE_MEMORY_MB`` MiB when that is set."""
    value = os.environ.get("VSE_FEATURE_MEMORY_MB")
    if value is None:
        return FEATURE_MEMORY_BYTES
    try:
        return int(float(value) * 2**20)
    except ValueError:
        raise UserError(f"VSE_FEATURE_MEMORY_MB={value!r}: expected a number of MiB") from None


def read_features(features: str, dataset: PreparedDataset | None = None
                  ) -> tuple[np.ndarray | StoreRows, np.ndarray]:
    """``STORE[:key]`` in its stored dtype: ``(x (N, *feature_shape), valid (N,) bool)``.

    ``features.store.read.read_matrix`` with ``keep_dtype``: an int8 FNE stays int8 (converted per batch
    by :class:`ImageRows`). An array larger than :func:`feature_memory_limit` (its size in the store's
    metadata decides, never its values) is a :class:`features.store.rows.StoreRows` instead, read a batch at
    a time. With ``dataset``, a store made for other images is refused; a valid row that is not finite
    is refused (read whole: up front; on demand: when the row is read).
    """
    # the feature stage is imported only when features are read
    if stored_bytes(features) > feature_memory_limit():
        return open_rows(features, dataset)
    x, valid = read_matrix(features, dataset, keep_dtype=True)
    return np.asarray(x), np.asarray(valid, dtype=bool)


def read_region_counts(features: str) -> np.ndarray | None:
    """Real regions per image ``(N,)`` int64 of a ``STORE:regions`` spec: the store's ``counts`` array,
    or None when it has none (then every one of the ``k`` regions is real) or the spec is not regions."""
    path, key = parse_spec(features)
    if key != "regions":
        return None
    store = FeatureStore(path)
    counts = stored_region_counts(store, np.asarray(store.array("valid")[:], dtype=bool))
    # rows of failed images are never read; keep them sane (at least one region)
    return None if counts is None else np.maximum(counts, 1)


def _check_languages(dataset: PreparedDataset, langs: Sequence[str]) -> None:
    """A :class:`UserError` for a language the dataset has no captions in."""
    for one in langs:
        if one not in dataset.languages:
            raise UserError(f"{dataset.root}: no captions in language '{one}' "
                            f"(this dataset has {', '.join(dataset.languages)})")


def load_caption_set(dataset: PreparedDataset, x: np.ndarray | torch.Tensor | StoreRows, valid: np.ndarray,
                     split: str, lang: str | Sequence[str], max_chars: int, max_images: int | None = None,
                     codec: TextCodec | None = None, counts: np.ndarray | None = None) -> CaptionSet:
    """Build the :class:`CaptionSet` of ``split`` in ``lang``.

    Args:
        dataset: the prepared dataset.
        x: (N_all, *feature_shape) features in ``imgid`` order (kept in their dtype, not copied; or
            read on demand, :func:`read_features`);
            ``valid``: (N_all,) usable rows.
        split: ``train``, ``val`` or ``test``; ``lang``: caption language, or several (``--langs``
            of clmr/liwe: an image's captions in every one of them, grouped by language;
            ``CaptionSet.lang`` then joins them with ``+``).
        max_chars: captions are truncated to this many characters (the default ``chars`` codec).
        max_images: keep only the first images of the split (validation on a subset).
        codec: how captions become tokens (default: characters of the prepared alphabet).
        counts: (N_all,) real regions per image of region features (:func:`read_region_counts`).

    Images without a caption in ``lang`` are left out (they cannot be retrieved by text);
    images with invalid features are left out and counted in ``skipped_images``.
    """
    langs = [lang] if isinstance(lang, str) else list(lang)
    codec = codec or text_codec(dataset, "chars", max_chars, langs[0])
    if x.shape[0] != len(dataset.images):
        raise UserError(f"feature store has {x.shape[0]} rows but {dataset.root} has {len(dataset.images)} "
                        "images: the store was extracted from another dataset")
    _check_languages(dataset, langs)
    every = split_captions(dataset, split, langs, codec)
    considered = len(every.image_rows) if max_images is None else min(max_images, len(every.image_rows))
    keep = np.zeros(len(every.image_rows), dtype=bool)
    keep[:considered] = np.asarray(valid, dtype=bool)[every.image_rows[:considered]]
    captions = every.select(keep)
    skipped = considered - len(captions.image_rows)
    if not len(captions):
        raise UserError(f"{dataset.root}: split '{split}' has no usable {'+'.join(langs)} captions "
                        f"({skipped} images skipped for invalid features)")
    features = x if not isinstance(x, np.ndarray) else torch.from_numpy(np.ascontiguousarray(x))
    region_counts = None if counts is None else torch.as_tensor(np.asarray(counts, dtype=np.int64))
    imgids = captions.image_rows
    return CaptionSet(split=split, lang="+".join(langs), images=ImageRows(features, imgids, region_counts),
                      imgids=imgids, codes=captions.codes, offsets=captions.offsets,
                      caption_image=np.repeat(np.arange(len(imgids), dtype=np.int64), captions.per_image),
                      texts=captions.texts, skipped_images=skipped, codec=codec)


def epoch_batches(captions: CaptionSet, batch_size: int, mode: str, generator: torch.Generator
                  ) -> list[np.ndarray]:
    """The batches of one epoch, as arrays of caption indices, drawn from ``generator``.

    ``mode="all"``: every caption once, in a random order (CHAIN-VSE, OECC). ``mode="one"``: one
    random caption of each image, images in a random order (the FNE paper's epochs). Two
    captions of one image may share an "all" batch, as in the released VSE code: at COCO scale
    it happens in a few batches per epoch and only adds a weak false negative.
    """
    if mode == "all":
        order = torch.randperm(len(captions), generator=generator).numpy()
    elif mode == "one":
        starts = np.searchsorted(captions.caption_image, np.arange(captions.num_images), side="left")
        counts = np.bincount(captions.caption_image, minlength=captions.num_images)
        pick = (torch.rand(captions.num_images, generator=generator, dtype=torch.float64).numpy()
                * counts).astype(np.int64)
        chosen = starts + np.minimum(pick, counts - 1)
        order = chosen[torch.randperm(captions.num_images, generator=generator).numpy()]
    else:
        raise ValueError(f"unknown captions_per_epoch {mode!r} (expected 'all' or 'one')")
    return [order[i: i + batch_size] for i in range(0, len(order), batch_size)]


@dataclass
class PairSet:
    """Aligned sentence pairs of one split between ``lang`` and ``other_lang`` (the dataset's ``pairs``:
    Multi30k task1 translations, YJ en/ja, the synthetic templates), encoded by the run's codec."""

    lang: str
    other_lang: str
    codes: list[np.ndarray]  # P codes of the ``lang`` sides
    other_codes: list[np.ndarray]  # P codes of the ``other_lang`` sides
    codec: TextCodec

    def __len__(self) -> int:
        return len(self.codes)

    def batch(self, indices: Sequence[int] | np.ndarray) -> PairBatch:
        """The pairs ``indices``, both sides collated."""
        idx = [int(k) for k in indices]
        text, lengths = self.codec.collate([self.codes[k] for k in idx])
        other, other_lengths = self.codec.collate([self.other_codes[k] for k in idx])
        return PairBatch(text, lengths, other, other_lengths, self.other_lang)


def load_pair_set(dataset: PreparedDataset, split: str, lang: str, other_lang: str, codec: TextCodec
                  ) -> PairSet:
    """The :class:`PairSet` of ``split`` between ``lang`` and ``other_lang`` (a :class:`UserError` when the
    dataset has no such pairs)."""
    a, b = [], []
    for pair in dataset.pairs_of(split):
        if lang in pair.sides and other_lang in pair.sides:
            one, other = pair.sides[lang], pair.sides[other_lang]
            a.append(codec.encode(one.raw, one.tokens))
            b.append(codec.encode(other.raw, other.tokens))
    if not a:
        raise UserError(f"{dataset.root}: no {lang}-{other_lang} pairs in split '{split}' for the "
                        "cross-language loss (the dataset's 'pairs')")
    return PairSet(lang, other_lang, a, b, codec)


def epoch_pair_batches(pairs: PairSet, n_batches: int, batch_size: int, generator: torch.Generator
                       ) -> list[np.ndarray]:
    """``n_batches`` batches of ``batch_size`` pair indices (fewer when the set is smaller), one per caption
    batch of the epoch, drawn from ``generator``: random orders of the pairs, one after the other."""
    size = min(batch_size, len(pairs))
    need = n_batches * size
    orders: list[np.ndarray] = []
    while sum(len(o) for o in orders) < need:
        orders.append(torch.randperm(len(pairs), generator=generator).numpy())
    flat = np.concatenate(orders) if orders else np.zeros(0, dtype=np.int64)
    return [flat[i * size:(i + 1) * size] for i in range(n_batches)]


class BatchList(torch.utils.data.Dataset):
    """A fixed list of batches as a map-style dataset, so a DataLoader's workers can collate them.

    ``pairs``: for the cross-language loss, each :class:`PairSet` with its list of pair batches (one per
    caption batch), attached to the batches as :attr:`Batch.pairs`.
    """

    def __init__(self, captions: CaptionSet, batches: Sequence[np.ndarray],
                 pairs: Sequence[tuple[PairSet, Sequence[np.ndarray]]] = (), pad_limit: int | None = None
                 ) -> None:
        self.captions = captions
        self.batches = list(batches)
        self.pairs = [(pair_set, list(pb)) for pair_set, pb in pairs]
        self.pad_limit = pad_limit

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Batch:
        batch = self.captions.batch(self.batches[i])
        if self.pairs:
            batch = batch._replace(pairs=tuple(pair_set.batch(pb[i]) for pair_set, pb in self.pairs))
        return batch if self.pad_limit is None else padded_batch(batch, self.pad_limit)


def _pad_text(text: torch.Tensor, limit: int) -> torch.Tensor:
    """``text (B, T[, C])`` padded with ``<pad>`` to :func:`train.engine.compiled.padded_length` of T."""
    length = padded_length(text.shape[1], limit)
    if length == text.shape[1]:
        return text
    out = text.new_full((text.shape[0], length, *text.shape[2:]), PAD_INDEX)
    out[:, : text.shape[1]] = text
    return out


def padded_batch(batch: Batch, limit: int) -> Batch:
    """``batch`` with its captions (and those of its pair batches) padded to one of a few lengths
    (:func:`train.engine.compiled.padded_length`, at most ``limit``), for a step fixed to its shapes
    (``--compile``, ``--cuda-graphs``); lengths unchanged, so an encoder computes the same."""
    pairs = tuple(p._replace(text=_pad_text(p.text, limit), other_text=_pad_text(p.other_text, limit))
                  for p in batch.pairs)
    return batch._replace(text=_pad_text(batch.text, limit), pairs=pairs)


def batch_loader(captions: CaptionSet, batches: Sequence[np.ndarray], workers: int = 0,
                 pin_memory: bool = False, pairs: Sequence[tuple[PairSet, Sequence[np.ndarray]]] = (),
                 pad_limit: int | None = None) -> torch.utils.data.DataLoader:
    """Iterate ``batches`` in order (collated, in ``workers`` processes when > 0), with their pair batches;
    ``pad_limit``: captions padded to a few lengths up to it (:func:`padded_batch`)."""
    # its own generator: a DataLoader draws a worker base seed on every iteration, and drawing it
    # from the global generator would make a resumed epoch's random stream differ
    return torch.utils.data.DataLoader(BatchList(captions, batches, pairs, pad_limit), batch_size=None,
                                       shuffle=False, num_workers=workers, pin_memory=pin_memory,
                                       generator=torch.Generator().manual_seed(0))
