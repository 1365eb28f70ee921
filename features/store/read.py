"""Reading a feature store: the checks every reader runs on opening, and the whole-array readers.

:func:`read_matrix` (``global``, ``fne``, ``fne_raw``, ``regions`` as one array) and :func:`read_regions`
(regions with their boxes, counts and image sizes) open a store through :func:`_open_for_reading`: the spec
(:class:`features.store.spec.FeatureSpec`), the store made for the dataset's images
(:func:`check_store_matches`), complete, its valid flags and imgid column agreeing with its records
(:func:`check_row_records`), and a rewrite during the read refused (:func:`consistent_read`).
:mod:`features.store.rows` reads rows a batch at a time with the same checks. The writer is
:class:`features.store.core.FeatureStore`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from features.store.array import StoreArray
from features.store.chunk_read import read_whole
from features.store.core import FeatureStore
from features.store.layout import MAX_ARRAY_METADATA_BYTES, rows_per_file
from features.store.spec import SPEC_ARRAYS, FeatureSpec
from prep.dataset import DATASET_FILE, PreparedDataset
from vsecore.errors import UserError
from vsecore.io import sha256_file
from vsecore.jsonfile import read_json

#: the per-row arrays of a region store (``features regions``, ``features import --format
#: scan-precomp|butd-tsv``)
REGION_ARRAYS = ("regions", "boxes", "counts", "image_size")


def parse_spec(spec: str) -> tuple[Path, str | None]:
    """``"PATH.zarr:key"`` -> ``(PATH.zarr, key)``; a bare path -> ``(path, None)`` (:class:`FeatureSpec`)."""
    parsed = FeatureSpec.parse(spec)
    return parsed.store, parsed.key


def check_store_matches(store: FeatureStore, dataset: PreparedDataset) -> None:
    """A one-line :class:`UserError` unless ``store``'s rows are those of the prepared ``dataset``.

    The identity is ``images_sha256`` (:meth:`PreparedDataset.images_fingerprint`: the ordered image
    paths and their splits), recorded in the config and provenance of every store written since it
    exists: captions and vocabularies may change, images, their order and splits may not. Older
    stores fall back to ``dataset_sha256`` (the SHA-256 of the whole ``dataset.json``, so a store
    is then refused after captions were re-prepared), and stores recording neither (written by
    hand or by tests) to the row count alone. The error names the store, the dataset recorded in
    it, and ``dataset``.
    """
    attrs = store.attrs
    config, prov = attrs.get("config", {}) or {}, attrs.get("provenance", {}) or {}
    recorded_at = prov.get("dataset", "an unrecorded dataset")
    images = config.get("images_sha256") or prov.get("images_sha256")
    whole = config.get("dataset_sha256") or prov.get("dataset_sha256")
    if images:
        mine, what, differ = dataset.images_fingerprint(), "images_sha256", "their images, order or splits"
    elif whole:
        images, mine, what = whole, sha256_file(dataset.root / DATASET_FILE), "dataset.json sha256"
        differ = "their dataset.json files (an older store, identified by the whole file)"
    else:
        images, mine, what = str(store.n_rows), str(len(dataset.images)), "rows"
        differ = "their numbers of images"
    if images != mine or store.n_rows != len(dataset.images):
        raise UserError(f"{store.path}: this feature store was made for the prepared dataset {recorded_at} "
                        f"({what} {images[:12]}), not for {dataset.root} ({what} {mine[:12]}): {differ} "
                        "differ; extract features for this dataset (or use its own store)")


def _open_for_reading(spec: str, dataset: PreparedDataset | str | os.PathLike | None
                      ) -> tuple[FeatureStore, Path, str]:
    """The finished store of ``spec`` (checked against ``dataset``), its path and the array name to read.

    A store being rewritten (or written) is a one-line error (:meth:`FeatureStore.check_readable`).
    """
    parsed = FeatureSpec.parse(spec)
    path = parsed.store
    store = FeatureStore(path)
    if dataset is not None:
        if not isinstance(dataset, PreparedDataset):
            dataset = PreparedDataset.load(dataset)
        check_store_matches(store, dataset)
    store.check_readable(store.opened_state)
    with consistent_read(store):  # a rewrite starting now explains what these checks see
        store.require_complete()
        key = parsed.key_in(store.has)
        name = SPEC_ARRAYS[key]
        if not store.has(name):
            have = [k for k, n in SPEC_ARRAYS.items() if store.has(n)]
            raise UserError(f"{path}: no '{key}' features in this store (it has: "
                            f"{', '.join(have) or 'none'})")
    return store, path, name


@contextlib.contextmanager
def consistent_read(store: FeatureStore) -> Iterator[None]:
    """Read ``store`` in the body; a rewrite that overlapped the read (its generation changed, or an
    error came from a folder being replaced) is a one-line UserError instead of mixed or NaN rows."""
    before = store.opened_state
    try:
        yield
    except Exception:
        store.check_unchanged(before)  # the rewrite explains the error
        raise
    store.check_unchanged(before)


def _read_checked(store: FeatureStore, path: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(stored array, valid (N,) bool)``; a valid row that is not finite, or rows that disagree with
    their records (:func:`check_row_records`), is a UserError."""
    valid = np.asarray(store.array("valid")[:], dtype=bool)
    check_row_records(store, valid)
    # the store's generation catches a rewrite; the array's own identity catches its replacement by
    # --rethreshold's swap even without it (a second, independent check)
    identity = store.array_identity(name)
    stored = _read_whole(store.array(name))
    store.check_array_unchanged(name, identity)
    bad = first_nonfinite_row(stored, valid)  # int8 ternary rows are always finite
    if bad is not None:
        raise UserError(f"{path}: row {bad} (imgid {bad}) of '{name}' is marked valid but is not finite "
                        f"(NaN or inf); run `features verify {path} --repair`, then the store's "
                        "`features` command to recompute it")
    return stored, valid


