"""The feature store: one Zarr v3 group per dataset and extractor, rows in the prepared dataset's order.

Layout (see ``docs/ARCHITECTURE.md``, "Feature store")::

    imgid        (N,)        int64    the prepared dataset's imgid of each row (= its row)
    global       (N, C)      float32  10-crop averaged CNN features            (features cnn)
    fne/raw      (N, F)      float32  crop-averaged Full-Network activations   (features fne)
    fne/mean     (F,)        float32  per-feature mean of the valid train rows (after all blocks)
    fne/std      (F,)        float32  per-feature population std, same rows
    fne/ternary  (N, F)      int8     {-1, 0, 1} discretization
    valid        (N,)        bool     row computed and usable (failed images: False, rows NaN)
    blocks_done  (n_blocks,) bool     completion mask, one chunk (one file) per block
    failures     (n_blocks,) str      JSON list of the block's failed images, one chunk per block

Row arrays are chunked along rows by the block size, so a block writes whole chunks only and two
blocks (two Dask tasks) never touch the same file; ``blocks_done`` and ``failures`` have chunk
size 1 for the same reason. A block's flag is written last, so a set flag means its rows are on
disk. Attributes (written only by the single driver, at creation and at the end) hold the
configuration that determines the numbers (compared on resume), the provenance and the failures.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import prep
from prep.errors import UserError
from prep.io import atomic_directory

#: version of the on-disk layout written into the store's attributes
STORE_FORMAT = 1
#: marker attribute: a folder without it is never deleted by ``--overwrite``
MARKER = "vse_feature_store"
#: columns per chunk of wide (FNE) arrays: statistics read column slices without reading all rows
COLUMN_CHUNK = 2048
ROW_ARRAYS = ("global", "fne/raw", "fne/ternary")


@functools.cache
def code_version() -> str:
    """``prep.__version__`` plus the git commit of the project (``+dirty`` if modified), if known."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        # --no-optional-locks: reading the version must not touch the repository's index
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return prep.__version__
    return f"{prep.__version__}+g{commit}{'.dirty' if dirty else ''}" if commit else prep.__version__


def _jsonable(obj: Any) -> Any:
    """Round-trip through JSON so stored and fresh configurations compare equal (tuples -> lists)."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def config_difference(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
    """The first key (sorted) whose value differs between two configurations, else ``None``."""
    for key in sorted(set(stored) | set(wanted)):
        if stored.get(key) != wanted.get(key):
            return key
    return None


class FeatureStore:
    """An open feature store (a Zarr v3 group on a local or shared filesystem)."""

    def __init__(self, path: str | os.PathLike, mode: str = "r") -> None:
        self.path = Path(path)
        if not (self.path / "zarr.json").is_file():
            raise UserError(f"{self.path}: not a feature store (no zarr.json; run `features cnn|fne` first)")
        try:
            self.group = zarr.open_group(str(self.path), mode=mode, zarr_format=3)
        except Exception as exc:  # zarr raises several types for a damaged group
            raise UserError(f"{self.path}: cannot open the feature store: {exc}") from None
        if MARKER not in self.group.attrs:
            raise UserError(f"{self.path}: a Zarr group, but not a feature store written by `features`")

    # -- creation ----------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike, imgids: np.ndarray, outputs: Mapping[str, int],
               block_size: int, config: Mapping[str, Any], provenance: Mapping[str, Any],
               overwrite: bool = False) -> FeatureStore:
        """Create an empty store for ``len(imgids)`` rows and the ``outputs`` (name -> width).

        Built in a temporary sibling folder and renamed into place, so a run killed while creating
        leaves either no store or a complete empty one. ``overwrite`` replaces an existing store
        (never a folder that is not one).
        """
        path = Path(path)
        if path.exists():
            if not overwrite:
                raise FileExistsError(path)
            _check_replaceable(path)
        n = int(len(imgids))
        if block_size < 1:
            raise UserError(f"block size must be at least 1, got {block_size}")
        n_blocks = max(1, math.ceil(n / block_size))
        with atomic_directory(path, overwrite=True) as tmp:
            g = zarr.open_group(str(tmp), mode="w", zarr_format=3)
            g.create_array("imgid", shape=(n,), chunks=(block_size,), dtype="int64", fill_value=-1)
            g["imgid"][:] = np.asarray(imgids, dtype=np.int64)
            g.create_array("valid", shape=(n,), chunks=(block_size,), dtype="bool", fill_value=False)
            g.create_array("blocks_done", shape=(n_blocks,), chunks=(1,), dtype="bool", fill_value=False)
            g.create_array("failures", shape=(n_blocks,), chunks=(1,), dtype=str, fill_value="")
            for name, width in outputs.items():
                g.create_array(name, shape=(n, int(width)), chunks=(block_size, _column_chunk(name, width)),
                               dtype="float32", fill_value=np.nan)
            g.attrs.update({
                MARKER: STORE_FORMAT,
                "config": _jsonable(dict(config)),
                "provenance": _jsonable(dict(provenance)),
                "code_version": code_version(),
                "block_size": int(block_size),
                "n_blocks": n_blocks,
                "outputs": {k: int(v) for k, v in outputs.items()},
                "complete": False,
                "failures": [],
            })
        return cls(path, mode="r+")

    @classmethod
    def open_or_create(cls, path: str | os.PathLike, imgids: np.ndarray, outputs: Mapping[str, int],
                       block_size: int, config: Mapping[str, Any], provenance: Mapping[str, Any],
                       overwrite: bool = False, hints: Mapping[str, str] | None = None) -> FeatureStore:
        """Resume the store at ``path`` if it was made with ``config``; create it if absent.

        A store made with a different configuration is a :class:`UserError` naming the first
        differing key (``hints`` may add advice per key), unless ``overwrite`` starts over.
        """
        path = Path(path)
        if overwrite or not path.exists():
            return cls.create(path, imgids, outputs, block_size, config, provenance, overwrite=overwrite)
        store = cls(path, mode="r+")
        stored = store.attrs.get("config", {})
        wanted = _jsonable(dict(config))
        key = config_difference(stored, wanted)
        if key is not None:
            hint = (hints or {}).get(key, "use --overwrite to start over, or another --out")
            raise UserError(f"{path}: the existing store was made with {key}={stored.get(key)!r}, this run "
                            f"asks for {key}={wanted.get(key)!r} ({hint})")
        return store

    # -- shape and state ---------------------------------------------------------------------------
    @property
    def attrs(self) -> dict[str, Any]:
        """A copy of the group's attributes."""
        return dict(self.group.attrs)

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
        return np.asarray(self.group["blocks_done"][:], dtype=bool)

    def block_done(self, block: int) -> bool:
        """Whether ``block``'s flag is set (reads that one chunk only)."""
        return bool(self.group["blocks_done"][block])

    def has(self, name: str) -> bool:
        """Whether the array ``name`` (e.g. ``"global"``, ``"fne/ternary"``) exists."""
        try:
            self.group[name]
        except KeyError:
            return False
        return True

    def array(self, name: str) -> zarr.Array:
        """The Zarr array ``name``."""
        return self.group[name]

    # -- writing -----------------------------------------------------------------------------------
    def write_block(self, block: int, arrays: Mapping[str, np.ndarray], valid: np.ndarray,
                    failures: list[dict[str, Any]]) -> None:
        """Write one block's rows, validity and failures, then set its completion flag.

        ``arrays``: name -> (rows, width) float32 with NaN rows where ``valid`` is False. The flag
        is written last: a run killed before it recomputes the whole block on resume.
        """
        start, stop = self.block_rows(block)
        for name, values in arrays.items():
            if values.shape[0] != stop - start:
                raise ValueError(f"block {block}: {name} has {values.shape[0]} rows, expected {stop - start}")
            self.group[name][start:stop] = np.asarray(values, dtype=np.float32)
        self.group["valid"][start:stop] = np.asarray(valid, dtype=bool)
        self.group["failures"][block] = json.dumps(failures) if failures else ""
        self.group["blocks_done"][block] = True

    def block_failures(self) -> list[dict[str, Any]]:
        """Failed images of every block, in row order."""
        out: list[dict[str, Any]] = []
        for text in self.group["failures"][:]:
            if text:
                out.extend(json.loads(str(text)))
        return sorted(out, key=lambda f: f["imgid"])

    def set_attrs(self, **values: Any) -> None:
        """Update attributes (only the driver calls this, never concurrent block tasks)."""
        self.group.attrs.update(_jsonable(values))

    def require_complete(self) -> None:
        """A :class:`UserError` unless every block is done and the run was finalized."""
        done = self.blocks_done()
        if not done.all() or not self.group.attrs.get("complete", False):
            raise UserError(f"{self.path}: the store is incomplete ({int(done.sum())}/{done.size} blocks "
                            "done); run the same `features` command again to finish it")


