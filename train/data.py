"""The caption data pipeline: prepared captions and stored image features -> training batches.

A split is loaded once into a :class:`CaptionSet`: the image features of its usable images (rows
of the feature store whose ``valid`` flag is set; the others are skipped and counted), every
caption of the chosen language as character indices of the prepared ``chars.json`` (lowercased
as the alphabet was built, unknown characters -> ``<unk>`` = 1, truncated at ``max_chars``),
and ``caption_image``, the row of each caption's image. Captions are kept as one flat array plus
offsets, so COCO's 600k captions cost a few tens of megabytes instead of 600k Python lists.

An epoch is a fixed list of batches drawn up front from a seeded :class:`torch.Generator`
(:func:`epoch_batches`): that list, plus the index of the next batch, is all a mid-epoch
checkpoint needs to continue exactly where a killed run stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from prep.dataset import PAD_INDEX, PreparedDataset, Vocabulary
from prep.errors import UserError


class Batch(NamedTuple):
    """One training or embedding batch; ``T`` is the longest caption of the batch."""

    image_features: torch.Tensor  # (B, C) float32
    chars: torch.Tensor  # (B, T) int64, padded with 0
    lengths: torch.Tensor  # (B,) int64, >= 1
    image_index: torch.Tensor  # (B,) int64, row of the caption's image in the CaptionSet


def feature_spec(features: str) -> str:
    """Check that ``STORE[:key]`` names features a character model can read; returns it unchanged.

    The key is ``global`` or ``fne`` (or ``fne_raw``); a bare store path lets the reader pick
    ``global`` when the store has it, else ``fne``.
    """
    store, sep, key = features.rpartition(":")
    if sep and store and key == "regions":
        raise UserError(f"{features}: region features need the clmr/liwe families, not a character "
                        "model (use ':global' or ':fne')")
    return features


def encode_text(text: str, vocab: Vocabulary, max_chars: int) -> list[int]:
    """Character indices of ``text`` (lowercased when the alphabet is), at most ``max_chars``.

    An empty text becomes a single ``<unk>``: encoders need at least one position.
    """
    if vocab.lowercase:
        text = text.lower()
    codes = vocab.encode(text[:max_chars])
    return codes or [vocab.index(vocab.unk)]


def pad_codes(codes: Sequence[Sequence[int]] | Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad captions to the longest one: ``(chars (B, T) int64, lengths (B,) int64)``."""
    lengths = torch.tensor([len(c) for c in codes], dtype=torch.long)
    chars = torch.full((len(codes), int(lengths.max()) if len(codes) else 0), PAD_INDEX, dtype=torch.long)
    for i, c in enumerate(codes):
        chars[i, : len(c)] = torch.as_tensor(np.asarray(c, dtype=np.int64))
    return chars, lengths


