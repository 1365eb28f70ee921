"""Captions encoded once: a split's encoded captions as flat arrays in a cache beside the prepared dataset.

Encoding every caption of Karpathy COCO's train split (566,435 captions) is a Python loop of about a minute
at every start of a run, an evaluation or a query. :func:`split_captions` does it once per prepared dataset
and text codec and keeps the result in one ``.npz`` file of plain arrays; later loads read the arrays back.

Where: the dataset's cache folder (:func:`prep.dataset_cache.cache_folder`, shared with the cache of its
rows): ``<dataset>.vse-captions/`` beside the prepared dataset folder ``<dataset>`` (inside it, ``prep
--overwrite`` would see a file it did not write and refuse to replace the folder). ``VSE_CAPTION_CACHE``
changes that: ``0`` (or ``off``) encodes in memory as before, with no file; a folder path keeps the caches
there, one sub-folder per dataset. A dataset whose parent folder cannot be written is encoded in memory.

One file per split, languages and codec, named by them (a changed ``--max-chars`` is another file). It
holds the SHA-256 of ``dataset.json`` (of the bytes :class:`~prep.dataset.PreparedDataset` read, no second
read) and the codec's identity (kind, limits, and a hash of its symbols): a file made for another dataset
or vocabulary is re-encoded and replaced, never used. The file also carries a digest of its own content
(:func:`vsecore.containers.write_npz`): the SHA-256 of ``dataset.json`` says nothing of the arrays beside
it. A read (:func:`read_cache`) checks, in this order: the member names and every member's header (dtype,
declared shape: lengths that agree across members and stay within what the dataset holds, its images,
captions and text), then reads the arrays while recomputing the digest, then the key, then the arrays
themselves (offsets, code bounds, text). A file that fails any of it, or cannot be read at all (any error),
is one warning line, then re-encoded and replaced; one of another version, dataset or codec is a detail
line. Files are written through a temporary sibling and renamed
(:func:`vsecore.io.atomic_file`), so concurrent runs each see a whole file: two runs encoding at once
write the same bytes, and the last rename wins.

The arrays are the ones :func:`train.engine.data.load_caption_set` builds from a loop, bit for bit
(``tests/test_caption_cache.py``); invalid images and ``max_images`` are applied after the cache, so one
file serves every feature store of the dataset.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prep.dataset import PreparedDataset
from prep.dataset_cache import cache_folder, text_arrays, text_column
from prep.dataset_rows import TextColumn
from train.engine.codecs import TextCodec
from vsecore import console
from vsecore.containers import ContainerError, Member, NoDigest, one_line, read_npz, write_npz

#: version of the file's content; a file of another version is re-encoded (2: it carries a digest of its
#: content)
CACHE_VERSION = 2
#: the most bytes of a cache's key (its ``meta`` array: a few hundred)
MAX_KEY_BYTES = 1 << 20


@dataclass
class SplitCaptions:
    """Every caption of one split in one or more languages, encoded, grouped by image.

    Captions are in image order (ascending ``imgid``), an image's captions grouped by language in the
    order the languages were asked for, then as ``dataset.json`` lists them.
    """

    image_rows: np.ndarray  # (R,) int64, ascending imgid of every image with at least one caption
    per_image: np.ndarray  # (R,) int64 >= 1, captions of each image
    codes: np.ndarray  # (S,) int16 (vocabulary under 2**15) or int32, every caption's codes end to end
    offsets: np.ndarray  # (M + 1,) int64, caption k is codes[offsets[k]:offsets[k + 1]]
    texts: list[str]  # M raw texts

    def __len__(self) -> int:
        return len(self.texts)

    def select(self, keep: np.ndarray) -> SplitCaptions:
        """The captions of the images ``keep`` ((R,) bool), in the same order (``self`` when all are kept)."""
        if keep.all():
            return self
        caption_keep = np.repeat(keep, self.per_image)
        lengths = np.diff(self.offsets)
        offsets = np.zeros(int(caption_keep.sum()) + 1, dtype=np.int64)
        np.cumsum(lengths[caption_keep], out=offsets[1:])
        return SplitCaptions(self.image_rows[keep], self.per_image[keep],
                             self.codes[np.repeat(caption_keep, lengths)], offsets,
                             [t for t, k in zip(self.texts, caption_keep.tolist(), strict=True) if k])


def codes_dtype(codec: TextCodec) -> np.dtype:
    """The dtype of a codec's flat codes: int16 when its vocabulary fits, else int32."""
    return np.dtype(np.int16 if codec.vocab_size < 2**15 else np.int32)


