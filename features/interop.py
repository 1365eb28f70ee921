"""Exchange with other codebases: VSE++/SCAN precomp ``{split}_ims.npy`` and HDF5 (h5py).

Precomp layout (VSE++ ``data.py``, SCAN): one file per split, one row per image in the split's
image order, float32; the validation split is called ``dev``. Export writes what a store holds;
import places a split's rows at that split's images of a prepared dataset.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from features.store import FeatureStore, parse_spec, read_matrix
from prep.dataset import DATASET_FILE, SPLITS, PreparedDataset
from prep.errors import UserError
from prep.io import exclusive_lock, sha256_file

#: precomp file prefix of each split (VSE++/SCAN call the validation split ``dev``)
PRECOMP_NAMES = {"train": "train", "val": "dev", "test": "test"}


def _save_npy_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        np.save(fh, array)
    os.replace(tmp, path)


def export_store(spec: str, data: str | os.PathLike, fmt: str, out: str | os.PathLike,
                 splits: Sequence[str] | None = None, allow_invalid: bool = False) -> list[Path]:
    """Write a finished store as precomp ``.npy`` files (``fmt="precomp"``) or one HDF5 file.

    Rows of failed images are refused (they would be NaN in another codebase) unless
    ``allow_invalid``; so is a store made for another prepared dataset than ``data``
    (:func:`features.store.check_store_matches`). Returns the files written.
    """
    dataset = PreparedDataset.load(data)
    path, _ = parse_spec(spec)
    store = FeatureStore(path)
    x, valid = read_matrix(spec, dataset)  # refuses a store of another dataset, or a damaged one
    splits = list(splits) if splits else [s for s in SPLITS if dataset.image_rows(s)]
    rows = {s: np.asarray(dataset.image_rows(s), dtype=np.int64) for s in splits}
    for split, r in rows.items():
        if not len(r):
            raise UserError(f"{data}: split '{split}' has no images")
        bad = r[~valid[r]]
        if len(bad) and not allow_invalid:
            raise UserError(f"{path}: {len(bad)} {split} rows are failed images (first imgid {bad[0]}); "
                            "fix or drop them, or pass --allow-invalid to write them as NaN")
    out = Path(out)
    if fmt == "precomp":
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for split, r in rows.items():
            file = out / f"{PRECOMP_NAMES[split]}_ims.npy"
            _save_npy_atomic(file, np.ascontiguousarray(x[r], dtype=np.float32))
            written.append(file)
        return written
    if fmt == "hdf5":
        return [_export_hdf5(store, dataset, np.concatenate(list(rows.values())), out)]
    raise UserError(f"unknown export format '{fmt}' (precomp or hdf5)")


def _export_hdf5(store: FeatureStore, dataset: PreparedDataset, rows: np.ndarray, out: Path) -> Path:
    import h5py

    rows = np.sort(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        _write_hdf5(h5py.File(tmp, "w"), store, dataset, rows)
    except BaseException:
        tmp.unlink(missing_ok=True)  # e.g. a damaged chunk: no half-written file left behind
        raise
    os.replace(tmp, out)
    return out


def _write_hdf5(file: object, store: FeatureStore, dataset: PreparedDataset, rows: np.ndarray) -> None:
    names = [n for n in ("global", "fne/raw", "fne/ternary") if store.has(n)]
    with file as h5:
        for name in names:
            h5.create_dataset(name, data=np.asarray(store.array(name)[:])[rows], compression="gzip")
        for name in ("fne/mean", "fne/std"):
            if store.has(name):
                h5.create_dataset(name, data=np.asarray(store.array(name)[:]))
        h5.create_dataset("imgid", data=rows)
        h5.create_dataset("valid", data=np.asarray(store.array("valid")[:], dtype=bool)[rows])
        h5.create_dataset("split", data=np.array([dataset.images[r].split for r in rows], dtype="S5"))
        attrs = store.attrs
        h5.attrs["provenance"] = json.dumps(attrs.get("provenance", {}))
        h5.attrs["config"] = json.dumps(attrs.get("config", {}))


@dataclass
class ImportResult:
    """What :func:`import_npy` did: the store, and the imported rows made invalid for NaN/inf values."""

    store: Path
    rows: int
    nonfinite: list[int] = field(default_factory=list)


def import_npy(npy: str | os.PathLike, data: str | os.PathLike, split: str, out: str | os.PathLike,
               overwrite: bool = False, name: str = "global") -> ImportResult:
    """Read a precomp ``(n_split_images, C)`` array into the store ``out`` at ``split``'s rows.

    A new store has every row NaN / ``valid=False`` except the imported split; an existing
    imported store of the same images and width gains the split. Rows holding NaN or inf are
    stored invalid and recorded as failures (reason "non-finite values"). The store's lock is held
    from before ``overwrite`` deletes anything until the end.
    """
    npy, out = Path(npy), Path(out)
    try:
        x = np.load(npy, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UserError(f"{npy}: cannot read as .npy: {exc}") from None
    if x.ndim != 2:
        raise UserError(f"{npy}: expected a 2-D (images, features) array, got shape {x.shape}")
    dataset = PreparedDataset.load(data)
    rows = np.asarray(dataset.image_rows(split), dtype=np.int64)
    if len(rows) != x.shape[0]:
        raise UserError(f"{npy}: {x.shape[0]} rows, but split '{split}' of {data} has {len(rows)} images")
    images_sha = dataset.images_fingerprint()
    n = len(dataset.images)
    config = {"kind": "import", "images_sha256": images_sha, "n_rows": n, "outputs": {name: int(x.shape[1])}}
    provenance = {"imported_from": {}, "dataset": str(dataset.root), "images_sha256": images_sha,
                  "dataset_sha256": sha256_file(dataset.root / DATASET_FILE)}
    values = np.asarray(x, dtype=np.float32)
    finite = np.isfinite(values).all(axis=1)
    with exclusive_lock(out, "the feature store"):
        store = FeatureStore.open_or_create(
            out, np.arange(n, dtype=np.int64), {name: int(x.shape[1])}, block_size=min(n, 1024),
            config=config, provenance=provenance, overwrite=overwrite)
        # One writer (this command), block by block: every chunk is written (a chunk file missing from
        # a finished block means damage, see features.verify), and memory stays one block.
        source = np.full(n, -1, dtype=np.int64)
        source[rows] = np.arange(len(rows))
        arr = store.array(name)
        for b in range(store.n_blocks):
            start, stop = store.block_rows(b)
            block, k = np.asarray(arr[start:stop]), source[start:stop]
            hit = k >= 0
            block[hit] = np.where(finite[k[hit], None], values[k[hit]], np.nan)
            arr[start:stop] = block
        valid = np.asarray(store.array("valid")[:], dtype=bool)
        valid[rows] = finite
        store.array("valid")[:] = valid
        bad = rows[~finite]
        _record_failures(store, set(rows.tolist()), [
            {"imgid": int(i), "path": str(npy), "reason": f"non-finite values (NaN or inf) in row "
                                                          f"{int(k)} of the imported array"}
            for k, i in zip(np.flatnonzero(~finite), bad, strict=True)])
        store.array("blocks_done")[:] = True
        prov = store.attrs["provenance"]
        prov.setdefault("imported_from", {})[split] = {"file": str(npy.resolve()), "sha256": sha256_file(npy),
                                                       "nonfinite_rows": len(bad)}
        store.set_attrs(provenance=prov, complete=True, failures=store.block_failures())
    return ImportResult(out, len(rows), [int(i) for i in bad])


def _record_failures(store: FeatureStore, replaced: set[int], new: list[dict]) -> None:
    """Per-block failure records: those of rows in ``replaced`` dropped, ``new`` added."""
    kept = [f for f in store.block_failures() if f["imgid"] not in replaced] + new
    per_block: dict[int, list[dict]] = {b: [] for b in range(store.n_blocks)}
    for f in sorted(kept, key=lambda f: f["imgid"]):
        per_block[f["imgid"] // store.block_size].append(f)
    failures = store.array("failures")
    for b, items in per_block.items():
        failures[b] = json.dumps(items) if items else ""