def encode_batch(texts: Sequence[str], vocab: Vocabulary, max_chars: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Texts -> ``(chars (B, T) int64, lengths (B,) int64)``, padded to the longest."""
    return pad_codes([encode_text(t, vocab, max_chars) for t in texts])


@dataclass
class CaptionSet:
    """The captions of one split and language, with the features of the images they describe."""

    split: str
    lang: str
    images: torch.Tensor  # (N, C) float32, usable images of the split in imgid order
    imgids: np.ndarray  # (N,) int64, the prepared imgid (feature row) of each image
    codes: np.ndarray  # (sum of lengths,) int16/int32, every caption's characters end to end
    offsets: np.ndarray  # (M + 1,) int64, caption k is codes[offsets[k]:offsets[k + 1]]
    caption_image: np.ndarray  # (M,) int64, row in ``images`` of each caption's image
    texts: list[str]
    skipped_images: int  # images of the split whose features are invalid

    def __len__(self) -> int:
        return len(self.caption_image)

    @property
    def num_images(self) -> int:
        """Number of usable images N."""
        return int(self.images.shape[0])

    def caption_codes(self, k: int) -> np.ndarray:
        """Character indices of caption ``k``."""
        return self.codes[self.offsets[k]: self.offsets[k + 1]]

    def batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """The batch of captions ``indices`` (M-indices) with their images' features."""
        idx = np.asarray(indices, dtype=np.int64)
        chars, lengths = pad_codes([self.caption_codes(int(k)) for k in idx])
        image_index = torch.from_numpy(self.caption_image[idx])
        return Batch(self.images[image_index], chars, lengths, image_index)


def read_features(features: str) -> tuple[np.ndarray, np.ndarray]:
    """``features.store.read_matrix`` on ``STORE[:key]``: ``(x (N, C) float32, valid (N,) bool)``."""
    from features.store import read_matrix  # the feature stage is imported only when features are read

    x, valid = read_matrix(feature_spec(features))
    return np.asarray(x, dtype=np.float32), np.asarray(valid, dtype=bool)


def load_caption_set(dataset: PreparedDataset, x: np.ndarray, valid: np.ndarray, split: str, lang: str,
                     max_chars: int, max_images: int | None = None) -> CaptionSet:
    """Build the :class:`CaptionSet` of ``split`` in ``lang``.

    Args:
        dataset: the prepared dataset.
        x: (N_all, C) features in ``imgid`` order; ``valid``: (N_all,) usable rows.
        split: ``train``, ``val`` or ``test``; ``lang``: caption language.
        max_chars: captions are truncated to this many characters.
        max_images: keep only the first images of the split (validation on a subset).

    Images without a caption in ``lang`` are left out (they cannot be retrieved by text);
    images with invalid features are left out and counted in ``skipped_images``.
    """
    if x.shape[0] != len(dataset.images):
        raise UserError(f"feature store has {x.shape[0]} rows but {dataset.root} has {len(dataset.images)} "
                        "images: the store was extracted from another dataset")
    if lang not in dataset.languages:
        raise UserError(f"{dataset.root}: no captions in language '{lang}' "
                        f"(this dataset has {', '.join(dataset.languages)})")
    per_image: dict[int, list[str]] = {}
    for s in dataset.sentences_of(split, lang):
        per_image.setdefault(s.imgid, []).append(s.raw)
    rows = sorted(per_image)
    if max_images is not None:
        rows = rows[:max_images]
    kept = [r for r in rows if valid[r]]
    skipped = len(rows) - len(kept)
    texts: list[str] = []
    caption_image: list[int] = []
    for row, imgid in enumerate(kept):
        texts.extend(per_image[imgid])
        caption_image.extend([row] * len(per_image[imgid]))
    if not texts:
        raise UserError(f"{dataset.root}: split '{split}' has no usable {lang} captions "
                        f"({skipped} images skipped for invalid features)")
    encoded = [encode_text(t, dataset.chars, max_chars) for t in texts]
    dtype = np.int16 if len(dataset.chars) < 2**15 else np.int32
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(c) for c in encoded])
    codes = np.fromiter((c for e in encoded for c in e), dtype=dtype, count=int(offsets[-1]))
    imgids = np.asarray(kept, dtype=np.int64)
    return CaptionSet(split=split, lang=lang, images=torch.from_numpy(np.ascontiguousarray(x[imgids])),
                      imgids=imgids, codes=codes, offsets=offsets,
                      caption_image=np.asarray(caption_image, dtype=np.int64), texts=texts,
                      skipped_images=skipped)


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


class BatchList(torch.utils.data.Dataset):
    """A fixed list of batches as a map-style dataset, so a DataLoader's workers can collate them."""

    def __init__(self, captions: CaptionSet, batches: Sequence[np.ndarray]) -> None:
        self.captions = captions
        self.batches = list(batches)

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Batch:
        return self.captions.batch(self.batches[i])


def batch_loader(captions: CaptionSet, batches: Sequence[np.ndarray], workers: int = 0,
                 pin_memory: bool = False) -> torch.utils.data.DataLoader:
    """Iterate ``batches`` in order (collated, in ``workers`` processes when > 0)."""
    # its own generator: a DataLoader draws a worker base seed on every iteration, and drawing it
    # from the global generator would make a resumed epoch's random stream differ
    return torch.utils.data.DataLoader(BatchList(captions, batches), batch_size=None, shuffle=False,
                                       num_workers=workers, pin_memory=pin_memory,
                                       generator=torch.Generator().manual_seed(0))