def _column_chunk(name: str, width: int) -> int:
    return int(min(width, COLUMN_CHUNK)) if name.startswith("fne/") else int(width)


def _check_replaceable(path: Path) -> None:
    """Refuse to delete anything but a feature store (or an empty folder) on ``--overwrite``."""
    if path.is_dir() and not any(path.iterdir()):
        return
    try:
        attrs = json.loads((path / "zarr.json").read_text(encoding="utf-8")).get("attributes", {})
    except (OSError, ValueError):
        attrs = {}
    if MARKER not in attrs:
        raise UserError(f"{path}: exists and is not a feature store; refusing to overwrite it")


def remove_store(path: str | os.PathLike) -> None:
    """Delete a feature store (checked to be one)."""
    path = Path(path)
    if path.exists():
        _check_replaceable(path)
        shutil.rmtree(path)


KEYS = ("global", "fne", "fne_raw")


def parse_spec(spec: str) -> tuple[Path, str | None]:
    """``"PATH.zarr:key"`` -> ``(PATH.zarr, key)``; a bare path -> ``(path, None)``."""
    head, sep, tail = str(spec).rpartition(":")
    if sep and tail in KEYS and head:
        return Path(head), tail
    return Path(spec), None


def read_matrix(spec: str) -> tuple[np.ndarray, np.ndarray]:
    """Read a feature matrix for training: ``(x float32 (N, C), valid bool (N,))``.

    ``spec`` is ``"PATH.zarr:global"``, ``"PATH.zarr:fne"`` (the ternary FNE as float32) or
    ``"PATH.zarr:fne_raw"`` (the raw averaged activations); a bare path picks ``global`` if the
    store has it, else ``fne``. Rows of failed images are NaN and ``valid`` is False there.
    """
    path, key = parse_spec(spec)
    store = FeatureStore(path)
    store.require_complete()
    if key is None:
        key = "global" if store.has("global") else "fne"
    name = {"global": "global", "fne": "fne/ternary", "fne_raw": "fne/raw"}[key]
    if not store.has(name):
        have = [k for k, n in (("global", "global"), ("fne", "fne/ternary"), ("fne_raw", "fne/raw"))
                if store.has(n)]
        raise UserError(f"{path}: no '{key}' features in this store (it has: {', '.join(have) or 'none'})")
    valid = np.asarray(store.array("valid")[:], dtype=bool)
    x = np.asarray(store.array(name)[:]).astype(np.float32, copy=False)
    if not valid.all():
        x[~valid] = np.nan
    return x, valid
