"""The feature store: one Zarr v3 group per dataset and extractor, rows in the prepared dataset's order.

Layout (see ``docs/ARCHITECTURE.md``, "Feature store")::

    imgid        (N,)        int64    the prepared dataset's imgid of each row (= its row)
    global       (N, C)      float32  10-crop averaged CNN features            (features cnn)
    regions      (N, k, D)   float32  region features, zero rows after counts  (features regions)
    boxes        (N, k, 4)   float32  x1 y1 x2 y2 pixels of each region        (where known)
    counts       (N,)        int32    real regions of each row (0 for failed images)
    image_size   (N, 2)      int32    width, height of the loaded image        (where known)
    fne/raw      (N, F)      float32  crop-averaged Full-Network activations   (features fne)
    fne/mean     (F,)        float32  per-feature mean of the valid train rows (after all blocks)
    fne/std      (F,)        float32  per-feature population std, same rows
    fne/ternary  (N, F)      int8     {-1, 0, 1} discretization; its attributes hold its thresholds
    valid        (N,)        bool     row computed and usable (failed images: False, rows NaN)
    blocks_done  (n_blocks,) bool     completion mask, one chunk (one file) per block
    failures     (n_blocks,) str      JSON list of the block's failed images, one chunk per block

Row arrays are chunked along rows by the block size, so a block writes whole chunks only and two
blocks (two Dask tasks) never touch the same file; ``blocks_done`` and ``failures`` have chunk
size 1 for the same reason. An array whose rows are large (:data:`SHARD_ROW_BYTES`: region features)
is a Zarr v3 sharded array instead: one shard file per block, one inner chunk per row, so that the
trainer reads the rows of a random batch one by one (:mod:`features.store.rows`) rather than decoding a
whole block for each. A block's flag is written last, so a set flag means its rows are on
disk. Every chunk is written, even one equal to the fill value (Zarr skips those by default), so
a missing chunk file of a finished block always means damage. Attributes (written only by the
single driver, at creation and at the end) hold the configuration that determines the numbers
(compared on resume; the rows' identity is ``images_sha256``, the prepared dataset's ordered image
list and splits), the provenance and the failures.

Reads go through :class:`StoreArray`: a damaged chunk (truncated, corrupt) becomes a one-line
:class:`UserError` naming the array, the rows and the chunk file, and suggesting ``features verify``.

Every attribute update also writes a new random ``generation`` token, and an in-place rewrite (the
ternary swap, the statistics) sets a ``rewriting`` marker first and clears it last; a writer that opens
a complete store marks it incomplete until it finishes. :func:`read_matrix` and :func:`read_regions`
compare the token before and after reading, refuse a store a live writer is writing, and check the
rows against their records (:func:`check_row_records`): a reader gets one consistent version or a
one-line error (``docs/safety.md``, "Feature stores").
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from features.signals import zarr_settled
from features.store.array import StoreArray, one_line
from features.store.codecs import check_codec, store_codec
from features.store.layout import (
    ARRAY_CONFIG,
    RowShape,
    check_store_layout,
    fill_value,
    row_layout,
    row_shape,
    shape_attr,
)
from features.store.state import MAX_GROUP_METADATA_BYTES, ConsistentReads, StoreState
from vsecore import console
from vsecore.errors import UserError
from vsecore.io import atomic_directory, regular_file_size, remove_stale_siblings
from vsecore.jsonfile import parse_json, read_json
from vsecore.outputs import zarr_foreign_entries
from vsecore.version import code_version

#: version of the on-disk layout written into the store's attributes
STORE_FORMAT = 1
#: marker attribute: a folder without it is never deleted by ``--overwrite``
MARKER = "vse_feature_store"
ROW_ARRAYS = ("global", "fne/raw", "fne/ternary")
#: the ternary FNE array, and the names it takes while ``--rethreshold`` replaces it (see
#: :meth:`FeatureStore.replace_ternary`)
TERNARY, TERNARY_NEW, TERNARY_OLD = "fne/ternary", "fne/ternary_new", "fne/ternary_old"


def _jsonable(obj: Any) -> Any:
    """Round-trip through JSON so stored and fresh configurations compare equal (tuples -> lists)."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def config_difference(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
    """The first key (sorted) whose value differs between two configurations, else ``None``."""
    for key in sorted(set(stored) | set(wanted)):
        if stored.get(key) != wanted.get(key):
            return key
    return None


