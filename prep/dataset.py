"""The prepared-dataset format: its file names and constants, and the reader every later stage uses.

A prepared dataset is one folder (see ``docs/ARCHITECTURE.md``, "Prepared dataset"):

- ``dataset.json``: the Karpathy split schema plus ``languages``, ``pairs``, ``images_root`` and a
  ``lang`` on every sentence; images in ``imgid`` order, the row order of every feature array;
- ``chars.json`` and ``words.json``: the character alphabet and the word vocabulary of the train
  split only, with ``<pad>`` at index 0 and ``<unk>`` at index 1;
- ``prep.json``: the record of inputs (with SHA-256), options, counts and dropped items;
- ``.vse-prepared``: the marker that ``prep --out --overwrite`` checks before replacing a folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prep.dataset_cache import cached_rows, rows_cache_file, write_rows_cache
from prep.dataset_rows import DatasetRows, RowView, field_of, gc_paused, read_rows
from prep.dataset_rows import item as column_item
from vsecore.errors import UserError
from vsecore.io import read_bytes, sha256_file, write_json_atomic
from vsecore.jsonfile import parse_json, read_json
from vsecore.version import __version__

DATASET_FILE = "dataset.json"
CHARS_FILE = "chars.json"
WORDS_FILE = "words.json"
RECORD_FILE = "prep.json"
#: marker of a folder written by ``prep``: the only kind of non-empty folder ``prep --out`` replaces
MARKER_FILE = ".vse-prepared"
PAD = "<pad>"
UNK = "<unk>"
PAD_INDEX = 0
UNK_INDEX = 1
SPLITS = ("train", "val", "test")
LANGUAGES = ("en", "de", "ja")
#: version of the on-disk format, written into ``dataset.json`` and ``prep.json``
FORMAT_VERSION = 1
#: what the files of a prepared dataset are, in the messages of their readers
PREPARED_FILE = "a prepared dataset's file"


@dataclass(frozen=True)
class Sentence:
    """One caption (or one side of a pair): ``raw`` is the text models read."""

    sentid: int
    imgid: int
    raw: str
    tokens: tuple[str, ...]
    lang: str
    original: str | None = None


@dataclass(frozen=True)
class ImageEntry:
    """One image: its row ``imgid`` in every feature array, its split and its absolute path."""

    imgid: int
    split: str
    filename: str
    path: Path
    filepath: str | None = None
    cocoid: int | None = None
    karpathy_split: str | None = None
    sentids: tuple[int, ...] = ()


@dataclass(frozen=True)
class PairSide:
    """One language side of a cross-language pair."""

    raw: str
    tokens: tuple[str, ...]
    sentid: int | None = None
    original: str | None = None


@dataclass(frozen=True)
class Pair:
    """A cross-language pair (Multi30k task1 translation, YJ image-level en/ja pair)."""

    pairid: int
    imgid: int
    split: str
    sides: dict[str, PairSide]


@dataclass
class Vocabulary:
    """A symbol table: ``symbols[i]`` has index ``i``; unknown symbols map to ``<unk>`` (1)."""

    symbols: list[str]
    counts: dict[str, int] = field(default_factory=dict)
    min_count: int = 1
    lowercase: bool = True
    pad: str = PAD
    unk: str = UNK

    def __post_init__(self) -> None:
        self._index = {s: i for i, s in enumerate(self.symbols)}

    def __len__(self) -> int:
        return len(self.symbols)

    def __contains__(self, symbol: object) -> bool:
        return symbol in self._index

    def index(self, symbol: str) -> int:
        """Index of ``symbol``, or that of ``<unk>`` when it is not in the vocabulary."""
        return self._index.get(symbol, self._index[self.unk])

    def encode(self, symbols: Iterable[str]) -> list[int]:
        """Indices of a sequence of symbols (characters of a string, or tokens)."""
        unk = self._index[self.unk]
        return [self._index.get(s, unk) for s in symbols]


def _missing(path: Path) -> str:
    """What a missing file of a prepared dataset is said to mean."""
    return f"{path}: not found (is this a prepared dataset folder? run `prep` first)"


def _read_bytes(path: Path) -> bytes:
    """The bytes of ``path``, kept whole (their SHA-256 names the dataset), read with the checks of every
    text input (:func:`vsecore.io.read_bytes`)."""
    return read_bytes(path, PREPARED_FILE, _missing(path))


def _text_of(raw: bytes, path: Path) -> str:
    """The bytes ``raw`` of ``path`` read as text is read (UTF-8, universal newlines; a :class:`UserError`
    naming ``path`` when they are not UTF-8)."""
    try:
        return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8").read()
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _parse_json(text: str, path: Path) -> Any:
    """The JSON ``text`` of ``path`` (:func:`vsecore.jsonfile.parse_json`: a one-line :class:`UserError`
    when it is not JSON), parsed with the cyclic garbage collector paused
    (:func:`prep.dataset_rows.gc_paused`: a dataset.json is millions of objects)."""
    with gc_paused():
        return parse_json(text, path)


@dataclass
class PreparedDataset:
    """A prepared dataset folder, loaded: images in ``imgid`` order, sentences, vocabularies, pairs.

    ``images`` and ``sentences`` are read-only sequences whose :class:`ImageEntry` and :class:`Sentence`
    objects are made when read (:mod:`prep.dataset_rows`: the file is held as columns, about a gigabyte
    less at COCO size); every field was checked by :meth:`load`.
    """

    root: Path
    name: str
    languages: list[str]
    pairs: list[Pair]
    chars: Vocabulary
    words: Vocabulary
    record: dict[str, Any]
    rows: DatasetRows = field(repr=False)
    #: the folder the images' paths start from (``images_root`` of ``dataset.json``)
    images_root: Path | None = None
    #: SHA-256 of the ``dataset.json`` bytes this was read from
    dataset_sha256: str = ""

    @classmethod
    def load(cls, path: str | os.PathLike) -> PreparedDataset:
        """Read the folder ``path`` written by ``prep`` (a :class:`UserError` if it is not one)."""
        root = Path(path).expanduser().resolve()
        if root.is_file():
            root = root.parent
        file = root / DATASET_FILE
        raw = _read_bytes(file)
        sha256 = hashlib.sha256(raw).hexdigest()
        cache = rows_cache_file(root, len(raw))
        found = cached_rows(cache, sha256, len(raw))
        if found is not None:
            rows, meta = found
        else:
            text = [_text_of(raw, file)]  # held by the list only, so the parse frees it
            del raw
            rows, meta = _parse_rows(text, file, root)
            if cache is not None:
                write_rows_cache(cache, sha256, rows, meta)
        pairs = [_load_pair(p, file, k) for k, p in enumerate(meta["pairs"])]
        name = meta["dataset"][0] if meta["dataset"] else root.name  # the folder's name when none is given
        languages = list(meta["languages"])
        images_root = Path(meta["images_root"])
        record = root / RECORD_FILE
        return cls(root=root, name=name, languages=languages, pairs=pairs,
                   chars=load_vocabulary(root / CHARS_FILE), words=load_vocabulary(root / WORDS_FILE),
                   record=read_json(record, PREPARED_FILE, kind=dict) if record.exists() else {},
                   rows=rows, images_root=images_root, dataset_sha256=sha256)

    # -- images --------------------------------------------------------------------------------
    @property
    def images(self) -> Sequence[ImageEntry]:
        """Every image, in ``imgid`` order."""
        return RowView(len(self.rows.splits), self._image)

    def _image(self, i: int) -> ImageEntry:
        r = self.rows
        return ImageEntry(imgid=i, split=r.splits[i], filename=r.filenames[i], path=Path(r.path(i)),
                          filepath=r.filepaths[i], cocoid=column_item(r.cocoids, i),
                          karpathy_split=r.karpathy_splits[i], sentids=r.sentids_of(i))

    def images_of(self, split: str | None = None) -> list[ImageEntry]:
        """Images of ``split`` (all when ``None``), in ``imgid`` order."""
        _check_split(split)
        with gc_paused():  # a hundred thousand objects: the collector would walk them again and again
            return [self._image(i) for i in np.flatnonzero(self.rows.image_mask(split)).tolist()]

    def split_mask(self, split: str) -> np.ndarray:
        """``(N,)`` bool, True at the images of ``split`` (``imgid`` order), making no image entries."""
        _check_split(split)
        return np.asarray(self.rows.image_mask(split), dtype=bool)

    def image_rows(self, split: str | None = None) -> list[int]:
        """The ``imgid`` (feature-array row) of every image of ``split``, ascending."""
        _check_split(split)
        return np.flatnonzero(self.rows.image_mask(split)).tolist()

    def image_paths(self) -> list[Path]:
        """Absolute path of every image, in ``imgid`` order (the input list of ``features``)."""
        with gc_paused():
            return [Path(self.rows.path(i)) for i in range(len(self.rows.splits))]

    # -- sentences -----------------------------------------------------------------------------
    @property
    def sentences(self) -> Sequence[Sentence]:
        """Every sentence, by image (``imgid``), then as the image lists them."""
        return RowView(len(self.rows.raws), self._sentence)

    def _sentence(self, k: int) -> Sentence:
        r = self.rows
        return Sentence(sentid=column_item(r.sentids, k), imgid=int(r.sentence_image[k]), raw=r.raws[k],
                        tokens=r.tokens[k], lang=r.langs[k], original=r.originals.get(k))

    def _sentence_rows(self, split: str | None, lang: str | Sequence[str] | None) -> list[int]:
        _check_split(split)
        langs = {lang} if isinstance(lang, str) else (set(lang) if lang is not None else None)
        if langs is not None and not langs <= set(self.languages):
            raise UserError(f"{self.root}: no language {sorted(langs - set(self.languages))} "
                            f"(this dataset has {', '.join(self.languages)})")
        return self.rows.sentence_rows(split, langs)

    def sentences_of(self, split: str | None = None, lang: str | Sequence[str] | None = None
                     ) -> list[Sentence]:
        """Sentences whose image is in ``split`` and whose language is ``lang`` (``None``: all).

        Order: by image (``imgid``), then as the image lists them.
        """
        chosen = self._sentence_rows(split, lang)
        with gc_paused():
            return [self._sentence(k) for k in chosen]

    def captions(self, split: str | None = None, lang: str | Sequence[str] | None = None
                 ) -> tuple[list[str], list[int]]:
        """``(texts, caption_image)``: the ``raw`` texts and, for each, its image's ``imgid``."""
        chosen = self._sentence_rows(split, lang)
        return [self.rows.raws[k] for k in chosen], self.rows.sentence_image[chosen].tolist()

    def captioned_rows(self, split: str | None = None, lang: str | Sequence[str] | None = None
                       ) -> np.ndarray:
        """(R,) int64: the ``imgid`` of every image of ``split`` with a sentence in ``lang``, ascending
        (the images :meth:`sentences_of` names, without making its objects)."""
        return np.unique(self.rows.sentence_image[self._sentence_rows(split, lang)])

    def pairs_of(self, split: str | None = None) -> list[Pair]:
        """Cross-language pairs of ``split`` (all when ``None``)."""
        _check_split(split)
        return [p for p in self.pairs if split is None or p.split == split]

    def images_fingerprint(self) -> str:
        """SHA-256 of the ordered image list: ``filepath/filename`` and split of every row.

        The identity of a feature store's rows: it changes when images are added, removed,
        reordered or moved between splits (FNE statistics use the train split), not when only
        captions or vocabularies change, so re-preparing captions keeps extracted features usable.
        """
        r = self.rows
        rows = [[f"{fp}/{fn}" if fp else fn, sp]
                for fp, fn, sp in zip(r.filepaths, r.filenames, r.splits, strict=True)]
        return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode("utf-8")).hexdigest()

    def counts(self) -> dict[str, dict[str, int]]:
        """Images, sentences and pairs per split."""
        out = {sp: {"images": 0, "sentences": 0, "pairs": 0} for sp in SPLITS}
        for split, n in zip(self.rows.splits, np.diff(self.rows.starts).tolist(), strict=True):
            out[split]["images"] += 1
            out[split]["sentences"] += n
        for p in self.pairs:
            out[p.split]["pairs"] += 1
        return out


