"""A prepared dataset's columns read once: ``dataset.json``'s rows kept as flat arrays in a checked cache.

Parsing Karpathy COCO's ``dataset.json`` (163 MB) and building its columns (:mod:`prep.dataset_rows`)
takes about 5 s at every start of a run, an evaluation, a query or a ``features`` job. The columns are
a few strings and integer arrays, so :func:`read_rows_cache` gives them back from one ``.npz`` file of
plain arrays in a fraction of that, and :func:`write_rows_cache` keeps them after a parse.

Where: the dataset's cache folder (:func:`cache_folder`), the one its encoded captions use
(:mod:`train.engine.caption_cache`): ``<dataset>.vse-captions/`` beside the prepared folder ``<dataset>``,
or under ``$VSE_CAPTION_CACHE``; ``VSE_CAPTION_CACHE=0`` turns both caches off. A ``dataset.json`` under
:data:`MIN_CACHED_BYTES` is parsed each time (it takes milliseconds), with no file.

The file holds the SHA-256 of the ``dataset.json`` bytes it was made from, and is used only for those
bytes: :class:`~prep.dataset.PreparedDataset` hashes the bytes it reads at every load, so a re-prepared or
edited dataset is parsed again and its cache replaced. It also carries a digest of its own content
(:func:`vsecore.containers.write_npz`), since the SHA-256 of ``dataset.json`` says nothing of the arrays
beside it. A read (:func:`read_rows_cache`) checks, in this order and before using anything: the member
names and every member's header (dtype, declared shape: lengths that agree across members and stay within
what a ``dataset.json`` of its size can hold, or, its size not given, what the file holds), then reads the
arrays while recomputing the digest, then the record (version, dataset), then the columns (offsets, codes
within their tables, the text UTF-8). A file that fails any of it, or cannot be read at all (any error), is
one warning line, then the dataset is parsed and the file replaced; one of another version or dataset is a
detail line. Only columns a file round-trips exactly are cached (strings, integers, ``null`` and booleans as
values; a file with any other, such as a token that is no string, is parsed each time). Files are written
through a temporary sibling and renamed (:func:`vsecore.io.atomic_file`). The columns read back equal the
parsed ones (``tests/test_dataset_cache.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from prep.dataset_rows import DatasetRows, TextColumn, TokenColumn, ValueColumn
from vsecore import console
from vsecore.containers import ContainerError, Member, NoDigest, one_line, read_npz, write_npz

#: version of the file's content; a file of another version is read again from ``dataset.json`` (2: the
#: file carries a digest of its content)
ROWS_CACHE_VERSION = 2
#: ``0``/``off``/``no``/``false``: no cache; a folder: where the caches go; unset: beside the dataset
CACHE_ENV = "VSE_CAPTION_CACHE"
CACHE_SUFFIX = ".vse-captions"
ROWS_FILE = "dataset-rows.npz"
#: a smaller ``dataset.json`` is parsed at every load (Flickr8k's 8 MB takes about 0.3 s), with no file
MIN_CACHED_BYTES = 4 << 20
_OFF = {"0", "off", "no", "false"}
#: value types a cached table may hold: what JSON gives back as it was given
_PLAIN = (str, int, bool, type(None))
_TEXTS = ("filenames", "raws", "tokens")
_VALUES = ("filepaths", "splits", "karpathy_splits", "langs")
_INTS = ("cocoids", "sentids")
#: what each column has one row for: ``n`` images or ``m`` sentences
_COUNT = {"filenames": "n", "filepaths": "n", "splits": "n", "karpathy_splits": "n", "cocoids": "n",
          "raws": "m", "tokens": "m", "langs": "m", "sentids": "m"}
_INT64, _INT32, _BYTES = ("int64",), ("int32",), ("uint8",)


def _members() -> dict[str, Member]:
    """Every array a rows cache may hold, with its dtype and shape (``n`` images, ``m`` sentences; a column
    of values is int64 values or int32 codes into a table of the record, so each form is optional)."""
    members = {"record": Member(_BYTES, shape=("record",)), "starts": Member(_INT64, shape=("n+1",)),
               "tokens.empty": Member(_INT64, shape=("empty",))}
    for name in _TEXTS:
        members[f"{name}.text"] = Member(_BYTES, shape=(f"{name}_bytes",))
        members[f"{name}.offsets"] = Member(_INT64, shape=(f"{_COUNT[name]}+1",))
    for name in (*_VALUES, *_INTS):
        members[name] = Member(_INT64, shape=(_COUNT[name],), optional=True)
        members[f"{name}.codes"] = Member(_INT32, shape=(_COUNT[name],), optional=True)
    return members


_MEMBERS = _members()


def _bounds(most: int) -> dict[str, int]:
    """The most each length of a rows cache may declare for a ``dataset.json`` of ``most`` bytes: every
    image, sentence and token costs bytes there, a JSON string is never shorter than its UTF-8, and the
    record re-encodes values JSON may write shorter (``1e5`` is ``100000.0``)."""
    return {"n": most, "m": most, "empty": most, **{f"{t}_bytes": most for t in _TEXTS},
            "record": 4 * most + (64 << 10)}


def cache_folder(root: Path) -> Path | None:
    """Where the caches of the prepared dataset ``root`` go (``VSE_CAPTION_CACHE``), or None: no cache."""
    setting = os.environ.get(CACHE_ENV, "").strip()
    if setting.lower() in _OFF:
        return None
    if not setting:
        return root.parent / (root.name + CACHE_SUFFIX)
    return Path(setting).expanduser() / f"{root.name}-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"


def rows_cache_file(root: Path, size: int) -> Path | None:
    """The rows cache of the prepared dataset ``root`` whose ``dataset.json`` has ``size`` bytes, or None
    when it has none (caches off, or a small file)."""
    folder = cache_folder(root)
    return None if folder is None or size < MIN_CACHED_BYTES else folder / ROWS_FILE


def text_arrays(column: TextColumn) -> tuple[np.ndarray, np.ndarray]:
    """A column of strings as ``(UTF-8 bytes (S,) uint8, character offsets (M + 1,) int64)`` (lone
    surrogates kept, as JSON can give them)."""
    return np.frombuffer(column.text.encode("utf-8", "surrogatepass"), dtype=np.uint8), column.offsets


def text_column(data: np.ndarray, offsets: np.ndarray, n: int) -> TextColumn:
    """The column of ``n`` strings :func:`text_arrays` wrote, checked: a ValueError naming what is wrong
    (dtypes or lengths, text that is not UTF-8, offsets that do not fit it)."""
    if data.dtype != np.uint8 or data.ndim != 1 or offsets.dtype != np.int64 or offsets.shape != (n + 1,):
        raise ValueError(f"text {data.dtype} {data.shape}, offsets {offsets.dtype} {offsets.shape}")
    text = data.tobytes().decode("utf-8", "surrogatepass")
    if offsets[0] != 0 or offsets[-1] != len(text) or (np.diff(offsets) < 0).any():
        raise ValueError("offsets do not fit the text")
    return TextColumn.of(text, offsets)


def _plain(values: list[Any]) -> bool:
    return all(type(v) in _PLAIN for v in values)


def write_rows_cache(path: Path, sha256: str, rows: DatasetRows, meta: dict[str, Any]) -> bool:
    """Keep ``rows`` (and ``meta``: the file's other top-level fields, JSON) in ``path`` for the
    ``dataset.json`` bytes of SHA-256 ``sha256``; False (no file) when a column would not come back
    exactly. An unwritable folder is one detail line, not an error."""
    arrays: dict[str, np.ndarray] = {}
    kinds: dict[str, Any] = {}
    for name in _TEXTS:
        column = getattr(rows, name)
        text = column.text if isinstance(column, TokenColumn) else column
        if text.values is not None:
            return False
        arrays[f"{name}.text"], arrays[f"{name}.offsets"] = text_arrays(text)
    if any(rows.tokens.odd.values()):
        return False  # only a sentence without tokens may be odd in a cached file
    arrays["tokens.empty"] = np.asarray(sorted(rows.tokens.odd), dtype=np.int64)
    for name in (*_VALUES, *_INTS):
        column = getattr(rows, name)
        if isinstance(column, np.ndarray):
            arrays[name] = column
            kinds[name] = None
            continue
        if column.values is not None or not _plain(column.table):
            return False
        arrays[f"{name}.codes"] = column.codes
        kinds[name] = column.table
    originals = [[k, v] for k, v in sorted(rows.originals.items())]
    try:
        encoded = json.dumps({"version": ROWS_CACHE_VERSION, "dataset_sha256": sha256, "meta": meta,
                              "tables": kinds, "images_root": rows.images_root, "originals": originals},
                             ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return False
    back = json.loads(encoded)
    if back["originals"] != originals or back["meta"] != meta:
        return False
    arrays["record"] = np.frombuffer(encoded.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    arrays["starts"] = rows.starts
    try:
        write_npz(path, arrays)  # with a digest of the arrays, which every read checks
    except OSError as exc:  # a read-only or full disk: the rows are still right, only not kept
        console.detail(f"dataset cache {path} not written ({exc.strerror or exc}); parsed at every load")
        return False
    return True


def read_rows_cache(path: Path, sha256: str, dataset_bytes: int | None = None
                    ) -> tuple[DatasetRows, dict[str, Any]] | str:
    """``(rows, meta)`` from ``path`` when it was made from the ``dataset.json`` bytes of SHA-256
    ``sha256`` and everything checks out (the module docstring's order), else why not (a phrase; any error
    a hostile file can raise, MemoryError included, is one). ``dataset_bytes``: the size of that
    ``dataset.json``, the bound of every length the file may declare (without it, the file's own size)."""
    try:
        most = path.stat().st_size if dataset_bytes is None else dataset_bytes
        arrays = read_npz(path, _MEMBERS, _bounds(most), digest=True)
        record = json.loads(arrays.pop("record").tobytes().decode("utf-8", "surrogatepass"))
        if record.get("version") != ROWS_CACHE_VERSION:
            return "made by another version"
        if record.get("dataset_sha256") != sha256:
            return "made for another dataset"
        rows = _rows_of(arrays, record)
    except NoDigest:
        return "made by another version (no digest)"
    except ContainerError as exc:
        return str(exc)
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        return f"damaged ({one_line(exc)})"
    except Exception as exc:  # whatever else a hostile file raises: a rebuild, never a traceback
        return f"unreadable ({one_line(exc)})"
    if isinstance(rows, str):
        return rows
    return rows, record["meta"]


def _array(arrays: dict[str, np.ndarray], name: str, dtype: type, n: int | None = None) -> np.ndarray:
    a = arrays[name]
    if a.dtype != dtype or a.ndim != 1 or (n is not None and len(a) != n):
        raise ValueError(f"array {name}: {a.dtype} {a.shape}")
    return a


def _text(arrays: dict[str, np.ndarray], name: str, n: int) -> TextColumn:
    try:
        return text_column(arrays[f"{name}.text"], arrays[f"{name}.offsets"], n)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _values(arrays: dict[str, np.ndarray], name: str, table: Any, n: int) -> np.ndarray | ValueColumn:
    if table is None:
        return _array(arrays, name, np.int64, n)
    codes = _array(arrays, f"{name}.codes", np.int32, n)
    if type(table) is not list or not _plain(table) or (n and (codes.min() < 0 or codes.max() >= len(table))):
        raise ValueError(f"{name}: codes outside its table")
    return ValueColumn.of(codes, table)


def _rows_of(arrays: dict[str, np.ndarray], record: dict[str, Any]) -> DatasetRows | str:
    tables = record["tables"]
    if any(tables[name] is None for name in _VALUES):
        return "a column of values without its table"
    expected = {"starts", "tokens.empty", *(f"{t}.{part}" for t in _TEXTS for part in ("text", "offsets")),
                *(n if tables[n] is None else f"{n}.codes" for n in (*_VALUES, *_INTS))}
    if set(arrays) != expected:
        return f"arrays {sorted(arrays)} instead of {sorted(expected)}"
    starts = _array(arrays, "starts", np.int64)
    n = len(starts) - 1
    if n < 0 or starts[0] != 0 or (np.diff(starts) < 0).any():
        return "image starts not ascending from 0"
    m = int(starts[-1])
    images = {name: _values(arrays, name, tables[name], n) for name in ("filepaths", "splits",
                                                                        "karpathy_splits", "cocoids")}
    sentences = {name: _values(arrays, name, tables[name], m) for name in ("langs", "sentids")}
    tokens = _text(arrays, "tokens", m)
    empty = _array(arrays, "tokens.empty", np.int64)
    if len(empty) and (empty.min() < 0 or empty.max() >= m or (np.diff(empty) <= 0).any()
                       or (np.diff(tokens.offsets)[empty] != 0).any()):
        return "sentences without tokens out of place"
    originals = {int(k): v for k, v in record["originals"]}
    if any(not 0 <= k < m for k in originals):
        return "originals of sentences out of range"
    return DatasetRows(
        images_root=str(record["images_root"]), filenames=_text(arrays, "filenames", n),
        filepaths=images["filepaths"], splits=images["splits"], cocoids=images["cocoids"],
        karpathy_splits=images["karpathy_splits"], starts=starts, sentids=sentences["sentids"],
        sentence_image=np.repeat(np.arange(n, dtype=np.int64), np.diff(starts)),
        raws=_text(arrays, "raws", m), tokens=TokenColumn.of(tokens, {k: () for k in empty.tolist()}),
        langs=sentences["langs"], originals=originals)


def cached_rows(path: Path | None, sha256: str, dataset_bytes: int | None = None
                ) -> tuple[DatasetRows, dict[str, Any]] | None:
    """The rows kept in ``path`` for the ``dataset.json`` bytes of SHA-256 ``sha256`` (``dataset_bytes``
    long: :func:`read_rows_cache`), or None (no file, or one of another version or for other bytes: a
    detail line; a damaged or unreadable one: a warning line)."""
    if path is None or not path.is_file():
        return None
    found = read_rows_cache(path, sha256, dataset_bytes)
    if isinstance(found, str):
        say = console.detail if found.startswith("made ") else console.warning
        say(f"dataset cache {path}: {found}; reading dataset.json again")
        return None
    return found