def _read_whole(array: StoreArray) -> np.ndarray:
    """Every row of ``array`` in its stored dtype: straight from the chunk files where the layout is the
    writer's (:func:`features.store.chunk_read.read_whole`), else through Zarr; a damaged chunk is named."""
    try:
        whole = read_whole(array)
    except Exception as exc:  # noqa: BLE001 - zstd, the frame check, the file: name the damaged chunk
        error = array._damage(slice(None), exc)
        if error is not exc:
            raise error from None
        whole = None  # no chunk is damaged by Zarr's reading: read it Zarr's way
    return whole if whole is not None else np.asarray(array[:])


#: imgid chunks the reader checks (evenly spaced, the first and the last included; verify reads all)
IMGID_SAMPLE_CHUNKS = 16


def check_row_records(store: FeatureStore, valid: np.ndarray) -> None:
    """A one-line UserError unless ``valid`` (N,) is False exactly at the failed images (imported
    stores: at least there) and the ``imgid`` column is the row number.

    Cheap enough for every read (under 1% of reading a large store, ``bench/bench_store_safety.py``):
    ``valid`` is first compared with the failures the store's attributes list (no read); only when they
    differ are the blocks' own ``failures`` records read, and they decide. ``imgid`` is read in
    :data:`IMGID_SAMPLE_CHUNKS` chunks (it is written once, when the store is created; ``features
    verify`` checks every chunk).
    """
    path = store.path
    fix = f"run `features verify {path} --repair`, then the store's `features` command to recompute it"
    imported = store.attrs.get("config", {}).get("kind") == "import"
    if not _valid_matches(valid, store.attrs.get("failures") or [], imported):
        failed = _failed_mask(store.block_failures(), len(valid))
        wrongly_valid = np.flatnonzero(failed & valid)
        if len(wrongly_valid):
            raise UserError(f"{path}: imgid {int(wrongly_valid[0])} is recorded as failed but marked valid "
                            f"({len(wrongly_valid)} such rows); {fix}")
        unexplained = np.flatnonzero(~failed & ~valid)
        if len(unexplained) and not imported:
            raise UserError(f"{path}: imgid {int(unexplained[0])} is invalid without a recorded failure "
                            f"({len(unexplained)} such rows); {fix}")
    arr = store.array("imgid")
    rows = rows_per_file(arr.zarr)
    n_chunks = math.ceil(len(valid) / rows) if len(valid) else 0
    chunks = sorted({int(c) for c in np.linspace(0, n_chunks - 1, min(IMGID_SAMPLE_CHUNKS, n_chunks))})
    index = np.concatenate([np.arange(c * rows, min((c + 1) * rows, len(valid))) for c in chunks]) if chunks \
        else np.zeros(0, dtype=np.int64)
    imgid = np.asarray(arr.oindex[index])  # a damaged or missing chunk: one line naming it
    wrong = np.flatnonzero(imgid != index)
    if len(wrong):
        r = int(index[wrong[0]])
        raise UserError(f"{path}: row {r} holds imgid {int(imgid[wrong[0]])}, not {r} (the rows are not in "
                        f"the dataset's order); {fix}")