def _parse_rows(text: list[str], file: Path, root: Path) -> tuple[DatasetRows, dict[str, Any]]:
    """The rows of the ``dataset.json`` text ``text.pop()`` (read as columns, every field checked) and its
    other top-level fields (``dataset`` as a list of none or one, ``languages``, ``images_root``, ``pairs``).
    The text is taken out of the list so that nothing holds it once it is parsed."""
    # the collector stays off until the parsed file is freed: one collection with it alive walks
    # every one of its millions of objects
    with gc_paused():
        data = _parse_json(text.pop(), file)
        if isinstance(data, dict) and data.get("task") == "textcls":
            raise UserError(f"{root}: a text classification dataset (prep textcls): it has no images; "
                            "use `train classify --data` with it")
        images_root = field_of(data, "images_root", file, "top level")
        rows = read_rows(data, file, Path(images_root))
        meta = {"dataset": [data["dataset"]] if "dataset" in data else [],
                "languages": data.get("languages", ["en"]), "images_root": images_root,
                "pairs": data.get("pairs", [])}
        del data
    return rows, meta


def is_prepared_dataset(path: str | os.PathLike) -> bool:
    """Whether the folder ``path`` was written by ``prep`` (so ``prep --overwrite`` may replace it).

    True when it holds :data:`MARKER_FILE`. A folder written before the marker existed counts too
    when its ``prep.json`` is a prep record and it holds nothing else prep did not write.
    """
    path = Path(path)
    if not path.is_dir():
        return False
    if (path / MARKER_FILE).is_file():
        return True
    record = _record_of(path)
    return "format_version" in record and "prep_version" in record and not foreign_entries(path)


