"""``features import``: features other codebases made, into a store of a prepared dataset.

VSE++/SCAN precomp ``{split}_ims.npy`` (the layout :mod:`features.interop.export` writes) places a split's
rows at that split's images; an HDF5 file's rows go to its own imgids (:func:`import_hdf5`). Region files
(SCAN precomp, bottom-up-attention TSV) are read by :mod:`features.interop.region_formats` and written by the
same block writer (:func:`import_regions`).
"""


from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from features.extractors.regions import REGION_DTYPES
from features.interop.export import COCO_1K, COCO_5K, image_file
from features.store.core import FeatureStore, remove_killed_leftovers
from features.store.layout import RowShape, row_shape
from prep.dataset import DATASET_FILE, PreparedDataset
from vsecore.containers import ContainerError, npy_header
from vsecore.errors import UserError
from vsecore.io import exclusive_lock, sha256_file
from vsecore.outputs import check_output_folder


@dataclass
class ImportResult:
    """What an import did: the store, the imported files, the rows read, the dataset rows the files lack
    (stored invalid), the files' ids matching no image, and the rows made invalid for NaN/inf values."""

    store: Path
    rows: int
    nonfinite: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


#: the most bytes of one imported chunk (rows of a block); a block of global rows is at most 1024 rows
IMPORT_CHUNK_BYTES = 64 * 2**20


def check_real_dtype(dtype: np.dtype, where: str) -> None:
    """A :class:`UserError` unless ``dtype`` holds real numbers (float, int, uint, bool): a complex array
    would lose its imaginary part in the float32 cast, and strings or records are no features."""
    if dtype.kind not in "fiub":
        what = "complex numbers" if dtype.kind == "c" else f"dtype {dtype}"
        raise UserError(f"{where}: holds {what}; features must be real numbers (float or integer)")


def check_npy_header(npy: Path) -> tuple[tuple[int, ...], np.dtype]:
    """``(shape, dtype)`` from the header of the ``.npy`` file ``npy``, checked before any data is read.

    One-line :class:`UserError` for a file that is not ``.npy``, whose dtype is not real
    (:func:`check_real_dtype`), or whose body is shorter than its header claims (a truncated file,
    or a header forged to claim e.g. 10,000,000 x 1,000 rows on a 1 KB body).
    """
    try:
        header = npy_header(npy)
    except FileNotFoundError:
        raise UserError(f"{npy}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{npy}: is a folder, expected a .npy file") from None
    except (ContainerError, OSError) as exc:
        raise UserError(f"{npy}: cannot read as .npy: {getattr(exc, 'strerror', None) or exc}") from None
    check_real_dtype(header.dtype, str(npy))
    return tuple(header.shape), header.dtype