class FeatureStore(ConsistentReads):
    """An open feature store (a Zarr v3 group on a local or shared filesystem)."""

    def __init__(self, path: str | os.PathLike, mode: str = "r") -> None:
        self.path = Path(path)
        self._rewriting = False
        if not os.path.lexists(self.path / "zarr.json"):
            raise UserError(f"{self.path}: not a feature store (no zarr.json; run `features cnn|fne` first)")
        regular_file_size(self.path / "zarr.json", MAX_GROUP_METADATA_BYTES, "the store's metadata")
        try:
            self.group = zarr.open_group(str(self.path), mode=mode, zarr_format=3)
        except Exception as exc:  # zarr raises several types for a damaged group
            raise UserError(f"{self.path}: cannot open the feature store: {exc}") from None
        if MARKER not in self.group.attrs:
            raise UserError(f"{self.path}: a Zarr group, but not a feature store written by `features`")
        # a store comes from anywhere: its record is checked before any row is read (readers also
        # check every chunk file; a writer makes its own)
        check_store_layout(self.path, self.group, chunk_files=mode == "r")

    # -- creation ----------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike, imgids: np.ndarray, outputs: Mapping[str, RowShape],
               block_size: int, config: Mapping[str, Any], provenance: Mapping[str, Any],
               overwrite: bool = False, dtypes: Mapping[str, str] | None = None, codec: str = "zstd"
               ) -> FeatureStore:
        """Create an empty store for ``len(imgids)`` rows and the ``outputs``.

        ``outputs``: name -> width ``C`` (an ``(N, C)`` array) or the shape of one row (``(k, D)`` gives
        ``(N, k, D)``, ``()`` gives ``(N,)``); ``dtypes``: name -> numpy dtype name (default float32).
        Float arrays are filled with NaN (the rows of failed images), integer arrays with 0. ``codec``
        compresses the arrays stored one chunk per row (:data:`features.store.codecs.ROW_CODECS`).

        Built in a temporary sibling folder and renamed into place, so a run killed while creating
        leaves either no store or a complete empty one. ``overwrite`` replaces an existing store
        (never a folder that is not one).
        """
        path = Path(path)
        if path.exists():
            if not overwrite:
                raise FileExistsError(path)
            check_replaceable(path)
        n = int(len(imgids))
        if block_size < 1:
            raise UserError(f"block size must be at least 1, got {block_size}")
        n_blocks = max(1, math.ceil(n / block_size))
        check_codec(codec, "codec")
        with atomic_directory(path, overwrite=True) as tmp, zarr_settled():
            g = zarr.open_group(str(tmp), mode="w", zarr_format=3)
            g.create_array("imgid", shape=(n,), chunks=(block_size,), dtype="int64", fill_value=-1,
                           config=ARRAY_CONFIG)[:] = np.asarray(imgids, dtype=np.int64)
            g.create_array("valid", shape=(n,), chunks=(block_size,), dtype="bool", fill_value=False)
            g.create_array("blocks_done", shape=(n_blocks,), chunks=(1,), dtype="bool", fill_value=False)
            g.create_array("failures", shape=(n_blocks,), chunks=(1,), dtype=str, fill_value="")
            kinds = {name: np.dtype((dtypes or {}).get(name, "float32")) for name in outputs}
            for name, spec in outputs.items():
                shape = row_shape(spec)
                g.create_array(name, shape=(n, *shape), dtype=kinds[name], fill_value=fill_value(kinds[name]),
                               **row_layout(name, shape, kinds[name], block_size, codec))
            g.attrs.update({
                MARKER: STORE_FORMAT,
                "config": _jsonable(dict(config)),
                "provenance": _jsonable(dict(provenance)),
                "code_version": code_version(),
                "block_size": int(block_size),
                "n_blocks": n_blocks,
                "outputs": {k: shape_attr(v) for k, v in outputs.items()},
                "dtypes": {k: v.name for k, v in kinds.items()},
                "codec": codec,
                "complete": False,
                "generation": uuid.uuid4().hex,
                "failures": [],
                # every chunk of a finished block is on disk (ARRAY_CONFIG); older stores lack this
                "empty_chunks_written": True,
            })
        return cls(path, mode="r+")

    @classmethod
    def open_or_create(cls, path: str | os.PathLike, imgids: np.ndarray, outputs: Mapping[str, RowShape],
                       block_size: int, config: Mapping[str, Any], provenance: Mapping[str, Any],
                       overwrite: bool = False, hints: Mapping[str, str] | None = None,
                       dtypes: Mapping[str, str] | None = None, codec: str = "zstd") -> FeatureStore:
        """Resume the store at ``path`` if it was made with ``config`` (and ``codec``); create it if absent.

        A store made with a different configuration is a :class:`UserError` naming the first
        differing key (``hints`` may add advice per key), unless ``overwrite`` starts over.
        """
        path = Path(path)
        if overwrite or not path.exists():
            return cls.create(path, imgids, outputs, block_size, config, provenance, overwrite=overwrite,
                              dtypes=dtypes, codec=codec)
        store = cls(path, mode="r+")
        store.recover()
        made = store_codec(store.attrs, f"{path}/zarr.json")
        if made != codec:
            raise UserError(f"{path}: the existing store was made with --codec {made}, this run asks for "
                            f"--codec {codec} (use --overwrite to start over, or `features recompress`)")
        stored = dict(store.attrs.get("config", {}))
        wanted = _jsonable(dict(config))
        if "images_sha256" in wanted and "images_sha256" not in stored and "dataset_sha256" in stored:
            # A store written before images_sha256 existed: its rows are identified by dataset.json.
            old = stored.pop("dataset_sha256")
            if old != provenance.get("dataset_sha256"):
                mine = str(provenance.get("dataset_sha256"))[:12]
                raise UserError(f"{path}: the existing store was made for another dataset.json (sha256 "
                                f"{str(old)[:12]}..., this one {mine}...); use --overwrite to start over, "
                                "or another --out")
            stored["images_sha256"] = wanted["images_sha256"]
        key = config_difference(stored, wanted)
        if key is not None:
            hint = (hints or {}).get(key, "use --overwrite to start over, or another --out")
            raise UserError(f"{path}: the existing store was made with {key}={stored.get(key)!r}, this run "
                            f"asks for {key}={wanted.get(key)!r} ({hint})")
        if store.attrs.get("complete"):
            # rows may be rewritten in place (retried failures, an import gaining a split): readers
            # refuse an incomplete store, and the writer marks it complete again when it is
            store.set_attrs(complete=False)
        return store

    # -- shape and state ---------------------------------------------------------------------------
    @property
    def attrs(self) -> dict[str, Any]:
        """A copy of the group's attributes."""
        return dict(self.group.attrs)

    @property
    def opened_state(self) -> StoreState:
        """The :class:`StoreState` of the attributes read when the store was opened."""
        attrs = self.group.attrs
        return StoreState(attrs.get("generation"), attrs.get("rewriting"), bool(attrs.get("complete")))

    @property
    def n_rows(self) -> int:
        """Number of rows N (= images of the prepared dataset)."""
        return int(self.group["imgid"].shape[0])

    @property
    def block_size(self) -> int:
        """Rows per block (= rows per chunk of every row array)."""
        return int(self.group.attrs["block_size"])

    @property
    def n_blocks(self) -> int:
        """Number of blocks."""
        return int(self.group["blocks_done"].shape[0])

    def block_rows(self, block: int) -> tuple[int, int]:
        """``(start, stop)`` rows of ``block``."""
        start = block * self.block_size
        return start, min(start + self.block_size, self.n_rows)

    def blocks_done(self) -> np.ndarray:
        """The completion mask, (n_blocks,) bool."""
        return np.asarray(self.array("blocks_done")[:], dtype=bool)

    def block_done(self, block: int) -> bool:
        """Whether ``block``'s flag is set (reads that one chunk only)."""
        return bool(self.array("blocks_done")[block])

    def _exists(self, name: str) -> bool:
        return (self.path / name / "zarr.json").is_file()

    def _resolve(self, name: str) -> str:
        """``name``, or for the ternary array caught between two renames by a killed
        ``--rethreshold``, its complete replacement (readers never rename: see :meth:`recover`)."""
        if name == TERNARY and not self._exists(TERNARY) and self._exists(TERNARY_NEW):
            try:
                complete = self.group[TERNARY_NEW].attrs.get("complete")
            except (KeyError, FileNotFoundError):  # renamed meanwhile: the swap has just finished
                return name
            if complete:
                return TERNARY_NEW
        return name

    def has(self, name: str) -> bool:
        """Whether the array ``name`` (e.g. ``"global"``, ``"fne/ternary"``) exists."""
        return self._exists(self._resolve(name))

    def array_folder(self, name: str) -> Path:
        """The folder that holds array ``name`` now (for ``fne/ternary`` caught between the renames of a
        killed ``--rethreshold``: its complete replacement)."""
        return self.path / self._resolve(name)

    def array(self, name: str) -> StoreArray:
        """The array ``name`` (see :class:`StoreArray`); a missing or unreadable one is a UserError."""
        real = self._resolve(name)
        if not self._exists(real):
            raise UserError(f"{self.path}: no array '{name}' in this store (run `features verify "
                            f"{self.path}`)")
        try:
            arr = self.group[real]
        except Exception as exc:  # noqa: BLE001 - a damaged zarr.json
            raise UserError(f"{self.path}: cannot open array '{name}': {one_line(exc)}") from None
        if not isinstance(arr, zarr.Array):
            raise UserError(f"{self.path}: '{name}' is a group, not an array")
        attrs = self.group.attrs
        # finished, and written by a writer that writes every chunk: a missing chunk file is damage
        every_chunk = bool(attrs.get("complete")) and bool(attrs.get("empty_chunks_written"))
        return StoreArray(self, name, arr.with_config(ARRAY_CONFIG), every_chunk=every_chunk)

    def clear_blocks(self, blocks: list[int]) -> None:
        """Unset the completion flags of ``blocks`` and mark the store incomplete (they are redone)."""
        flags = self.array("blocks_done")
        for b in blocks:
            flags[b] = False
        if blocks:
            self.set_attrs(complete=False)

    # -- the ternary array, replaced atomically ------------------------------------------------------
    def replace_ternary(self, write: Any, thresholds: tuple[float, float]) -> None:
        """Write a new ``fne/ternary`` aside, then swap it in; a kill at any point leaves a complete one.

        ``write(array)`` fills the new (N, F) int8 array (a :class:`StoreArray`). Steps: the new array
        is written as ``fne/ternary_new`` with ``thresholds`` and ``complete`` in its own attributes
        (set last), then ``fne/ternary`` -> ``fne/ternary_old``, ``fne/ternary_new`` -> ``fne/ternary``
        (Zarr v3 groups do not list their members, so renaming the folders is the whole swap), the old
        one deleted, and ``config``/``provenance`` thresholds updated. Readers take the complete new
        array while the old name is missing; :meth:`recover` finishes any step a kill interrupted.
        Only a writer holding the store's lock calls this; readers overlapping the swap are told so
        (:meth:`rewriting`).
        """
        self.recover()
        raw = self.array("fne/raw")
        new = self.group.create_array(TERNARY_NEW, shape=raw.shape, chunks=raw.chunks, dtype="int8",
                                      fill_value=0, config=ARRAY_CONFIG)
        # ``written``: a token of its own, so that a reader can tell this array from any earlier one with
        # the same thresholds (:meth:`array_identity`)
        new.attrs.update({"thresholds": [float(t) for t in thresholds], "complete": False,
                          "written": uuid.uuid4().hex})
        write(StoreArray(self, TERNARY_NEW, new))
        new.attrs["complete"] = True
        with self.rewriting("replacing fne/ternary"):
            self.recover(swap=True)

    def recover(self, swap: bool = False) -> None:
        """Finish or undo a ``fne/ternary`` replacement a kill interrupted (writers only, under the lock).

        An incomplete ``fne/ternary_new`` is deleted; a complete one replaces ``fne/ternary`` (with
        ``swap``, or when a kill came between the two renames); a left-over ``fne/ternary_old`` is
        deleted; ``config``/``provenance`` thresholds are set to those the ternary array carries; the
        ``rewriting`` marker a kill left is cleared.
        """
        new, old, current = (self.path / n for n in (TERNARY_NEW, TERNARY_OLD, TERNARY))
        new_complete = self._exists(TERNARY_NEW) and bool(self.group[TERNARY_NEW].attrs.get("complete"))
        if new.exists() and not new_complete:
            shutil.rmtree(new)  # killed while writing it: the old array is untouched
        elif new_complete and (swap or not self._exists(TERNARY)):
            if current.exists():
                if old.exists():
                    shutil.rmtree(old)
                os.replace(current, old)
            os.replace(new, current)
        elif new_complete:
            shutil.rmtree(new)  # killed before the swap began: keep the old array and its thresholds
        if old.exists():
            if self._exists(TERNARY):
                shutil.rmtree(old)
            else:  # no replacement to take: put the old array back
                if current.exists():
                    shutil.rmtree(current)
                os.replace(old, current)
        if self._exists(TERNARY):
            thresholds = self.group[TERNARY].attrs.get("thresholds")
            attrs = self.attrs
            config, prov = dict(attrs.get("config", {})), dict(attrs.get("provenance", {}))
            if thresholds is not None and (config.get("thresholds") != thresholds
                                           or prov.get("thresholds") != thresholds):
                self.set_attrs(config=dict(config, thresholds=thresholds),
                               provenance=dict(prov, thresholds=thresholds))
        if not self._rewriting and self.group.attrs.get("rewriting"):
            self.set_attrs(rewriting=None)  # the interrupted step is finished or undone

    # -- writing -----------------------------------------------------------------------------------
    def write_block(self, block: int, arrays: Mapping[str, np.ndarray], valid: np.ndarray,
                    failures: list[dict[str, Any]], first: int = 0) -> None:
        """Write one block's rows, validity and failures, then set its completion flag.

        ``arrays``: name -> ``(rows, *row_shape)`` (see :meth:`empty_rows`), NaN (integer arrays: 0)
        where ``valid`` is False, cast to the array's dtype; with ``first``, only the rows from the block's
        row ``first`` on (the earlier ones were written in pieces, :mod:`features.executors.pieces`). The
        flag is written last: a run killed before it recomputes the whole block on resume.
        """
        start, stop = self.block_rows(block)
        self.check_chunk_places(block, [*arrays, "valid", "failures", "blocks_done"])
        for name, values in arrays.items():
            if values.shape[0] != stop - start - first:
                raise ValueError(f"block {block}: {name} has {values.shape[0]} rows, expected "
                                 f"{stop - start - first}")
            arr = self.array(name)
            arr[start + first : stop] = np.asarray(values, dtype=arr.dtype)
        self.array("valid")[start:stop] = np.asarray(valid, dtype=bool)
        self.array("failures")[block] = json.dumps(failures) if failures else ""
        self.array("blocks_done")[block] = True

    def check_chunk_places(self, block: int, names: list[str]) -> None:
        """A one-line UserError when a folder stands where a chunk file of ``block`` of the arrays ``names``
        goes (Zarr cannot write there, and the folder is not ours to delete); every block writer calls it
        (``features verify`` names such a block damaged, ``--repair`` clears its flag: the writer is next)."""
        for name in names:
            for file in self.array(name).chunk_files([block])[block]:
                if file.is_dir() and not file.is_symlink():
                    where = os.path.relpath(file, self.path)
                    raise UserError(f"{self.path}: {where} is a folder where a chunk file of block {block} "
                                    "goes; move it away and run again")

    def empty_rows(self, name: str, rows: int) -> np.ndarray:
        """``(rows, *row_shape)`` in the dtype of array ``name``, filled as failed rows are: NaN, or 0
        for integer arrays (``counts``, ``image_size``)."""
        arr = self.array(name)
        return np.full((rows, *arr.shape[1:]), fill_value(np.dtype(arr.dtype)), dtype=arr.dtype)

    def block_failures(self) -> list[dict[str, Any]]:
        """Failed images of every block, in row order."""
        out: list[dict[str, Any]] = []
        for block, text in enumerate(self.array("failures")[:]):
            if text:
                out.extend(parse_json(str(text), f"{self.path}: failures of block {block}"))
        return sorted(out, key=lambda f: f["imgid"])

    def set_attrs(self, **values: Any) -> None:
        """Update attributes (only the driver calls this, never concurrent block tasks).

        Every update also sets a new ``generation`` token, so that a reader that saw another token
        before reading knows the store changed under it (see :meth:`check_unchanged`).
        """
        self._update_attrs(values)

    def _update_attrs(self, values: Mapping[str, Any]) -> None:
        self.group.attrs.update(_jsonable({**values, "generation": uuid.uuid4().hex}))

    @contextlib.contextmanager
    def rewriting(self, what: str) -> Iterator[None]:
        """Mark the store as being rewritten in place while the body runs (writers, under the lock).

        Readers that find the marker are told so (:meth:`check_readable`); a run killed inside leaves
        it, and the next writer's :meth:`recover` clears it after finishing the interrupted step.
        """
        if self._rewriting:
            yield
            return
        self._update_attrs({"rewriting": what})
        self._rewriting = True
        try:
            yield
        finally:
            self._rewriting = False
        self._update_attrs({"rewriting": None})

    def require_complete(self) -> None:
        """A :class:`UserError` unless every block is done and the run was finalized."""
        done = self.blocks_done()
        if not done.all() or not self.group.attrs.get("complete", False):
            raise UserError(f"{self.path}: the store is incomplete ({int(done.sum())}/{done.size} blocks "
                            "done); run the same `features` command again to finish it")