def foreign_entries(path: str | os.PathLike) -> list[str]:
    """Names in the prepared folder ``path`` that ``prep`` does not write (sorted).

    ``prep --overwrite`` refuses to replace a folder holding any: they would be deleted with it.
    """
    path = Path(path)
    written = {DATASET_FILE, CHARS_FILE, WORDS_FILE, RECORD_FILE, MARKER_FILE}
    if _record_of(path).get("dataset") == "synthetic":
        written.add("images")  # the generated images
    return sorted(p.name for p in path.iterdir() if p.name not in written)


def _record_of(path: Path) -> dict[str, Any]:
    try:
        return read_json(path / RECORD_FILE, PREPARED_FILE, kind=dict)
    except UserError:  # no prep record, or not one: not a folder prep wrote
        return {}


def input_record(path: Path) -> dict[str, Any]:
    """One input of a ``prep.json`` record: its absolute path, size and SHA-256 (what
    :func:`changed_inputs` checks)."""
    return {"path": str(path.resolve()), "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def write_prepared_files(folder: Path, dataset: dict[str, Any], chars: dict[str, Any], words: dict[str, Any],
                         record: dict[str, Any]) -> None:
    """Write a prepared dataset's files into ``folder`` (each atomically): ``dataset.json``, ``chars.json``,
    ``words.json``, ``prep.json`` and, last, the marker that makes the folder a prepared dataset."""
    write_json_atomic(folder / DATASET_FILE, dataset, indent=None)
    write_json_atomic(folder / CHARS_FILE, chars)
    write_json_atomic(folder / WORDS_FILE, words)
    write_json_atomic(folder / RECORD_FILE, record)
    write_json_atomic(folder / MARKER_FILE, {"format_version": FORMAT_VERSION, "prep_version": __version__})