def _failed_mask(failures: list[dict[str, Any]], n: int) -> np.ndarray:
    """(n,) bool: True at the imgids of ``failures``."""
    failed = np.zeros(n, dtype=bool)
    for f in failures:
        i = int(f.get("imgid", -1)) if isinstance(f, dict) else -1
        if 0 <= i < n:
            failed[i] = True
    return failed


def _valid_matches(valid: np.ndarray, failures: list[dict[str, Any]], imported: bool) -> bool:
    """Whether ``valid`` is False exactly at ``failures`` (imported: at least there)."""
    failed = _failed_mask(failures, len(valid))
    return not (failed & valid).any() and (imported or bool((failed | valid).all()))


def read_matrix(spec: str, dataset: PreparedDataset | str | os.PathLike | None = None,
                keep_dtype: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Read a feature matrix for training: ``(x float32 (N, C) or (N, k, D), valid bool (N,))``.

    ``spec`` is ``"PATH.zarr:global"``, ``"PATH.zarr:fne"`` (the ternary FNE as float32),
    ``"PATH.zarr:fne_raw"`` (the raw averaged activations) or ``"PATH.zarr:regions"`` (region
    features ``(N, k, D)``, all-zero rows after an image's real regions: :func:`read_regions` also
    gives the counts); a bare path picks ``global`` if the store has it, else ``fne``, else
    ``regions``. Rows of failed images are NaN and ``valid`` is False there.
    ``keep_dtype``: return the stored dtype instead (the int8 ternary FNE stays int8, 4x smaller
    than float32; rows of failed images are then whatever is stored: use ``valid``).
    ``dataset`` (a :class:`PreparedDataset` or its folder): refuse a store made for another one
    (:func:`check_store_matches`). A valid row that is not finite, or a damaged chunk, is a
    one-line :class:`UserError` pointing to ``features verify``.
    """
    store, path, name = _open_for_reading(spec, dataset)
    with consistent_read(store):
        stored, valid = _read_checked(store, path, name)
    if keep_dtype:
        return stored, valid
    x = stored.astype(np.float32, copy=False)
    if not valid.all():
        x[~valid] = np.nan
    return x, valid


@dataclass(frozen=True)
class RegionFeatures:
    """A region store read for training (:func:`read_regions`).

    Attributes:
        regions: ``(N, k, D)`` float32; rows ``counts[i]..k-1`` of image ``i`` are zero padding; every row
            of a failed image (``valid`` False) is NaN.
        counts: ``(N,)`` int64, real regions per image (``1..k`` for valid rows, 0 for failed ones).
        valid: ``(N,)`` bool.
        boxes: ``(N, k, 4)`` float32 ``x1, y1, x2, y2`` in pixels of the image, or ``None`` when the
            store has none (SCAN precomp imports).
    """

    regions: np.ndarray
    counts: np.ndarray
    valid: np.ndarray
    boxes: np.ndarray | None = None


def stored_region_counts(store: FeatureStore, valid: np.ndarray | None = None) -> np.ndarray | None:
    """The store's ``counts`` (N,) int64 (real regions per image), 0 where ``valid`` (N,) is False;
    None when the store has no ``counts`` array (a hand-written region store)."""
    if not store.has("counts"):
        return None
    counts = np.asarray(store.array("counts")[:], dtype=np.int64).reshape(-1)
    if valid is not None:
        counts[~np.asarray(valid, dtype=bool)] = 0
    return counts


def read_regions(spec: str, dataset: PreparedDataset | str | os.PathLike | None = None,
                 with_boxes: bool = False) -> RegionFeatures:
    """Read a region store for training: features, per-image region counts (to mask padding), validity.

    ``spec``: ``"PATH.zarr"`` or ``"PATH.zarr:regions"``; ``dataset`` as for :func:`read_matrix`.
    ``with_boxes`` also reads ``boxes`` when the store has them. A store without ``counts`` (written
    by hand) counts the leading rows of each image that are not all zero.
    """
    path, key = parse_spec(spec)
    if key not in (None, "regions"):
        raise UserError(f"{spec}: read_regions reads region stores (PATH.zarr or PATH.zarr:regions)")
    store, path, name = _open_for_reading(f"{path}:regions", dataset)
    with consistent_read(store):
        stored, valid = _read_checked(store, path, name)
        counts = stored_region_counts(store, valid)
        boxes = None
        if with_boxes and store.has("boxes"):
            boxes = np.asarray(store.array("boxes")[:], dtype=np.float32)
    x = stored.astype(np.float32, copy=False)
    if counts is None:
        nonzero = np.abs(np.nan_to_num(x)).reshape(*x.shape[:2], -1).sum(axis=2) != 0
        counts = x.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)
        counts[~nonzero.any(axis=1)] = 0
    counts[~valid] = 0
    if not valid.all():
        x[~valid] = np.nan
    bad = np.flatnonzero(valid & ((counts < 1) | (counts > x.shape[1])))
    if len(bad):
        raise UserError(f"{path}: imgid {int(bad[0])} is valid but has {int(counts[bad[0]])} regions "
                        f"(expected 1..{x.shape[1]}); run `features verify {path}`")
    return RegionFeatures(x, counts, valid, boxes)


#: per float size: the unsigned type of its bits and its exponent field
_EXPONENT_BITS = {2: (np.uint16, np.uint16(0x7C00)), 4: (np.uint32, np.uint32(0x7F800000)),
                  8: (np.uint64, np.uint64(0x7FF0000000000000))}


def first_nonfinite_row(x: np.ndarray, valid: np.ndarray, chunk_rows: int = 4096) -> int | None:
    """The first row of ``x`` (N, C) where ``valid`` (N,) is True but a value is NaN or inf, else None.

    Checked ``chunk_rows`` rows at a time so the boolean temporary stays small.
    """
    if x.dtype.kind != "f":
        return None
    unsigned, exponent = _EXPONENT_BITS[x.dtype.itemsize]
    for start in range(0, x.shape[0], chunk_rows):
        block = np.ascontiguousarray(x[start:start + chunk_rows])
        # NaN and inf are the values whose exponent bits are all set: integer masks, 3x faster than
        # np.isfinite on float16 rows (which converts each value)
        bits = block.view(unsigned).reshape(block.shape[0], -1)
        rows = ((bits & exponent).max(axis=1, initial=0) == exponent) & valid[start:start + chunk_rows]
        if rows.any():
            return start + int(np.flatnonzero(rows)[0])
    return None


#: the fields of an array's zarr.json that say how its bytes are rows (its attributes are not layout)
LAYOUT_FIELDS = ("shape", "data_type", "chunk_grid", "chunk_key_encoding", "codecs", "fill_value",
                 "dimension_names")


def layout_digest(spec: str) -> str:
    """SHA-256 of how the array ``STORE[:key]`` lays out its rows: its ``zarr.json`` fields
    :data:`LAYOUT_FIELDS` (data type, shape, chunking, codecs, fill value), canonically serialised.

    A run records it beside :func:`train.config.run.features_fingerprint` (which samples row bytes):
    the same bytes under another data type, shape or codec are other features. Called beside a read of
    the same store (whose open checked its record), so only that one small file is read here, bounded as
    every array record is; the store is opened only for a ternary array caught mid ``--rethreshold``.
    """
    parsed = FeatureSpec.parse(spec)
    name = SPEC_ARRAYS[parsed.key_in(lambda n: (parsed.store / n / "zarr.json").is_file())]
    meta = parsed.store / name / "zarr.json"
    if not meta.is_file():
        meta = FeatureStore(parsed.store).array_folder(name) / "zarr.json"
    record = read_json(meta, "the array metadata", most=MAX_ARRAY_METADATA_BYTES)
    layout = {k: record.get(k) for k in LAYOUT_FIELDS} if isinstance(record, dict) else record
    if isinstance(layout, dict):
        layout["codecs"] = _compression_as_zstd(layout.get("codecs"))
    return hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()


#: the inner compressor of a row array as Zarr writes its default zstd (and every store did before
#: ``--codec``): the one a digest names for any compressor
_ZSTD_RECORD = {"name": "zstd", "configuration": {"level": 0, "checksum": False}}


def _compression_as_zstd(codecs: Any) -> Any:
    """``codecs`` of an array's ``zarr.json`` with each compressor (``zstd`` at any level, ``blosc``; at any
    depth: the inner chunks of a shard) written as :data:`_ZSTD_RECORD`: a store converted by ``features
    recompress`` holds the same rows, so its :func:`layout_digest` is its source's (and every store the
    writer made before, all zstd level 0, keeps its digest)."""
    if isinstance(codecs, list):
        return [_compression_as_zstd(c) for c in codecs]
    if isinstance(codecs, dict):
        if codecs.get("name") in ("zstd", "blosc"):
            return dict(_ZSTD_RECORD)
        return {k: _compression_as_zstd(v) if k in ("configuration", "codecs") else v
                for k, v in codecs.items()}
    return codecs
