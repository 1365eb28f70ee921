"""Readers for the region features users already have: SCAN precomp ``.npy`` and bottom-up-attention TSV.

Both readers give a :class:`RegionSource`: which prepared-dataset rows they hold, and random access to one
image's regions (:meth:`RegionSource.read`) or to rows in ascending dataset order
(:meth:`RegionSource.iter_rows`), so a writer fills a store block by block without ever holding a whole
file (COCO's files are 33 GB of precomp float32 or ~45 GB of TSV text). What did not match is reported:
``missing`` (dataset rows the source lacks) and ``extra`` (source ids the dataset lacks).

SCAN / VSE++ precomp (:func:`read_scan_precomp`): ``{split}_ims.npy`` of shape ``(n, k, D)`` (SCAN's
``coco_precomp`` / ``f30k_precomp``: ``k = 36``, ``D = 2048``), opened with ``mmap_mode="r"``: nothing is
copied until a row is read. Rows are the split's images in the prepared dataset's order (the same rule as
``features.interop.imports.import_npy``), or, with ``ids`` (one id per row, e.g. SCAN's ``{split}_ids.txt``),
matched by id. Files with each image repeated ``m`` times in a row (older precomp files store one row per
caption) are recognised when ``n = m * images`` and the first ``m`` rows are equal; every ``m``-th row is
used. No boxes, no image size.

Bottom-up-attention TSV (:class:`ButdTsv`): the format of ``generate_tsv.py`` (Anderson et al. 2018) and of
its PyTorch/detectron2 ports, no header, tab-separated fields ``image_id, image_w, image_h, num_boxes, boxes,
features`` (further fields are ignored), where ``boxes`` and ``features`` are base64 of float32 arrays of
``num_boxes x 4`` (``x1, y1, x2, y2`` pixels) and ``num_boxes x D``. A first streaming pass indexes every
line (byte offset, id, box count: only the first four fields are split, nothing is decoded); reads then seek
to one line. Fields are split on tabs by hand, so Python's ``csv.field_size_limit`` (128 KiB, smaller than one
features field of 36 x 2048 floats, ~393 KB) never applies. A ``b'...'`` wrapper around a base64 field
(written by Python 3 ports that ``str()`` the bytes) is accepted. Several files (BUTD ships trainval as
``.tsv.0`` .. ``.tsv.3``) form one source; an id in two lines is an error naming both.

Ids are matched as strings, digits compared as numbers (``"000391895"`` is ``391895``): a dataset image's
key is its ``cocoid`` when it has one (COCO, YJ Captions), else its file name without extension
(Flickr30k ``1000092795.jpg`` -> ``1000092795``); a ``COCO_<split>_<digits>`` file name also yields its
number.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from prep.dataset import PreparedDataset
from vsecore.containers import ContainerError, npy_header
from vsecore.errors import UserError

#: the fields of a bottom-up-attention TSV line, in order
BUTD_FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
_COCO_NAME = re.compile(r"^COCO_[A-Za-z0-9]+_0*(\d+)$")


@dataclass(frozen=True)
class RegionRecord:
    """One image's regions as a source stores them: ``features (n, D)`` float32, ``boxes (n, 4)`` float32
    or ``None``, ``image_size`` ``(width, height)`` or ``None``."""

    features: np.ndarray
    boxes: np.ndarray | None = None
    image_size: tuple[int, int] | None = None

    def padded(self, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        """``(features (k, D), boxes (k, 4), count)``: zero rows after the ``count = n`` real regions
        (boxes all zero when the source has none). More than ``k`` regions is an error."""
        n, dim = self.features.shape
        if n > k:
            raise ValueError(f"{n} regions do not fit in k = {k}")
        feats = np.zeros((k, dim), dtype=np.float32)
        feats[:n] = self.features
        boxes = np.zeros((k, 4), dtype=np.float32)
        if self.boxes is not None:
            boxes[:n] = self.boxes
        return feats, boxes, n


class _Reader(Protocol):
    def read(self, row: int) -> RegionRecord: ...


def image_key(value: object) -> str:
    """Normalised id: digits as a number without leading zeros, ``COCO_x_000123`` as ``123``, otherwise
    the string itself (a file name loses its extension)."""
    text = str(value).strip()
    if text.isdigit():
        return str(int(text))
    stem = Path(text).stem if "." in text else text
    if stem.isdigit():
        return str(int(stem))
    match = _COCO_NAME.match(stem)
    return str(int(match.group(1))) if match else stem


def dataset_keys(dataset: PreparedDataset) -> dict[str, int]:
    """Key -> row of every image of ``dataset`` (``cocoid`` when known, else the file name's stem).
    Two images with one key is an error."""
    keys: dict[str, int] = {}
    for im in dataset.images:
        key = image_key(im.cocoid if im.cocoid is not None else im.filename)
        if key in keys:
            raise UserError(f"{dataset.root}: images {keys[key]} and {im.imgid} share the id {key!r}; "
                            "region features cannot be matched to them")
        keys[key] = im.imgid
    return keys


@dataclass
class RegionSource:
    """Region features of a file (or files) matched to a prepared dataset's rows.

    Attributes:
        format: ``"scan-precomp"`` or ``"butd-tsv"``.
        k: the most regions any image has (fixed ``k`` for precomp).
        dim: ``D``, features per region.
        has_boxes: whether records carry boxes and image sizes.
        rows: dataset rows the source holds, ascending.
        missing: dataset rows (of the split(s) asked for) the source lacks.
        extra: source ids that match no dataset image.
    """

    format: str
    k: int
    dim: int
    has_boxes: bool
    rows: np.ndarray
    missing: list[int]
    extra: list[str]
    _reader: _Reader | None = field(repr=False, default=None)

    def read(self, row: int) -> RegionRecord:
        """The regions of dataset row ``row`` (a ``KeyError`` if the source lacks it)."""
        assert self._reader is not None
        return self._reader.read(int(row))

    def iter_rows(self, rows: Iterable[int] | None = None) -> Iterator[tuple[int, RegionRecord]]:
        """``(row, record)`` for ``rows`` (default: all the source holds), in ascending row order."""
        wanted = self.rows if rows is None else np.unique(np.asarray(list(rows), dtype=np.int64))
        for row in wanted:
            yield int(row), self.read(int(row))

    def summary(self) -> str:
        """One line: format, shapes, matched / missing / extra counts with a few examples."""
        line = f"{self.format}: {len(self.rows)} images matched, {self.k} x {self.dim} regions"
        if self.missing:
            line += f"; {len(self.missing)} missing (imgid {', '.join(map(str, self.missing[:3]))}"
            line += ", ...)" if len(self.missing) > 3 else ")"
        if self.extra:
            line += f"; {len(self.extra)} extra ids (e.g. {', '.join(self.extra[:3])})"
        return line


def _split_rows(dataset: PreparedDataset, splits: Sequence[str] | None) -> list[int]:
    if not splits:
        return dataset.image_rows()
    return sorted(r for s in splits for r in dataset.image_rows(s))


# --- SCAN / VSE++ precomp ------------------------------------------------------------------------------


class _PrecompReader:
    def __init__(self, array: np.ndarray, row_index: dict[int, int], step: int) -> None:
        self.array, self.row_index, self.step = array, row_index, step

    def read(self, row: int) -> RegionRecord:
        i = self.row_index[row] * self.step
        return RegionRecord(np.asarray(self.array[i], dtype=np.float32))


def _read_ids(ids: str | os.PathLike | Sequence[object]) -> list[str]:
    if isinstance(ids, (str, os.PathLike)):
        path = Path(ids)
        try:
            lines = path.read_text(encoding="utf-8").split()
        except OSError as exc:
            raise UserError(f"{path}: cannot read the ids file: {exc.strerror or exc}") from None
        return [image_key(x) for x in lines]
    return [image_key(x) for x in ids]


def _repeat_step(array: np.ndarray, n_images: int, file: Path) -> int:
    """1, or ``m`` when the file has ``m`` consecutive copies of every image (checked on the first)."""
    n = array.shape[0]
    if n == n_images:
        return 1
    if n_images and n % n_images == 0:
        m = n // n_images
        first = np.asarray(array[0])
        if all(np.array_equal(first, np.asarray(array[j])) for j in range(1, m)):
            return m
    raise UserError(f"{file}: {n} rows, but the split has {n_images} images "
                    "(give the ids file to match rows by id)")


def read_scan_precomp(npy: str | os.PathLike, dataset: PreparedDataset, split: str,
                      ids: str | os.PathLike | Sequence[object] | None = None) -> RegionSource:
    """SCAN precomp ``(n, k, D)`` regions of ``split`` (memory-mapped; see the module docstring).

    Without ``ids``, row ``i`` is the split's ``i``-th image in dataset order; with ``ids`` (a file of
    whitespace-separated ids, or a sequence, one per row or ``m`` equal ones per ``m`` rows) rows are
    matched by id and ids outside the split are ``extra``.
    """
    npy = Path(npy)
    try:  # the header checked first: a FIFO, an object dtype or a forged shape is refused unread
        header = npy_header(npy)
        array = np.load(npy, mmap_mode="r", allow_pickle=False)
    except (ContainerError, OSError, ValueError) as exc:
        raise UserError(f"{npy}: cannot read as .npy: {getattr(exc, 'strerror', None) or exc}") from None
    if len(header.shape) != 3 or header.dtype.kind not in "fiu":
        raise UserError(f"{npy}: expected (images, regions, features) numbers, got {header.dtype} "
                        f"{header.shape}")
    split_rows = dataset.image_rows(split)
    if ids is None:
        step = _repeat_step(array, len(split_rows), npy)
        index = {row: i for i, row in enumerate(split_rows)}
        extra: list[str] = []
    else:
        keys = _read_ids(ids)
        label = str(ids) if isinstance(ids, (str, os.PathLike)) else "ids"
        if len(keys) != array.shape[0]:
            raise UserError(f"{label}: {len(keys)} ids for {array.shape[0]} rows of {npy}")
        step = 1
        m = 1
        while m < len(keys) and keys[m] == keys[0]:
            m += 1
        if m > 1 and len(keys) % m == 0 and all(
                len(set(keys[j : j + m])) == 1 for j in range(0, len(keys), m)):
            step, keys = m, keys[::m]  # one id per caption: m copies of each image row
        split_of = set(split_rows)
        by_key = dataset_keys(dataset)
        index, extra = {}, []
        for i, key in enumerate(keys):
            row = by_key.get(key)
            if row is None or row not in split_of:
                extra.append(key)
            elif row in index:
                raise UserError(f"{label}: id {key} appears at rows {index[row] * step} and {i * step}")
            else:
                index[row] = i
    rows = np.array(sorted(index), dtype=np.int64)
    missing = [r for r in split_rows if r not in index]
    return RegionSource("scan-precomp", int(array.shape[1]), int(array.shape[2]), False, rows, missing,
                        extra, _PrecompReader(array, index, step))


# --- bottom-up-attention TSV ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    file: int
    offset: int
    number: int
    num_boxes: int


def _decode(field_bytes: bytes, where: str, name: str) -> np.ndarray:
    text = field_bytes.strip()
    if text[:2] in (b"b'", b'b"') and text[-1:] in (b"'", b'"'):
        text = text[2:-1]
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UserError(f"{where}: field '{name}' is not base64: {exc}") from None
    if len(raw) % 4:
        raise UserError(f"{where}: field '{name}' holds {len(raw)} bytes, not float32 values")
    return np.frombuffer(raw, dtype=np.float32)


class ButdTsv:
    """A bottom-up-attention TSV (one file or several), indexed by one streaming pass.

    ``ButdTsv(paths)`` reads every line once (only the first four fields are split); ``read(image_key)``
    seeks to its line and decodes it; ``source(dataset)`` matches the ids to a dataset's rows.
    """

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike]) -> None:
        single = isinstance(paths, (str, os.PathLike))
        self.paths = [Path(p) for p in ([paths] if single else paths)]
        if not self.paths:
            raise UserError("butd-tsv: no TSV file given")
        self.index: dict[str, _Line] = {}
        self.dim: int | None = None
        for f, path in enumerate(self.paths):
            self._index_file(f, path)

    def _where(self, line: _Line) -> str:
        return f"{self.paths[line.file]}:{line.number}"

    def _index_file(self, f: int, path: Path) -> None:
        try:
            fh = open(path, "rb")
        except OSError as exc:
            raise UserError(f"{path}: cannot open: {exc.strerror or exc}") from None
        with fh:
            offset = 0
            for number, raw in enumerate(fh, start=1):
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                head = raw.split(b"\t", 4)
                if len(head) < 5:
                    raise UserError(f"{path}:{number}: expected the tab-separated fields "
                                    f"{', '.join(BUTD_FIELDS)}; found {len(head)} fields")
                try:
                    key = image_key(head[0].decode("utf-8"))
                    num_boxes = int(head[3])
                    if min(int(head[1]), int(head[2]), num_boxes) < 0:
                        raise ValueError

                except (UnicodeDecodeError, ValueError):
                    raise UserError(f"{path}:{number}: image_w, image_h and num_boxes must be counts, "
                                    f"got {b' '.join(head[1:4])[:80]!r}") from None
                line = _Line(f, start, number, num_boxes)
                if key in self.index:
                    raise UserError(f"{path}:{number}: image_id {key} already at "
                                    f"{self._where(self.index[key])}")
                self.index[key] = line

    def read(self, key: str) -> RegionRecord:
        """The regions of the image with id ``key`` (decoded, checked against ``num_boxes``)."""
        line = self.index[image_key(key)]
        where = self._where(line)
        with open(self.paths[line.file], "rb") as fh:
            fh.seek(line.offset)
            fields = fh.readline().rstrip(b"\r\n").split(b"\t")
        if len(fields) < len(BUTD_FIELDS):
            raise UserError(f"{where}: {len(fields)} fields, expected {len(BUTD_FIELDS)}")
        n = line.num_boxes
        boxes = _decode(fields[4], where, "boxes")
        feats = _decode(fields[5], where, "features")
        if boxes.size != 4 * n:
            raise UserError(f"{where}: {boxes.size} box values for num_boxes {n} (expected {4 * n})")
        if n == 0:
            raise UserError(f"{where}: num_boxes is 0")
        if feats.size % n:
            raise UserError(f"{where}: {feats.size} feature values do not split into {n} boxes")
        return RegionRecord(feats.reshape(n, -1).copy(), boxes.reshape(n, 4).copy(),
                            (int(fields[1]), int(fields[2])))

    def source(self, dataset: PreparedDataset, splits: Sequence[str] | None = None) -> RegionSource:
        """Match the TSV's ids to ``dataset`` (only rows of ``splits`` when given): rows found, missing
        rows, extra ids. ``D`` is read from the first matched line."""
        by_key = dataset_keys(dataset)
        wanted = set(_split_rows(dataset, splits))
        row_key: dict[int, str] = {}
        extra = []
        for key in self.index:
            row = by_key.get(key)
            if row is None:
                extra.append(key)
            elif row in wanted:
                row_key[row] = key
        rows = np.array(sorted(row_key), dtype=np.int64)
        missing = sorted(wanted - set(row_key))
        if len(rows):
            first = self.read(row_key[int(rows[0])])
            dim = first.features.shape[1]
            k = max(self.index[row_key[int(r)]].num_boxes for r in rows)
        else:
            dim = k = 0
        return RegionSource("butd-tsv", int(k), int(dim), True, rows, missing, extra,
                            _TsvReader(self, row_key, dim))


class _TsvReader:
    def __init__(self, tsv: ButdTsv, row_key: dict[int, str], dim: int) -> None:
        self.tsv, self.row_key, self.dim = tsv, row_key, dim

    def read(self, row: int) -> RegionRecord:
        record = self.tsv.read(self.row_key[row])
        if record.features.shape[1] != self.dim:
            line = self.tsv.index[self.row_key[row]]
            raise UserError(f"{self.tsv._where(line)}: {record.features.shape[1]} features per box, "
                            f"other lines have {self.dim}")
        return record


def read_butd_tsv(paths: str | os.PathLike | Sequence[str | os.PathLike], dataset: PreparedDataset,
                  splits: Sequence[str] | None = None) -> RegionSource:
    """Index the TSV file(s) ``paths`` and match them to ``dataset`` (see :class:`ButdTsv`)."""
    return ButdTsv(paths).source(dataset, splits)


def _encode(array: np.ndarray) -> str:
    """base64 of the array's float32 bytes (C order), as ``generate_tsv.py`` writes a field."""
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode("ascii")


def butd_tsv_lines(dataset: PreparedDataset, rows: Sequence[int], regions: np.ndarray, boxes: np.ndarray,
                   counts: np.ndarray, image_size: np.ndarray) -> Iterator[str]:
    """Bottom-up-attention TSV lines (:data:`BUTD_FIELDS`, tab-separated, newline-terminated) of the
    dataset rows ``rows``, from their region arrays.

    Args:
        dataset: the prepared dataset (each image's id: :func:`dataset_keys`, so the file matches back).
        rows: (B,) dataset rows of the arrays below.
        regions: (B, k, D) features, padded; boxes (B, k, 4) ``x1, y1, x2, y2`` pixels; counts (B,)
            real regions of each row; image_size (B, 2) width, height.
    """
    key_of = {row: key for key, row in dataset_keys(dataset).items()}
    for b, row in enumerate(rows):
        n = int(counts[b])
        width, height = (int(v) for v in image_size[b])
        yield "\t".join((key_of[int(row)], str(width), str(height), str(n), _encode(boxes[b, :n]),
                          _encode(regions[b, :n]))) + "\n"