def changed_inputs(record: dict[str, Any]) -> list[str]:
    """The inputs of a ``prep.json`` record that differ on disk now: ``"PATH (why)"`` each.

    An input is changed when it is missing, or its size or SHA-256 differs from the record (the
    size is compared first, so an edit that changes it costs no checksum).
    """
    changed = []
    for item in record.get("inputs", []):
        path = Path(item["path"])
        try:
            size = path.stat().st_size
        except OSError:
            changed.append(f"{path} (missing)")
            continue
        if size != item.get("bytes") or sha256_file(path) != item.get("sha256"):
            changed.append(f"{path} (content changed)")
    return changed


def _check_split(split: str | None) -> None:
    if split is not None and split not in SPLITS:
        raise UserError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)})")


def _load_pair(p: dict, file: Path, k: int) -> Pair:
    where = f"pairs[{k}]"
    sides = {}
    for key, val in p.items():
        if isinstance(val, dict):
            sides[key] = PairSide(raw=field_of(val, "raw", file, f"{where}.{key}"),
                                  tokens=tuple(field_of(val, "tokens", file, f"{where}.{key}")),
                                  sentid=val.get("sentid"), original=val.get("original"))
    return Pair(pairid=int(field_of(p, "pairid", file, where)), imgid=int(field_of(p, "imgid", file, where)),
                split=field_of(p, "split", file, where), sides=sides)


def load_vocabulary(path: str | os.PathLike) -> Vocabulary:
    """Read ``chars.json`` (key ``symbols``) or ``words.json`` (key ``tokens``)."""
    path = Path(path)
    data = read_json(path, PREPARED_FILE, missing=_missing(path), kind=dict)
    symbols = data.get("symbols", data.get("tokens"))
    if not isinstance(symbols, list):
        raise UserError(f"{path}: missing field 'symbols' (chars) or 'tokens' (words)")
    vocab = Vocabulary(symbols=symbols, counts=data.get("counts", {}), min_count=data.get("min_count", 1),
                       lowercase=data.get("lowercase", True), pad=data.get("pad", PAD),
                       unk=data.get("unk", UNK))
    if symbols[:2] != [vocab.pad, vocab.unk]:
        raise UserError(f"{path}: the first two symbols must be '{vocab.pad}' and '{vocab.unk}'")
    return vocab