def encode_split(dataset: PreparedDataset, split: str, langs: Sequence[str], codec: TextCodec
                 ) -> SplitCaptions:
    """Encode every caption of ``split`` in ``langs``: the Python loop the cache saves."""
    per_image: dict[int, list[tuple[str, tuple[str, ...]]]] = {}
    for one in langs:
        for s in dataset.sentences_of(split, one):
            per_image.setdefault(s.imgid, []).append((s.raw, s.tokens))
    rows = sorted(per_image)
    texts: list[str] = []
    encoded: list[np.ndarray] = []
    for imgid in rows:
        for raw, tokens in per_image[imgid]:
            texts.append(raw)
            encoded.append(codec.encode(raw, tokens).reshape(-1))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([e.size for e in encoded])
    codes = (np.concatenate(encoded) if encoded else np.zeros(0, dtype=np.int64)).astype(codes_dtype(codec))
    return SplitCaptions(np.asarray(rows, dtype=np.int64),
                         np.asarray([len(per_image[r]) for r in rows], dtype=np.int64), codes, offsets, texts)


def codec_identity(codec: TextCodec) -> dict[str, object]:
    """What makes two codecs encode a dataset's captions alike: kind, limits, and a hash of the symbols."""
    vocab = codec.vocab
    symbols = json.dumps([vocab.symbols, vocab.lowercase, vocab.pad, vocab.unk], ensure_ascii=False)
    return {"kind": codec.kind, "max_len": codec.max_len, "word_length": codec.item_width,
            "vocab_size": codec.vocab_size, "vocab_sha256": hashlib.sha256(symbols.encode()).hexdigest()}


def cache_file(folder: Path, split: str, langs: Sequence[str], codec: TextCodec) -> Path:
    """The file of ``split`` in ``langs`` encoded by ``codec`` inside the cache ``folder``."""
    ident = codec_identity(codec)
    return folder / (f"{split}.{'+'.join(langs)}.{codec.kind}-{codec.max_len}-{codec.item_width}"
                     f".{str(ident['vocab_sha256'])[:12]}.npz")


def split_captions(dataset: PreparedDataset, split: str, langs: Sequence[str], codec: TextCodec
                   ) -> SplitCaptions:
    """The encoded captions of ``split`` in ``langs``: read from the cache, or encoded and cached."""
    folder = cache_folder(dataset.root)
    if folder is None:
        return encode_split(dataset, split, langs, codec)
    path = cache_file(folder, split, langs, codec)
    # the SHA-256 of the bytes the dataset was read from: the captions encoded are always those
    key = {"version": CACHE_VERSION, "dataset_sha256": dataset.dataset_sha256,
           "split": split, "langs": list(langs), "codec": codec_identity(codec)}
    if path.is_file():
        found = read_cache(path, key, codec, dataset)
        if isinstance(found, SplitCaptions):
            return found
        say = console.detail if found.startswith("made ") else console.warning
        say(f"caption cache {path}: {found}; encoding the captions again")
    captions = encode_split(dataset, split, langs, codec)
    try:
        write_cache(path, key, captions)
    except OSError as exc:  # a read-only or full disk: the captions are still right, only not kept
        console.detail(f"caption cache {path} not written ({exc.strerror or exc}); captions kept in memory")
    return captions


def write_cache(path: Path, key: dict[str, object], captions: SplitCaptions) -> None:
    """Write ``captions`` and their ``key`` into ``path``, with a digest of them (a temporary sibling, then
    a rename)."""
    text, text_offsets = text_arrays(TextColumn(captions.texts))
    arrays = {"meta": np.frombuffer(json.dumps(key).encode(), dtype=np.uint8),
              "image_rows": captions.image_rows, "per_image": captions.per_image, "codes": captions.codes,
              "offsets": captions.offsets, "text": text,
              "text_offsets": text_offsets}
    write_npz(path, arrays)