#: the arrays a store may hold besides its outputs (FNE's derived ones, and their names mid ``--rethreshold``)
STORE_ARRAYS = ("imgid", "valid", "blocks_done", "failures", "fne/mean", "fne/std", TERNARY, TERNARY_NEW,
                TERNARY_OLD, "rows_done")  # rows_done: an unfinished run's pieces (features.executors.pieces)
#: the file :func:`features.run.probe_writable` creates in a store (a killed run may leave it)
_PROBE = re.compile(r"\.write-probe-\d+")


def check_replaceable(path: Path) -> None:
    """Refuse in one line to delete anything but a feature store (or an empty folder) on ``--overwrite``, and
    a store holding anything ``features`` did not write (a ``NOTES.txt``): it would be deleted with it.

    The store's own entries follow from its record (``outputs``) and the layout every store has
    (:data:`STORE_ARRAYS`; :func:`vsecore.outputs.zarr_foreign_entries`)."""
    if path.is_dir() and not any(path.iterdir()):
        return
    try:
        meta = read_json(path / "zarr.json", "its metadata", most=MAX_GROUP_METADATA_BYTES, kind=dict)
        attrs = meta.get("attributes", {})
    except UserError:
        attrs = {}
    if not isinstance(attrs, dict) or MARKER not in attrs:
        raise UserError(f"{path}: exists and is not a feature store; refusing to overwrite it")
    outputs = attrs.get("outputs") if isinstance(attrs.get("outputs"), dict) else {}
    foreign = zarr_foreign_entries(path, [*STORE_ARRAYS, *map(str, outputs)], beside=_PROBE)
    if foreign:
        raise UserError(f"{path}: a feature store, but it also holds '{foreign[0]}', which features did not "
                        "write; refusing to replace it (move that away, or give another --out)")


def remove_killed_leftovers(path: str | os.PathLike) -> None:
    """Delete what killed writers left beside the store ``path`` (:func:`vsecore.io.stale_siblings`): the
    half-built store of a creation or ``--overwrite`` (``.NAME.XXXXXXXX.partial``), the old one between two
    renames (``.NAME.old-PID``), saying so. Call it holding the store's lock: no live writer owns them."""
    for stale in remove_stale_siblings(path):
        console.warning(f"features: removed {stale.name} (left by a killed run)")


def remove_store(path: str | os.PathLike) -> None:
    """Delete a feature store (checked to be one)."""
    path = Path(path)
    if path.exists():
        check_replaceable(path)
        shutil.rmtree(path)
