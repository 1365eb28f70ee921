"""``dataset.json``'s images and sentences held as columns, not as one Python object per sentence.

Karpathy COCO's ``dataset.json`` (123,287 images, 616,435 sentences, 163 MB) parsed into a
:class:`Sentence` and a tuple of token strings per caption held 1.09 GiB and took 16 to 18 s to read here
(``docs/scale.md``), most of it the cyclic garbage collector walking the millions of objects the parse
makes (none of them cycles).
:func:`read_rows` reads the parsed file (the collector paused: :func:`gc_paused`) into columns: the texts
and the tokens as one string each with offsets (:class:`TextColumn`, :class:`TokenColumn`), the splits and
languages as codes into a table of their few values (:class:`ValueColumn`), ids as int64 arrays; nothing
small from the parse survives it, so the parse's memory goes back whole. :class:`RowView` makes the
:class:`~prep.dataset.ImageEntry` and :class:`~prep.dataset.Sentence` objects only when a caller reads
them. Every field is checked as the reader of one object per sentence checked it, in the same order, with
the same errors (``tests/dataset_reference.py`` keeps that reader as the reference).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter, methodcaller
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np

from vsecore.errors import UserError

#: joins a sentence's tokens into one string; a token holding it keeps its tokens as a tuple instead
TOKEN_SEP = "\x1f"
T = TypeVar("T")


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside the block (on again after it, if it was on before).

    Parsing a large JSON file allocates millions of lists, dicts and strings that form no cycle; each
    collection the allocations trigger walks all of them (three quarters of the parse's time).
    Reference counting still frees everything as usual."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def field_of(obj: Any, key: str, file: Path, where: str) -> Any:
    """``obj[key]``, or a :class:`UserError` naming ``file``, ``where`` and the missing field."""
    try:
        return obj[key]
    except (KeyError, TypeError):
        raise UserError(f"{file}: {where}: missing field '{key}'") from None


class TextColumn:
    """M strings held as one string and (M + 1,) offsets (the list as given when one is not a string)."""

    def __init__(self, values: list[Any]) -> None:
        self.values: list[Any] | None = None
        if set(map(type, values)) <= {str}:
            self.text = "".join(values)
            self.offsets = np.zeros(len(values) + 1, dtype=np.int64)
            np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)), out=self.offsets[1:])
        else:
            self.values, self.text, self.offsets = list(values), "", np.zeros(1, dtype=np.int64)

    @classmethod
    def of(cls, text: str, offsets: np.ndarray) -> TextColumn:
        """The column of the strings ``text[offsets[k]:offsets[k + 1]]`` (``offsets``: (M + 1,) int64)."""
        column = cls([])
        column.text, column.offsets = text, offsets
        return column

    def __getitem__(self, k: int) -> Any:
        if self.values is not None:
            return self.values[k]
        return self.text[self.offsets[k]: self.offsets[k + 1]]

    def __len__(self) -> int:
        return len(self.values) if self.values is not None else len(self.offsets) - 1

    def __iter__(self) -> Iterator[Any]:
        if self.values is not None:
            return iter(self.values)
        text, bounds = self.text, self.offsets.tolist()
        return (text[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True))


class ValueColumn:
    """M values, few of them distinct (a split, a language, a folder): (M,) int32 codes into ``table``, or
    the list as given when one cannot be a dict key. A value is its type and value (``0`` is not
    ``False``)."""

    def __init__(self, values: list[Any]) -> None:
        self.values: list[Any] | None = None
        if set(map(type, values)) == {str}:  # the common case, in C loops
            self.table = sorted(set(values))
            index = {v: i for i, v in enumerate(self.table)}
            self.codes = np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values))
            return
        index = {}
        try:
            self.codes = np.fromiter((index.setdefault((type(v), v), len(index)) for v in values),
                                     dtype=np.int32, count=len(values))
        except TypeError:  # an unhashable value (a list): no table
            self.values, self.codes = list(values), np.zeros(0, dtype=np.int32)
        self.table = [v for _, v in index]

    @classmethod
    def of(cls, codes: np.ndarray, table: list[Any]) -> ValueColumn:
        """The column of the values ``table[codes[k]]`` (``codes``: (M,) int32)."""
        column = cls([])
        column.codes, column.table = codes, table
        return column

    def __getitem__(self, k: int) -> Any:
        return self.values[k] if self.values is not None else self.table[self.codes[k]]

    def __len__(self) -> int:
        return len(self.values) if self.values is not None else len(self.codes)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values) if self.values is not None else (self.table[c] for c in self.codes.tolist())

    def mask(self, test: Callable[[Any], bool]) -> np.ndarray:
        """(M,) bool: ``test(value)`` of each value (evaluated once per distinct value)."""
        if self.values is not None:
            return np.fromiter(map(test, self.values), dtype=bool, count=len(self.values))
        return np.asarray([bool(test(v)) for v in self.table], dtype=bool)[self.codes] if len(self.codes) \
            else np.zeros(0, dtype=bool)


def item(column: np.ndarray | ValueColumn, k: int) -> Any:
    """Value ``k`` of an :func:`int_column` (a Python ``int`` from the array)."""
    return int(column[k]) if isinstance(column, np.ndarray) else column[k]


def int_column(values: list[Any]) -> np.ndarray | ValueColumn:
    """(M,) int64 when every value is an integer that fits (``bool`` is not one), else a
    :class:`ValueColumn`."""
    if all(type(v) is int for v in values):
        try:
            return np.asarray(values, dtype=np.int64)
        except OverflowError:
            pass
    return ValueColumn(values)


class TokenColumn:
    """Every sentence's tokens as one :class:`TextColumn` of the tokens joined by :data:`TOKEN_SEP`, and
    the sentences whose tokens that cannot give back exactly (none, a token that is no string or holds the
    separator) as the tuple the file gave."""

    def __init__(self, tokens: list[Any]) -> None:
        counts = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        self.odd: dict[int, tuple[Any, ...]] = {k: () for k in np.flatnonzero(counts == 0).tolist()}
        try:
            joined = list(map(TOKEN_SEP.join, tokens))
        except TypeError:  # a token that is no string
            joined = [_joined(t) for t in tokens]
        self.text = TextColumn(joined)
        separators = int((counts - (counts > 0)).sum())
        if self.text.values is not None or self.text.text.count(TOKEN_SEP) != separators:
            joined = [_joined(t) for t in tokens]  # find the sentences the join cannot hold
            self.text = TextColumn(joined)
        if self.text.values is not None:
            self.odd.update({k: tuple(t) for k, (t, j) in enumerate(zip(tokens, joined, strict=True))
                             if j is None})

    @classmethod
    def of(cls, text: TextColumn, odd: dict[int, tuple[Any, ...]]) -> TokenColumn:
        """The column of the joined tokens ``text``, but for the sentences ``odd`` holds."""
        column = cls([])
        column.text, column.odd = text, odd
        return column

    def __getitem__(self, k: int) -> tuple[Any, ...]:
        odd = self.odd.get(k)
        return odd if odd is not None else tuple(self.text[k].split(TOKEN_SEP))

    def __len__(self) -> int:
        return len(self.text)


def _joined(tokens: Any) -> str | None:
    """``tokens`` joined by :data:`TOKEN_SEP`, or None when one is no string or holds it."""
    if all(type(t) is str and TOKEN_SEP not in t for t in tokens):
        return TOKEN_SEP.join(tokens)
    return None


@dataclass
class DatasetRows:
    """The images and sentences of ``dataset.json`` as columns (image ``i`` is row ``i``: its ``imgid``)."""

    images_root: str
    filenames: TextColumn
    filepaths: ValueColumn
    splits: ValueColumn
    cocoids: np.ndarray | ValueColumn
    karpathy_splits: ValueColumn
    starts: np.ndarray  # (N + 1,) int64: image i's sentences are rows starts[i]:starts[i + 1]
    sentids: np.ndarray | ValueColumn  # (M,)
    sentence_image: np.ndarray  # (M,) int64, imgid of each sentence
    raws: TextColumn
    tokens: TokenColumn
    langs: ValueColumn
    originals: dict[int, Any]  # sentence -> ``original``, where there is one

    def path(self, i: int) -> str:
        """``images_root/filepath/filename`` of image ``i`` (``filepath`` left out when empty)."""
        filepath = self.filepaths[i]
        return os.path.join(self.images_root, filepath, self.filenames[i]) if filepath \
            else os.path.join(self.images_root, self.filenames[i])

    def sentids_of(self, image: int) -> tuple[int, ...]:
        """The ``sentid`` of every sentence of image ``image``, in its order."""
        a, b = int(self.starts[image]), int(self.starts[image + 1])
        return tuple(item(self.sentids, k) for k in range(a, b))

    def image_mask(self, split: str | None) -> np.ndarray:
        """(N,) bool: the images of ``split`` (all when ``None``)."""
        if split is None:
            return np.ones(len(self.splits), dtype=bool)
        return self.splits.mask(lambda sp: sp == split)

    def sentence_rows(self, split: str | None, langs: set[str] | None) -> list[int]:
        """The sentences whose image is in ``split`` and whose language is in ``langs`` (``None``: any),
        in image order, then as the image lists them."""
        keep = np.repeat(self.image_mask(split), np.diff(self.starts))
        if langs is None:
            return np.flatnonzero(keep).tolist()
        if self.langs.values is not None:  # a language that is no dict key: tested where its split is asked
            return [k for k in np.flatnonzero(keep).tolist() if self.langs[k] in langs]
        return np.flatnonzero(keep & self.langs.mask(lambda lang: lang in langs)).tolist()


def read_rows(data: Any, file: Path, images_root: Path) -> DatasetRows:
    """The rows of the parsed ``dataset.json`` ``data`` (``file`` names it in errors); a :class:`UserError`
    for a missing field or an ``imgid`` that is not its row, and any other error the reader of one object
    per sentence raised (a ``tokens`` that is a number, a file name that is no string), in its order.

    A file as ``prep`` writes it is read column by column (:func:`_fast_columns`); any other, or any
    error, is read again field by field as that reader did (:func:`_checked_columns`), which raises its
    first error or reads the same values."""
    root = str(images_root)
    try:
        columns = _fast_columns(data, root)
    except Exception:
        columns = None
    if columns is None:
        columns = _checked_columns(data, file, images_root)
    starts = np.zeros(len(columns["split"]) + 1, dtype=np.int64)
    np.cumsum(columns["per_image"], out=starts[1:])
    return DatasetRows(
        images_root=root, filenames=TextColumn(columns["filename"]),
        filepaths=ValueColumn(columns["filepath"]), splits=ValueColumn(columns["split"]),
        cocoids=int_column(columns["cocoid"]), karpathy_splits=ValueColumn(columns["karpathy"]),
        starts=starts, sentids=int_column(columns["sentid"]),
        sentence_image=np.repeat(np.arange(len(starts) - 1, dtype=np.int64), np.diff(starts)),
        raws=TextColumn(columns["raw"]), tokens=TokenColumn(columns["tokens"]),
        langs=ValueColumn(columns["lang"]),
        originals={k: v for k, v in enumerate(columns["original"]) if v is not None})


_IMAGE_FIELDS = {"filename": itemgetter("filename"), "filepath": methodcaller("get", "filepath"),
                 "split": itemgetter("split"), "cocoid": methodcaller("get", "cocoid"),
                 "karpathy": methodcaller("get", "karpathy_split")}
_SENTENCE_FIELDS = {"raw": itemgetter("raw"), "tokens": itemgetter("tokens"), "lang": itemgetter("lang"),
                    "original": methodcaller("get", "original")}


def _fast_columns(data: Any, root: str) -> dict[str, Any] | None:
    """The columns of a well-formed file, read a field at a time over every image and sentence; None (or
    an exception) when it is not one, and then nothing it read is used."""
    images = data["images"]
    if type(images) is not list:
        return None
    if list(map(int, map(itemgetter("imgid"), images))) != list(range(len(images))):
        return None
    columns: dict[str, Any] = {key: list(map(get, images)) for key, get in _IMAGE_FIELDS.items()}
    per_image = list(map(itemgetter("sentences"), images))
    if set(map(type, per_image)) - {list}:
        return None
    for filepath, filename in zip(columns["filepath"], columns["filename"], strict=True):
        os.path.join(root, filepath, filename) if filepath else os.path.join(root, filename)
    sentences = list(chain.from_iterable(per_image))
    columns["per_image"] = np.fromiter(map(len, per_image), dtype=np.int64, count=len(per_image))
    columns["sentid"] = list(map(int, map(itemgetter("sentid"), sentences)))
    columns.update({key: list(map(get, sentences)) for key, get in _SENTENCE_FIELDS.items()})
    return None if set(map(type, columns["tokens"])) - {list} else columns


def _checked_columns(data: Any, file: Path, images_root: Path) -> dict[str, Any]:
    """The columns read field by field in the order, and with the errors, of the reader of one object
    per sentence."""
    columns: dict[str, Any] = {k: [] for k in (*_IMAGE_FIELDS, "sentid", *_SENTENCE_FIELDS, "per_image")}
    root = str(images_root)
    for row, img in enumerate(field_of(data, "images", file, "top level")):
        where = f"images[{row}]"
        imgid = int(field_of(img, "imgid", file, where))
        if imgid != row:
            raise UserError(f"{file}: {where}: imgid {imgid} is not its row {row}")
        filepath = img.get("filepath")
        filename = field_of(img, "filename", file, where)
        n = len(columns["raw"])
        for k, s in enumerate(field_of(img, "sentences", file, where)):
            sw = f"{where}.sentences[{k}]"
            columns["sentid"].append(int(field_of(s, "sentid", file, sw)))
            columns["raw"].append(field_of(s, "raw", file, sw))
            columns["tokens"].append(tuple(field_of(s, "tokens", file, sw)))
            columns["lang"].append(field_of(s, "lang", file, sw))
            columns["original"].append(s.get("original"))
        columns["per_image"].append(len(columns["raw"]) - n)
        columns["split"].append(field_of(img, "split", file, where))
        try:
            os.path.join(root, filepath, filename) if filepath else os.path.join(root, filename)
        except TypeError:  # the error of joining them as paths
            _ = images_root / filepath / filename if filepath else images_root / filename
        for key, value in (("filename", filename), ("filepath", filepath), ("cocoid", img.get("cocoid")),
                           ("karpathy", img.get("karpathy_split"))):
            columns[key].append(value)
    return columns


class RowView(Sequence[T]):
    """A read-only sequence of ``n`` items made on demand by ``make(i)`` (each read makes a new one)."""

    def __init__(self, n: int, make: Callable[[int], T]) -> None:
        self._n, self._make = n, make

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [self._make(i) for i in range(*index.indices(self._n))]
        i = int(index)  # an IndexError past either end, as a list's
        if not -self._n <= i < self._n:
            raise IndexError(f"row {i} out of range ({self._n} rows)")
        return self._make(i + self._n if i < 0 else i)

    def __iter__(self) -> Iterator[T]:
        return (self._make(i) for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowView | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list, so unhashable like one

    def __repr__(self) -> str:
        return f"RowView({self._n} rows)"