def cache_members(codec: TextCodec) -> dict[str, Member]:
    """The arrays of a cache file of ``codec``, with dtypes and shapes: ``r`` images with captions, ``m``
    captions, ``s`` codes, ``t`` bytes of text."""
    index = ("int64",)
    return {"meta": Member(("uint8",), shape=("key",)), "image_rows": Member(index, shape=("r",)),
            "per_image": Member(index, shape=("r",)), "offsets": Member(index, shape=("m+1",)),
            "text_offsets": Member(index, shape=("m+1",)), "text": Member(("uint8",), shape=("t",)),
            "codes": Member((codes_dtype(codec).str,), shape=("s",))}


def cache_bounds(dataset: PreparedDataset, codec: TextCodec) -> dict[str, int]:
    """The most each length of a cache file may declare for ``dataset`` and ``codec``: its images, its
    captions, at most ``max_len`` positions of ``item_width`` codes each, 4 UTF-8 bytes a character."""
    rows = dataset.rows
    captions = int(rows.starts[-1])
    raws = rows.raws
    chars = len(raws.text) if raws.values is None else sum(len(str(v)) for v in raws.values)
    return {"key": MAX_KEY_BYTES, "r": len(rows.starts) - 1, "m": captions,
            "s": captions * max(1, codec.max_len) * codec.item_width, "t": 4 * chars}


def read_cache(path: Path, key: dict[str, object], codec: TextCodec, dataset: PreparedDataset
               ) -> SplitCaptions | str:
    """The captions in ``path`` if it holds ``key``'s and everything checks out (the module docstring's
    order), else why not (a phrase; any error a hostile file can raise, MemoryError included, is one)."""
    try:
        arrays = read_npz(path, cache_members(codec), cache_bounds(dataset, codec), digest=True)
        meta = json.loads(arrays.pop("meta").tobytes().decode("utf-8"))
        if not isinstance(meta, dict):
            return "unreadable record (not an object)"
        if meta != key:
            what = "dataset" if meta.get("dataset_sha256") != key["dataset_sha256"] else "codec or version"
            return f"made for another {what}"
        why = check_arrays(arrays, codec, len(dataset.images))
        if why:
            return why
        texts = list(text_column(arrays["text"], arrays["text_offsets"], len(arrays["offsets"]) - 1))
    except NoDigest:
        return "made by another version (no digest)"
    except ContainerError as exc:
        return str(exc)
    except ValueError as exc:  # a record not JSON; text not UTF-8, or offsets that do not fit it
        return f"damaged ({one_line(exc)})"
    except Exception as exc:  # whatever else a hostile file raises: a rebuild, never a traceback
        return f"unreadable ({one_line(exc)})"
    return SplitCaptions(arrays["image_rows"], arrays["per_image"], arrays["codes"], arrays["offsets"], texts)


def check_arrays(arrays: dict[str, np.ndarray], codec: TextCodec, n_images: int) -> str | None:
    """Why the arrays of a cache file, their names, dtypes and shapes checked (:func:`cache_members`),
    cannot be the encoded captions of ``codec`` (None when they can)."""
    rows, per_image, codes, offsets = (arrays[n] for n in ("image_rows", "per_image", "codes", "offsets"))
    m = len(offsets) - 1
    # each count within 1..m before the sum: a huge one would wrap it, and select() repeat by it
    if len(rows) and (per_image.min() < 1 or per_image.max() > m):
        return "captions per image outside 1..captions"
    if per_image.sum() != m:
        return "array lengths disagree"
    if len(rows) and (rows[0] < 0 or rows[-1] >= n_images or (np.diff(rows) <= 0).any()):
        return f"image rows not ascending within the dataset's {n_images} images"
    steps = np.diff(offsets)
    width = codec.item_width
    if offsets[0] != 0 or offsets[-1] != len(codes) or (steps < width).any() or (steps % width).any():
        return "caption offsets do not fit the codes"
    if len(codes) and (codes.min() < 0 or codes.max() >= codec.vocab_size):
        return f"codes outside the vocabulary of {codec.vocab_size} symbols"
    if arrays["text_offsets"][0] != 0:
        return "its text offsets do not start at 0"
    return None
