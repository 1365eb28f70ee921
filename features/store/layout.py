"""What a feature store's arrays look like on disk, and the check that a store read from elsewhere does.

One home for the layout the writer makes (:class:`features.store.core.FeatureStore` creates every array
with these helpers) and for the reader's check of it (:func:`check_store_layout`): a store is a folder
of small JSON files and chunk files that anyone may have edited, so before anything reads a row, the
store's own record of each array (shape, data type, chunking, codecs, fill value) is compared with
what the writer makes for the store's recorded configuration (``outputs``, ``dtypes``, ``block_size``,
the number of rows), every number is bounded (:data:`MAX_ROWS` ...), and every chunk file is a regular
file no larger than a chunk can encode to. A mismatch is a one-line :class:`UserError` naming the file
and the field, before any allocation (``docs/safety.md``, "Files read from others").
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.storage import MemoryStore

from features.store.codecs import store_codec
from vsecore.errors import UserError
from vsecore.io import regular_file_size
from vsecore.jsonfile import read_json

#: columns per chunk of wide (FNE) arrays: statistics read column slices without reading all rows
COLUMN_CHUNK = 2048
#: Zarr does not write a chunk equal to the fill value by default; the store writes every chunk, so
#: that a finished block's chunk file is never legitimately absent (``features verify``, resume)
ARRAY_CONFIG = {"write_empty_chunks": True}
#: rows of at least this many bytes (region features: 49 x 1280 float16 is 125 KB, 36 x 2048 float32 288 KB)
#: are stored one inner chunk per row inside one shard per block; smaller rows one chunk per block
SHARD_ROW_BYTES = 32 * 1024

#: the largest store a reader accepts: rows (images), values per row (VGG19's FNE has 12,416; 100
#: regions of 2,048 values 204,800), dimensions of a row, rows per block
MAX_ROWS = 1 << 26
MAX_ROW_VALUES = 1 << 22
MAX_ROW_DIMS = 2
MAX_BLOCK_SIZE = 1 << 20
#: the largest metadata files: an array's ``zarr.json``, the group's (its attributes hold the failures)
MAX_ARRAY_METADATA_BYTES = 1 << 20
#: the arrays readers read (``features.store.spec.SPEC_ARRAYS`` and their companions): each must be listed by
#: the store's record, so none is read unchecked
READ_ARRAYS = ("global", "regions", "boxes", "counts", "image_size", "fne/raw", "fne/ternary", "fne/mean",
               "fne/std")
#: arrays a complete store may lack for a while: the FNE statistics and the ternary array while
#: ``--rethreshold`` swaps it (:meth:`features.store.core.FeatureStore.replace_ternary`)
OPTIONAL_ARRAYS = ("fne/mean", "fne/std", "fne/ternary", "fne/ternary_new")
#: the data types the writer makes for its outputs
OUTPUT_DTYPES = ("float32", "float16", "int8", "int32")

#: an output's row: a width ``C`` (rows ``(C,)``) or a shape (``(k, D)``, ``()``)
RowShape = int | tuple[int, ...] | list[int]


def row_shape(spec: RowShape) -> tuple[int, ...]:
    """The shape of one row of an output: a width ``C`` -> ``(C,)``, a shape -> itself."""
    if isinstance(spec, (int, np.integer)):
        return (int(spec),)
    return tuple(int(v) for v in spec)


def shape_attr(spec: RowShape) -> int | list[int]:
    """How the ``outputs`` attribute records a row: widths as ints (as always), shapes as lists."""
    return int(spec) if isinstance(spec, (int, np.integer)) else [int(v) for v in spec]


def fill_value(dtype: np.dtype) -> float | int:
    """The fill value of an array (the value of a failed image's row): NaN, or 0 for integers."""
    return np.nan if dtype.kind == "f" else 0


def row_layout(name: str, shape: tuple[int, ...], dtype: np.dtype, block_size: int, codec: str = "zstd"
               ) -> dict[str, Any]:
    """``chunks`` (and ``shards``, ``compressors``) of a row array: one chunk per block, or for rows of at
    least :data:`SHARD_ROW_BYTES` one shard per block holding one chunk per row (decided by size only),
    compressed by ``codec`` (:data:`features.store.codecs.ROW_CODECS`; Zarr's default zstd is left implicit,
    as it always was)."""
    row = _row_chunks(name, shape)
    if row == shape and int(np.prod(shape, dtype=np.int64)) * dtype.itemsize >= SHARD_ROW_BYTES:
        layout: dict[str, Any] = {"chunks": (1, *shape), "shards": (block_size, *shape)}
        if codec == "lz4":
            layout["compressors"] = (BloscCodec(cname="lz4hc", clevel=5, shuffle="shuffle",
                                                typesize=dtype.itemsize, blocksize=0),)
        return layout
    return {"chunks": (block_size, *row)}


def rows_per_file(array: zarr.Array) -> int:
    """Rows held by one chunk file of a row array: the shard's rows for a sharded array, else the chunk's."""
    return int((array.shards or array.chunks)[0])


def _row_chunks(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Chunks of a row: whole, except the columns of wide FNE arrays (:data:`COLUMN_CHUNK`)."""
    if name.startswith("fne/") and len(shape) == 1:
        return (int(min(shape[0], COLUMN_CHUNK)),)
    return shape


# --------------------------------------------------------------------------- the reader's check


def _integer(value: Any, low: int, high: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"{where} must be an integer from {low} to {high:,}, got {str(value)[:40]!r}")
    return value


def _recorded_outputs(attrs: Mapping[str, Any], where: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``outputs`` and ``dtypes`` of the store's attributes: name -> (row shape, dtype), bounded."""
    outputs, dtypes = attrs.get("outputs"), attrs.get("dtypes", {})
    if not isinstance(outputs, dict) or not outputs or not isinstance(dtypes, dict):
        raise UserError(f"{where}: attributes 'outputs' / 'dtypes' are not the store's record of its arrays")
    found = {}
    for name, spec in outputs.items():
        dims = [spec] if not isinstance(spec, list) else spec
        if not isinstance(name, str) or len(dims) > MAX_ROW_DIMS:
            raise UserError(f"{where}: attribute outputs.{str(name)[:40]} is not a row shape")
        shape = tuple(_integer(v, 1, MAX_ROW_VALUES, f"{where}: outputs.{name}") for v in dims)
        if math.prod(shape) > MAX_ROW_VALUES:
            raise UserError(f"{where}: outputs.{name} has {math.prod(shape):,} values per row, more than "
                            f"{MAX_ROW_VALUES:,}")
        kind = dtypes.get(name, "float32")
        if kind not in OUTPUT_DTYPES:
            raise UserError(f"{where}: dtypes.{name} is {str(kind)[:40]!r}, not one of "
                            f"{', '.join(OUTPUT_DTYPES)}")
        found[name] = (shape, np.dtype(kind))
    return found


def _expected_arrays(attrs: Mapping[str, Any], n: int, where: str) -> dict[str, dict[str, Any]]:
    """Every array the writer makes for this record: name -> ``zarr.create_array`` arguments."""
    block_size = _integer(attrs.get("block_size"), 1, MAX_BLOCK_SIZE, f"{where}: attribute block_size")
    n_blocks = max(1, math.ceil(n / block_size))
    _integer(attrs.get("n_blocks"), n_blocks, n_blocks, f"{where}: attribute n_blocks")
    arrays: dict[str, dict[str, Any]] = {
        "imgid": {"shape": (n,), "chunks": (block_size,), "dtype": "int64", "fill_value": -1},
        "valid": {"shape": (n,), "chunks": (block_size,), "dtype": "bool", "fill_value": False},
        "blocks_done": {"shape": (n_blocks,), "chunks": (1,), "dtype": "bool", "fill_value": False},
        "failures": {"shape": (n_blocks,), "chunks": (1,), "dtype": str, "fill_value": ""},
    }
    codec = store_codec(attrs, where)
    for name, (shape, dtype) in _recorded_outputs(attrs, where).items():
        arrays[name] = {"shape": (n, *shape), "dtype": dtype, "fill_value": fill_value(dtype),
                        **row_layout(name, shape, dtype, block_size, codec)}
        if name in ("fne/raw", "fne/ternary") and len(shape) == 1:
            width = shape[0]
            for stat_name in ("fne/mean", "fne/std"):
                arrays[stat_name] = {"shape": (width,), "chunks": (width,), "dtype": "float32",
                                     "fill_value": np.nan}
            if name == "fne/raw":
                ternary = {"shape": (n, width), "chunks": arrays[name]["chunks"], "dtype": "int8",
                           "fill_value": 0}
                arrays["fne/ternary"] = arrays["fne/ternary_new"] = ternary
    return arrays


def _comparable(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of an array's metadata that the writer determines (any zstd level is accepted)."""
    def codecs(items: Any) -> list[Any]:
        out = []
        for codec in items or ():
            codec = dict(codec)
            if codec.get("name") == "zstd":
                codec.pop("configuration", None)
            config = dict(codec.get("configuration") or {})
            for key in ("codecs", "index_codecs"):
                if key in config:
                    config[key] = codecs(config[key])
            if config:
                codec["configuration"] = config
            out.append(codec)
        return out

    keep = ("shape", "data_type", "chunk_grid", "chunk_key_encoding", "fill_value", "storage_transformers")
    found = json.loads(json.dumps({k: metadata.get(k) for k in keep}, default=str))
    found["codecs"] = json.loads(json.dumps(codecs(metadata.get("codecs")), default=str))
    return found


def _reference(args: Mapping[str, Any]) -> dict[str, Any]:
    return _comparable(zarr.create_array(store=MemoryStore(), **args).metadata.to_dict())


def _first_difference(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
    for key in wanted:
        if found.get(key) != wanted[key]:
            return key
    return None


def _mismatch(meta: Path, field: str, found: Any, wanted: Any, n: int) -> UserError:
    return UserError(f"{meta}: {field} is {str(found)[:80]}, but this store's record (outputs, dtypes, "
                     f"block_size, {n} rows) implies {str(wanted)[:80]}; the file was edited or damaged: "
                     "extract the features again")


def _check_chunk_files(folder: Path, args: Mapping[str, Any]) -> None:
    """Every chunk file of the array in ``folder`` is a regular file no larger than a chunk can encode to.

    A file that vanishes during the scan is skipped: a writer replacing the array (``--rethreshold``'s
    swap) is what the reader's generation check reports, in its own words."""
    per_file = args.get("shards") or args["chunks"]
    itemsize = 64 if args["dtype"] is str else np.dtype(args["dtype"]).itemsize  # strings: a JSON list
    most = math.prod(per_file) * itemsize * 2 + (1 << 16)
    chunks = folder / "c"
    if not chunks.is_dir():
        return
    for root, dirs, files in os.walk(chunks):
        for name in files + [d for d in dirs if (Path(root) / d).is_symlink()]:
            try:
                regular_file_size(Path(root) / name, most, "a chunk file")
            except UserError:
                if os.path.lexists(Path(root) / name):
                    raise


def _array_record(path: Path, name: str, required: bool) -> tuple[Path, Any] | None:
    """``(its zarr.json, the parsed JSON)`` of array ``name``; ``None`` for an optional array that is absent
    (not written yet, or swapped out by ``--rethreshold`` while checked: the generation check says so)."""
    meta = path / name / "zarr.json"
    if not os.path.lexists(meta):
        if required:
            raise UserError(f"{path}: array '{name}' is missing (no {name}/zarr.json)")
        return None
    return meta, read_json(meta, "the array metadata", most=MAX_ARRAY_METADATA_BYTES)


def _check_array(meta: Path, record: Any, args: Mapping[str, Any], n: int) -> None:
    """The array metadata ``record`` (of the file ``meta``) is what the writer makes from ``args``."""
    wanted = _reference(args)
    for field in ("shape", "data_type"):  # the plain fields first: named even where zarr cannot parse
        if not isinstance(record, dict) or record.get(field) != wanted[field]:
            found_value = record.get(field) if isinstance(record, dict) else None
            raise _mismatch(meta, field, found_value, wanted[field], n)
    try:
        found = _comparable(ArrayV3Metadata.from_dict(record).to_dict())
    except Exception as exc:  # noqa: BLE001 - zarr's parser raises many types for a bad file
        reason = " ".join(str(exc).split())[:160]
        raise UserError(f"{meta}: cannot read the array metadata: {reason}") from None
    field = _first_difference(found, wanted)
    if field == "codecs":  # named by their names: the JSON of a shard's codecs is too long for one line
        raise _mismatch(meta, field, _codec_names(found.get(field)), _codec_names(wanted[field]), n)
    if field is not None:
        raise _mismatch(meta, field, found.get(field), wanted[field], n)


def _codec_names(codecs: Any) -> str:
    """``codecs`` of an array's metadata as names, a shard's inner codecs in brackets:
    ``sharding_indexed[bytes, blosc]``."""
    names = []
    for codec in codecs if isinstance(codecs, list) else []:
        inner = (codec.get("configuration") or {}).get("codecs") if isinstance(codec, dict) else None
        name = str(codec.get("name")) if isinstance(codec, dict) else str(codec)
        names.append(f"{name}[{_codec_names(inner)}]" if inner else name)
    return ", ".join(names)


def _check_failures(failures: Any, n: int, where: str) -> None:
    if not isinstance(failures, list) or len(failures) > n or not all(
            isinstance(f, dict) and isinstance(f.get("imgid"), int) and not isinstance(f.get("imgid"), bool)
            and 0 <= f["imgid"] < n for f in failures):
        raise UserError(f"{where}: attribute 'failures' must list at most {n} records with an integer imgid "
                        f"from 0 to {n - 1}")


def check_store_layout(path: Path, group: zarr.Group, chunk_files: bool = True) -> None:
    """A one-line UserError unless the store at ``path`` is laid out as the writer makes it.

    Checks, before any row is read: the group's attributes (``block_size``, ``n_blocks``, ``outputs``,
    ``dtypes``, ``failures``) are well-formed and within the bounds above; every array the record
    implies that exists (and ``imgid``, ``valid``, ``blocks_done``, ``failures``, which always do) has
    the shape, data type, chunking, codecs and fill value the writer gives it; with ``chunk_files``,
    every chunk file is a regular file no larger than its chunk can encode to.
    """
    attrs = dict(group.attrs)
    where = f"{path}/zarr.json"
    meta, imgid = _array_record(path, "imgid", required=True)
    shape = imgid.get("shape") if isinstance(imgid, dict) else None
    if not isinstance(shape, list) or len(shape) != 1:
        raise UserError(f"{meta}: shape must be [rows], got {str(shape)[:40]}")
    n = _integer(shape[0], 0, MAX_ROWS, f"{meta}: shape[0]")
    expected = _expected_arrays(attrs, n, where)
    for name, args in expected.items():
        required = name not in OPTIONAL_ARRAYS or name in attrs.get("outputs", {})
        found = _array_record(path, name, required)
        if found is not None:
            _check_array(*found, args, n)
            if chunk_files:
                _check_chunk_files(path / name, args)
    for name in READ_ARRAYS:
        if name not in expected and os.path.lexists(path / name / "zarr.json"):
            raise UserError(f"{path}/{name}: an array this store's record (attribute outputs) does not list; "
                            "the store was edited or damaged: extract the features again")
    _check_failures(attrs.get("failures", []), n, where)