def import_npy(npy: str | os.PathLike, data: str | os.PathLike, split: str, out: str | os.PathLike,
               overwrite: bool = False, name: str = "global") -> ImportResult:
    """Read a precomp ``(n_split_images, C)`` array into the store ``out`` at ``split``'s rows.

    A new store has every row NaN / ``valid=False`` except the imported split; an existing
    imported store of the same images and width gains the split. Rows holding NaN or inf are
    stored invalid and recorded as failures (reason "non-finite values"). The store's lock is held
    from before ``overwrite`` deletes anything until the end.
    """
    npy = Path(npy)
    check_npy_header(npy)
    try:
        x = np.load(npy, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UserError(f"{npy}: cannot read as .npy: {exc}") from None
    if x.ndim != 2:
        raise UserError(f"{npy}: expected a 2-D (images, features) array, got shape {x.shape}"
                        + (" (region features: --format scan-precomp)" if x.ndim == 3 else ""))
    dataset = PreparedDataset.load(data)
    rows = np.asarray(dataset.image_rows(split), dtype=np.int64)
    if len(rows) != x.shape[0]:
        scan_1k = split == "test" and len(rows) == COCO_5K and x.shape[0] == COCO_1K
        hint = (" (SCAN's test_ims.npy holds the first 1,000 of COCO's 5k test images: import "
                "testall_ims.npy)" if scan_1k else "")
        raise UserError(f"{npy}: {x.shape[0]} rows, but split '{split}' of {data} has {len(rows)} "
                        f"images{hint}")
    position = {int(r): i for i, r in enumerate(rows)}

    def read(wanted: np.ndarray) -> dict[str, np.ndarray]:
        return {name: np.asarray(x[[position[int(r)] for r in wanted]], dtype=np.float32)}

    return _import_rows(out, dataset, {name: int(x.shape[1])}, None, rows, rows, read, [npy], split,
                        overwrite=overwrite)


def import_hdf5(h5file: str | os.PathLike, data: str | os.PathLike, out: str | os.PathLike,
                split: str | None = None, overwrite: bool = False) -> ImportResult:
    """Read an HDF5 file in the layout ``features export --format hdf5`` writes into the store ``out``.

    The file's ``global`` rows go to the images its ``imgid`` dataset names (only those of ``split``
    when given; that split's images the file lacks are then stored invalid). Its ``filename`` (and
    ``cocoid``) datasets, when present, must name the same images in ``data``: a file made for another
    prepared dataset is refused. Rows the file marks ``valid=False`` or holding NaN/inf are stored
    invalid, as :func:`import_npy` does.
    """
    import h5py

    h5file = Path(h5file)
    dataset = PreparedDataset.load(data)
    try:
        h5 = h5py.File(h5file, "r")
    except OSError as exc:
        raise UserError(f"{h5file}: cannot read as HDF5: {exc}") from None
    with h5:
        if "global" not in h5:
            raise UserError(f"{h5file}: no 'global' dataset to import (it holds {', '.join(sorted(h5))}); "
                            "only global features can be imported")
        if "imgid" not in h5:
            raise UserError(f"{h5file}: no 'imgid' dataset saying which image each row is")
        check_real_dtype(h5["global"].dtype, f"{h5file}: 'global'")
        x = np.asarray(h5["global"][:], dtype=np.float32)
        imgid = np.asarray(h5["imgid"][:], dtype=np.int64)
        file_valid = np.asarray(h5["valid"][:], dtype=bool) if "valid" in h5 else np.ones(len(imgid), bool)
        names = ([n.decode() if isinstance(n, bytes) else str(n) for n in h5["filename"][:]]
                 if "filename" in h5 else None)
        cocoids = np.asarray(h5["cocoid"][:], dtype=np.int64) if "cocoid" in h5 else None
    if x.ndim != 2 or len(imgid) != x.shape[0] or len(file_valid) != x.shape[0]:
        raise UserError(f"{h5file}: 'global' {x.shape}, 'imgid' ({len(imgid)},) and 'valid' "
                        f"({len(file_valid)},) do not describe the same rows")
    n = len(dataset.images)
    if len(imgid) and (imgid.min() < 0 or imgid.max() >= n or len(np.unique(imgid)) != len(imgid)):
        raise UserError(f"{h5file}: 'imgid' must be distinct rows of {data} (0 to {n - 1})")
    for k, i in enumerate(imgid):
        im = dataset.images[int(i)]
        if names is not None and names[k] != image_file(im):
            raise UserError(f"{h5file}: row {k} is image '{names[k]}', but imgid {i} of {data} is "
                            f"'{image_file(im)}': the file was made for another prepared dataset")
        if cocoids is not None and cocoids[k] != (-1 if im.cocoid is None else im.cocoid):
            raise UserError(f"{h5file}: row {k} has COCO id {cocoids[k]}, but imgid {i} of {data} has "
                            f"{im.cocoid}: the file was made for another prepared dataset")
    keep = np.array([split is None or dataset.images[int(i)].split == split for i in imgid], dtype=bool)
    if not keep.any():
        raise UserError(f"{h5file}: no rows of split '{split}' of {data}")
    x[~file_valid] = np.nan  # rows the file says are failed images stay invalid here
    position = {int(i): k for k, i in enumerate(imgid) if keep[k]}
    present = np.sort(imgid[keep])
    replaced = np.asarray(dataset.image_rows(split), dtype=np.int64) if split else present

    def read(wanted: np.ndarray) -> dict[str, np.ndarray]:
        return {"global": x[[position[int(r)] for r in wanted]]}

    return _import_rows(out, dataset, {"global": int(x.shape[1])}, None, replaced, present, read, [h5file],
                        split or "hdf5", overwrite=overwrite)


def import_regions(fmt: str, files: Sequence[str | os.PathLike], data: str | os.PathLike,
                   out: str | os.PathLike, split: str | None = None, ids: str | os.PathLike | None = None,
                   overwrite: bool = False) -> ImportResult:
    """Read region features into a region store ``out``: ``regions (N, k, D)``, ``counts (N,)``, and for a
    bottom-up-attention TSV also ``boxes (N, k, 4)`` and ``image_size (N, 2)``.

    ``fmt``: ``scan-precomp`` (``files`` = one ``{split}_ims.npy`` of ``split``, rows in the split's order
    or matched by ``ids``; :func:`features.interop.region_formats.read_scan_precomp`) or ``butd-tsv``
    (``files`` = the TSV files, matched by image id, all splits or only ``split``; :class:`ButdTsv`). Dataset
    rows (of the split, or of the whole dataset) the files lack are stored invalid and recorded as failures;
    so are rows with NaN or inf. Zero rows after each image's ``counts`` are padding (precomp files have no
    counts: an image's trailing all-zero rows are taken as padding, at least one region is kept). An existing
    imported store of the same images and shapes gains the rows (e.g. one split after another).
    """
    from features.interop.region_formats import read_butd_tsv, read_scan_precomp

    dataset = PreparedDataset.load(data)
    paths = [Path(f) for f in files]
    if fmt == "scan-precomp":
        if split is None or len(paths) != 1:
            raise UserError("scan-precomp: one {split}_ims.npy and its --split")
        source = read_scan_precomp(paths[0], dataset, split, ids=ids)
    elif fmt == "butd-tsv":
        source = read_butd_tsv(paths, dataset, [split] if split else None)
    else:
        raise UserError(f"unknown region format '{fmt}' (scan-precomp or butd-tsv)")
    if not len(source.rows):
        raise UserError(f"{', '.join(map(str, paths))}: no row matches an image of {data} "
                        f"({source.summary()})")
    replaced = np.asarray(dataset.image_rows(split) if split else dataset.image_rows(), dtype=np.int64)
    outputs: dict[str, tuple[int, ...]] = {"regions": (source.k, source.dim), "counts": ()}
    if source.has_boxes:
        outputs.update(boxes=(source.k, 4), image_size=(2,))
    dtypes = {n: REGION_DTYPES[n].name for n in outputs}

    def read(wanted: np.ndarray) -> dict[str, np.ndarray]:
        got = {n: np.zeros((len(wanted), *shape), dtype=dtypes[n]) for n, shape in outputs.items()}
        for i, row in enumerate(wanted):
            record = source.read(int(row))
            got["regions"][i], boxes, count = record.padded(source.k)
            if not source.has_boxes:  # precomp: trailing all-zero rows are padding (e.g. adaptive K exported)
                real = np.flatnonzero(np.abs(got["regions"][i]).sum(axis=1) != 0)
                count = max(1, int(real[-1]) + 1) if len(real) else 1
            got["counts"][i] = count
            if source.has_boxes:
                got["boxes"][i] = boxes
                got["image_size"][i] = record.image_size or (0, 0)
        return got

    result = _import_rows(out, dataset, outputs, dtypes, replaced, source.rows, read, paths,
                          split or "all", overwrite=overwrite)
    result.extra = list(source.extra)
    return result


def _import_rows(out: str | os.PathLike, dataset: PreparedDataset, outputs: dict[str, RowShape],
                 dtypes: dict[str, str] | None, replaced: np.ndarray, present: np.ndarray,
                 read: Callable[[np.ndarray], dict[str, np.ndarray]], files: list[Path], label: str,
                 overwrite: bool) -> ImportResult:
    """The writer of every import: dataset rows ``replaced`` (e.g. a split) are replaced by what ``read``
    gives for the rows ``present`` in the source (ascending); replaced rows not present are invalid.

    ``read(rows)`` -> name -> ``(len(rows), *row_shape)``. Written block by block under the store's lock
    (every chunk written, memory one block); rows holding NaN or inf become invalid; both kinds of
    invalid rows are recorded as failures, earlier failures of ``replaced`` rows dropped.
    """
    out = Path(out)
    # the shared output rules: not an input, not /, inside no prepared dataset, run or other store
    check_output_folder(out, (), inputs=[*files, dataset.root], owner=out)
    images_sha = dataset.images_fingerprint()
    n = len(dataset.images)
    config = {"kind": "import", "images_sha256": images_sha, "n_rows": n, "outputs": outputs}
    provenance = {"imported_from": {}, "dataset": str(dataset.root), "images_sha256": images_sha,
                  "dataset_sha256": sha256_file(dataset.root / DATASET_FILE)}
    row_bytes = sum(4 * int(np.prod(row_shape(s))) for s in outputs.values())
    block_size = max(1, min(n, 1024, IMPORT_CHUNK_BYTES // max(1, row_bytes)))
    present = np.asarray(present, dtype=np.int64)
    missing = np.setdiff1d(replaced, present)
    bad: list[int] = []
    with exclusive_lock(out, "the feature store"):
        remove_killed_leftovers(out)
        store = FeatureStore.open_or_create(
            out, np.arange(n, dtype=np.int64), outputs, block_size=block_size, config=config,
            provenance=provenance, overwrite=overwrite, dtypes=dtypes)
        valid = np.asarray(store.array("valid")[:], dtype=bool)
        valid[replaced] = False
        # One writer (this command), block by block: every chunk is written (a chunk file missing from
        # a finished block means damage, see features.store.verify), and memory stays one block.
        for b in range(store.n_blocks):
            start, stop = store.block_rows(b)
            in_block = (present >= start) & (present < stop)
            written = _merge_block(store, list(outputs), start, stop,
                                   replaced[(replaced >= start) & (replaced < stop)], present[in_block], read)
            valid[written] = True
            bad += [int(r) for r in np.setdiff1d(present[in_block], written)]
        store.array("valid")[:] = valid
        where = ", ".join(str(f) for f in files)
        _record_failures(store, set(replaced.tolist()), sorted(
            [{"imgid": i, "path": where, "reason": "non-finite values (NaN or inf) in the imported features"}
             for i in bad]
            + [{"imgid": int(i), "path": where, "reason": "no features for this image in the imported file"}
               for i in missing], key=lambda f: f["imgid"]))
        store.array("blocks_done")[:] = True
        prov = store.attrs["provenance"]
        prov.setdefault("imported_from", {})[label] = {
            "files": [str(f.resolve()) for f in files], "sha256": [sha256_file(f) for f in files],
            "rows": len(present), "missing_rows": len(missing), "nonfinite_rows": len(bad)}
        store.set_attrs(provenance=prov, complete=True, failures=store.block_failures())
    return ImportResult(out, len(present), bad, [int(i) for i in missing], [], files)


def _merge_block(store: FeatureStore, names: list[str], start: int, stop: int, replaced: np.ndarray,
                 present: np.ndarray, read: Callable[[np.ndarray], dict[str, np.ndarray]]) -> np.ndarray:
    """Rewrite rows ``start:stop`` of the arrays ``names``: ``replaced`` rows emptied (NaN, or 0 for
    integer arrays), then the ``present`` rows whose values are all finite filled from ``read``.
    Returns the rows filled."""
    store.check_chunk_places(start // store.block_size, [*names, "valid", "failures", "blocks_done"])
    blocks = {name: np.asarray(store.array(name)[start:stop]) for name in names}
    for name, block in blocks.items():
        block[replaced - start] = store.empty_rows(name, 1)
    filled = present[:0]
    if len(present):
        values = read(present)
        finite = np.ones(len(present), dtype=bool)
        for v in values.values():
            if v.dtype.kind == "f":
                finite &= np.isfinite(v.reshape(len(present), -1)).all(axis=1)
        filled = present[finite]
        for name, block in blocks.items():
            block[filled - start] = values[name][finite]
    for name, block in blocks.items():
        store.array(name)[start:stop] = block
    return filled


def _record_failures(store: FeatureStore, replaced: set[int], new: list[dict]) -> None:
    """Per-block failure records: those of rows in ``replaced`` dropped, ``new`` added."""
    kept = [f for f in store.block_failures() if f["imgid"] not in replaced] + new
    per_block: dict[int, list[dict]] = {b: [] for b in range(store.n_blocks)}
    for f in sorted(kept, key=lambda f: f["imgid"]):
        per_block[f["imgid"] // store.block_size].append(f)
    failures = store.array("failures")
    for b, items in per_block.items():
        failures[b] = json.dumps(items) if items else ""
