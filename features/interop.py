"""Exchange with other codebases: VSE++/SCAN precomp ``{split}_ims.npy``, HDF5 (h5py) and, for region
stores, the bottom-up-attention TSV.

Precomp layout (VSE++ ``data.py``, SCAN): one file per split, one row per image in the split's
image order, float32; the validation split is called ``dev``; a row is a vector ``(C,)`` (VSE++) or
SCAN's regions ``(k, D)``. With each ``{name}_ims.npy`` export writes ``{name}_caps.txt``, the captions
one per line grouped by image in the same order, and ``{name}_ids.json``, every row's image (prepared
imgid, COCO id, file); a test split of 5,000 images (COCO's Karpathy 5k) is written as SCAN ships it:
``testall_*`` all 5,000 images, ``test_*`` the first 1,000 (the 1k test set). Export writes what a
store holds; import places a split's rows at that split's images of a prepared dataset, or an HDF5
file's rows at its own imgids (:func:`import_hdf5`). Region files (SCAN precomp, bottom-up-attention
TSV) are read by :mod:`features.region_formats` and written by the same block writer
(:func:`import_regions`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from features.store import (
    REGION_ARRAYS,
    FeatureStore,
    RowShape,
    parse_spec,
    read_matrix,
    row_shape,
    stored_region_counts,
)
from prep.dataset import DATASET_FILE, SPLITS, PreparedDataset
from vsecore import console
from vsecore.errors import UserError
from vsecore.io import atomic_file, deferred_interrupts, exclusive_lock, sha256_file, write_json_atomic
from vsecore.outputs import check_output_file, check_output_folder

#: what ``features export --format`` writes
EXPORT_FORMATS = ("precomp", "hdf5", "butd-tsv")
#: precomp file prefix of each split (VSE++/SCAN call the validation split ``dev``)
PRECOMP_NAMES = {"train": "train", "val": "dev", "test": "test"}
#: a test split of this many images is COCO's 5k: written as ``testall`` (all) and ``test`` (first 1k)
COCO_5K, COCO_1K = 5000, 1000


def _precomp_parts(rows: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """``(file prefix, rows)`` of every precomp part: one per split (``dev`` for val); a 5,000-image
    test split gives ``testall`` (all) and ``test`` (the first 1,000), as SCAN ships COCO."""
    parts = []
    for split, r in rows.items():
        if split == "test" and len(r) == COCO_5K:
            parts += [("testall", r), ("test", r[:COCO_1K])]
        else:
            parts.append((PRECOMP_NAMES[split], r))
    return parts


def _precomp_files(name: str, languages: Sequence[str], regions: bool = False) -> list[str]:
    """The file names :func:`_write_precomp` writes for the part ``name``, in writing order (a region
    store also gets ``{name}_counts.npy``, the real regions of each padded row)."""
    caps = [f"{name}_caps.txt" if k == 0 else f"{name}_caps.{lang}.txt" for k, lang in enumerate(languages)]
    return [f"{name}_ims.npy", *([f"{name}_counts.npy"] if regions else []), *caps,
            f"{name}_ids.json"]


#: caption counts per image that VSE++/SCAN's precomp loaders pair correctly (caption i belongs to image
#: i // 5, or i when there is one caption per image)
PEER_CAPTIONS_PER_IMAGE = (5, 1)


def precomp_captions(captions: list[list[str]], keep: int | None, where: str
                     ) -> tuple[list[str], dict[str, int]]:
    """The caption lines of a precomp part (images in row order) and what the policy did.

    VSE++/SCAN read caption ``i`` of ``{split}_caps.txt`` as belonging to image ``i // 5`` (or ``i`` when
    there are as many captions as images), so every image needs the same count, 5 or 1. Without
    ``keep`` a split with other counts is refused (one line naming the counts); with ``keep = K`` each
    image's first K captions are kept and, where it has fewer, its captions are repeated in order
    (``a b a b a`` for two), as the peers' COCO preparation does. Returns the lines and
    ``{"repeated": n, "dropped": n}``.
    """
    counts = [len(c) for c in captions]
    if keep is None:
        uniform = len(set(counts)) == 1
        if uniform and counts and counts[0] in PEER_CAPTIONS_PER_IMAGE:
            return [t for c in captions for t in c], {"repeated": 0, "dropped": 0}
        low, high = (min(counts), max(counts)) if counts else (0, 0)
        raise UserError(f"{where}: images have {low} to {high} captions, but VSE++/SCAN pair caption i with "
                        "image i // 5 (or i with one caption each), so most captions would meet the wrong "
                        "image; give --captions-per-image 5 (or 1) to keep each image's first captions, "
                        "repeating them where it has fewer")
    if keep < 1:
        raise UserError(f"--captions-per-image {keep}: must be at least 1")
    if any(n == 0 for n in counts):
        first = counts.index(0)
        raise UserError(f"{where}: image row {first} has no caption to keep or repeat")
    lines, repeated, dropped = [], 0, 0
    for caps in captions:
        lines += [caps[k % len(caps)] for k in range(keep)]
        repeated += max(0, keep - len(caps))
        dropped += max(0, len(caps) - keep)
    return lines, {"repeated": repeated, "dropped": dropped}


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An ``OSError`` without a file name (a write into an open file: a full disk) names ``path``,
    the file being written, so that :func:`vsecore.errors.run_cli` can say where in one line."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            exc.filename = str(path)
        raise


#: bytes handed to one ``write`` call by :func:`_save_npy`
_NPY_WRITE_BYTES = 16 * 2**20


def _save_npy(fh: Any, array: np.ndarray) -> None:
    """``np.save`` of a C-contiguous array into the open file ``fh``, written by ``fh.write`` in pieces:
    ``np.save`` goes through ``ndarray.tofile``, whose short write on a full disk is an ``OSError``
    without an errno (so no one-line message could say what happened)."""
    np.lib.format.write_array_header_1_0(fh, np.lib.format.header_data_from_array_1_0(array))
    data = memoryview(array).cast("B")
    for start in range(0, len(data), _NPY_WRITE_BYTES):
        fh.write(data[start:start + _NPY_WRITE_BYTES])


def export_store(spec: str, data: str | os.PathLike, fmt: str, out: str | os.PathLike,
                 splits: Sequence[str] | None = None, allow_invalid: bool = False,
                 overwrite: bool = False, captions_per_image: int | None = None) -> list[Path]:
    """Write a finished store as precomp ``.npy`` files (``fmt="precomp"``) or one HDF5 file.

    The output is checked first with :mod:`vsecore.outputs` (never the store, the prepared dataset or
    anything inside them or inside another toolkit artifact; an existing file of the same name only
    with ``overwrite``). Rows of failed images are refused (they would be NaN in another codebase)
    unless ``allow_invalid``; so is a store made for another prepared dataset than ``data``
    (:func:`features.store.check_store_matches`). Every file is written atomically
    (:func:`vsecore.io.atomic_file`). A precomp split whose images do not all have 5 (or all 1) captions
    is refused unless ``captions_per_image`` names the policy of :func:`precomp_captions`; a region
    store's padded rows come with ``{name}_counts.npy`` (and a warning when the counts vary). Returns
    the files written.
    """
    if fmt not in EXPORT_FORMATS:
        raise UserError(f"unknown export format '{fmt}' ({', '.join(EXPORT_FORMATS)})")
    dataset = PreparedDataset.load(data)
    path, _ = parse_spec(spec)
    splits = list(splits) if splits else [s for s in SPLITS if dataset.image_rows(s)]
    rows = {s: np.asarray(dataset.image_rows(s), dtype=np.int64) for s in splits}
    for split, r in rows.items():
        if not len(r):
            raise UserError(f"{data}: split '{split}' has no images")
    inputs = [path, dataset.root]
    out = Path(out)
    if captions_per_image is not None and fmt != "precomp":
        raise UserError("--captions-per-image goes with --format precomp (an HDF5 file keeps every caption "
                        "with its image)")
    store = FeatureStore(path)
    regions = store.has("counts") and parse_spec(spec)[1] in (None, "regions")
    if fmt == "precomp":
        names = [f for name, _ in _precomp_parts(rows)
                 for f in _precomp_files(name, dataset.languages, regions)]
        check_output_folder(out, names, inputs=inputs, overwrite=overwrite)
    else:
        check_output_file(out, inputs=inputs, overwrite=overwrite)
    x, valid = read_matrix(spec, dataset)  # refuses a store of another dataset, or a damaged one
    for split, r in rows.items():
        bad = r[~valid[r]]
        if len(bad) and not allow_invalid:
            raise UserError(f"{path}: {len(bad)} {split} rows are failed images (first imgid {bad[0]}); "
                            "fix or drop them, or pass --allow-invalid to write them as NaN")
    if fmt == "hdf5":
        del x  # the HDF5 writer reads the store block by block
        return [_export_hdf5(store, dataset, np.concatenate(list(rows.values())), out)]
    if fmt == "butd-tsv":
        del x
        return [_export_butd_tsv(store, dataset, np.sort(np.concatenate(list(rows.values()))), valid, out)]
    counts = stored_region_counts(store) if regions else None
    if counts is not None and len(np.unique(counts)) > 1:
        console.warning(f"{path}: regions per image vary ({int(counts.min())} to {int(counts.max())}): the "
                        "precomp rows are zero-padded to the largest; {split}_counts.npy says how many are "
                        "real (a loader without a mask would treat the padding as regions)")
    # every part's captions are checked (and the policy applied) before anything is written
    parts = [(name, part, _part_captions(dataset, part, captions_per_image, out / f"{name}_caps.txt"))
             for name, part in _precomp_parts(rows)]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, part, captions in parts:
        written += _write_precomp(out, name, x, part, dataset, captions,
                                  None if counts is None else counts[part])
    return written


def _part_captions(dataset: PreparedDataset, rows: np.ndarray, keep: int | None, where: Path
                   ) -> dict[str, tuple[list[str], dict[str, int]]]:
    """Per language: the caption lines of the images ``rows`` (:func:`precomp_captions`) and what the
    policy did."""
    by_image: dict[int, list] = {int(r): [] for r in rows}
    for sent in dataset.sentences:
        if sent.imgid in by_image:
            by_image[sent.imgid].append(sent)
    out = {}
    for lang in dataset.languages:
        captions = [[" ".join(s.raw.split()) for s in by_image[int(r)] if s.lang == lang] for r in rows]
        out[lang] = precomp_captions(captions, keep, str(where) + (f" ({lang})" if lang != "en" else ""))
    return out


def _write_precomp(out: Path, name: str, x: np.ndarray, rows: np.ndarray, dataset: PreparedDataset,
                   captions: dict[str, tuple[list[str], dict[str, int]]], counts: np.ndarray | None = None
                   ) -> list[Path]:
    """``{name}_ims.npy``, for a region store ``{name}_counts.npy``, ``{name}_caps.txt`` (one per
    language after the first: ``{name}_caps.{lang}.txt``) and ``{name}_ids.json`` for the images
    ``rows``; returns the files.

    ``captions``: per language, the lines of :func:`precomp_captions` (each image's in the dataset's
    order, newlines folded to spaces, the same count for every image) and what its policy did, which the
    ids file records with the count per image.
    """
    ims_name, *names, ids_name = _precomp_files(name, dataset.languages, counts is not None)
    ims = out / ims_name
    with _naming(ims), atomic_file(ims, "wb") as fh:
        _save_npy(fh, np.ascontiguousarray(x[rows], dtype=np.float32))
    written = [ims]
    if counts is not None:
        counts_file, *names = names
        with _naming(out / counts_file), atomic_file(out / counts_file, "wb") as fh:
            _save_npy(fh, np.ascontiguousarray(counts, dtype=np.int32))
        written.append(out / counts_file)
    for lang, caps_name in zip(dataset.languages, names, strict=True):
        file = out / caps_name
        with _naming(file), atomic_file(file, "w") as fh:
            fh.write("".join(f"{t}\n" for t in captions[lang][0]))
        written.append(file)
        if captions[lang][1]["repeated"] or captions[lang][1]["dropped"]:
            lines, policy = captions[lang]
            console.info(f"{file}: {len(rows)} images x {len(lines) // max(1, len(rows))} captions; "
                         f"{policy['repeated']} repeated, {policy['dropped']} dropped")
    images = [dataset.images[int(r)] for r in rows]
    ids = {"dataset": str(dataset.root), "split": images[0].split if images else None,
           "images": [{"imgid": im.imgid, "cocoid": im.cocoid, "file": _image_file(im)} for im in images],
           "captions_per_image": {lang: len(lines) // max(1, len(rows))
                                  for lang, (lines, _) in captions.items()},
           "captions_policy": {lang: policy for lang, (_, policy) in captions.items()}}
    with _naming(out / ids_name):
        write_json_atomic(out / ids_name, ids)
    written.append(out / ids_name)
    return written


def _export_butd_tsv(store: FeatureStore, dataset: PreparedDataset, rows: np.ndarray, valid: np.ndarray,
                     out: Path) -> Path:
    """One bottom-up-attention TSV (:func:`features.region_formats.butd_tsv_lines`) of the valid ``rows``
    of a region store with boxes and image sizes, read block by block; failed images are left out (an
    import records them as missing, as they are in the store). ``features import --format butd-tsv``
    reads it back to the same arrays, bit for bit."""
    from features.region_formats import butd_tsv_lines

    lacking = [name for name in REGION_ARRAYS if not store.has(name)]
    if lacking:
        raise UserError(f"{store.path}: has no {', '.join(lacking)}: a bottom-up-attention TSV needs region "
                        "features with their boxes and image sizes (features regions, or an imported TSV)")
    rows = rows[valid[rows]]
    step = 256  # images per read: a few hundred MB of 36 x 2048 float32 regions at most
    with _naming(out), atomic_file(out, "w") as fh, deferred_interrupts() as interrupts:
        for start in range(0, len(rows), step):
            part = rows[start:start + step]
            arrays = {name: np.asarray(store.array(name).oindex[part]) for name in REGION_ARRAYS}
            fh.writelines(butd_tsv_lines(dataset, part, arrays["regions"], arrays["boxes"], arrays["counts"],
                                         arrays["image_size"]))
            interrupts.check()
    return out


def _image_file(image: object) -> str:
    """``filepath/filename`` of a prepared image (``filename`` when it has no filepath)."""
    return f"{image.filepath}/{image.filename}" if image.filepath else image.filename


class _GuardedFile:
    """The file h5py writes through (its ``fileobj`` driver), made so that HDF5 never sees an I/O error.

    HDF5 cannot recover from a failed write: every object it closes afterwards fails again (printed as
    "Exception ignored"), and the process may crash at exit. So the first ``OSError`` (a full disk, a
    quota) is kept in :attr:`error` and every later call succeeds without touching the disk; the writer
    calls :meth:`check` between chunks, closes the HDF5 file (which then cannot fail) and raises it.
    """

    def __init__(self, fd: int, name: Path) -> None:
        self.fd, self.name = fd, name
        self.position = 0
        self.error: OSError | None = None

    def _failed(self, exc: OSError) -> None:
        if self.error is None:
            self.error = OSError(exc.errno, exc.strerror, str(self.name))

    def check(self) -> None:
        """Raise the first write error, naming the output file."""
        if self.error is not None:
            raise self.error

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            self.position = offset
        elif whence == os.SEEK_CUR:
            self.position += offset
        else:
            self.position = os.fstat(self.fd).st_size + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self.error is None:
            try:
                done = 0
                while done < len(view):
                    done += os.pwrite(self.fd, view[done:], self.position + done)
            except OSError as exc:
                self._failed(exc)
        self.position += len(view)
        return len(view)

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            size = max(0, os.fstat(self.fd).st_size - self.position)
        data = b""
        if self.error is None:
            try:
                data = os.pread(self.fd, size, self.position)
            except OSError as exc:
                self._failed(exc)
        self.position += len(data)
        return data

    def truncate(self, size: int | None = None) -> int:
        size = self.position if size is None else size
        if self.error is None:
            try:
                os.ftruncate(self.fd, size)
            except OSError as exc:
                self._failed(exc)
        return size

    def flush(self) -> None:
        pass


def _export_hdf5(store: FeatureStore, dataset: PreparedDataset, rows: np.ndarray, out: Path) -> Path:
    """Write the HDF5 file ``out`` atomically, block by block; Ctrl-C / SIGTERM are taken between blocks
    and a full disk ends the write, in both cases with the HDF5 file closed first and no temporary left.
    """
    import h5py

    rows = np.sort(rows)
    with deferred_interrupts() as interrupts, _naming(out), atomic_file(out, "wb") as fh:
        sink = _GuardedFile(fh.fileno(), out)

        def check() -> None:
            sink.check()
            interrupts.check()

        h5 = h5py.File(sink, "w")
        try:
            _write_hdf5(h5, store, dataset, rows, check)
        finally:
            h5.close()
        sink.check()
    return out


def _write_hdf5(h5: Any, store: FeatureStore, dataset: PreparedDataset, rows: np.ndarray,
                check: Callable[[], None]) -> None:
    """The arrays of ``store`` at ``rows`` (ascending) and the rows' ids into the open file ``h5``;
    ``check()`` runs after every block of every array."""
    import h5py

    names = [n for n in ("global", "fne/raw", "fne/ternary", *REGION_ARRAYS) if store.has(n)]
    for name in names:
        source = store.array(name)
        target = h5.create_dataset(name, shape=(len(rows), *source.shape[1:]), dtype=np.dtype(source.dtype),
                                   compression="gzip")
        at = 0
        for b in range(store.n_blocks):
            start, stop = store.block_rows(b)
            inside = rows[np.searchsorted(rows, start):np.searchsorted(rows, stop)]
            if len(inside):
                target[at:at + len(inside)] = np.asarray(source[start:stop])[inside - start]
                at += len(inside)
            check()
    for name in ("fne/mean", "fne/std"):
        if store.has(name):
            h5.create_dataset(name, data=np.asarray(store.array(name)[:]))
    h5.create_dataset("imgid", data=rows)
    h5.create_dataset("valid", data=np.asarray(store.array("valid")[:], dtype=bool)[rows])
    h5.create_dataset("split", data=np.array([dataset.images[r].split for r in rows], dtype="S5"))
    images = [dataset.images[r] for r in rows]
    h5.create_dataset("filename", data=[_image_file(im) for im in images], dtype=h5py.string_dtype())
    h5.create_dataset("cocoid", data=np.array([-1 if im.cocoid is None else im.cocoid for im in images],
                                              dtype=np.int64))
    attrs = store.attrs
    h5.attrs["provenance"] = json.dumps(attrs.get("provenance", {}))
    h5.attrs["config"] = json.dumps(attrs.get("config", {}))
    check()


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


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


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
    fmt = np.lib.format
    try:
        with open(npy, "rb") as fh:
            version = fmt.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = fmt.read_array_header_1_0(fh)
            else:
                shape, _, dtype = fmt.read_array_header_2_0(fh)
            offset = fh.tell()
        size = npy.stat().st_size
    except FileNotFoundError:
        raise UserError(f"{npy}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{npy}: is a folder, expected a .npy file") from None
    except (ValueError, SyntaxError, EOFError) as exc:
        raise UserError(f"{npy}: cannot read as .npy: {exc}") from None
    check_real_dtype(dtype, str(npy))
    needed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if size - offset < needed:
        raise UserError(f"{npy}: the header says {dtype} {tuple(shape)} ({_size(needed)}), but the file "
                        f"holds {_size(size - offset)} after it: truncated, or not a .npy file")
    return tuple(shape), dtype


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
        if names is not None and names[k] != _image_file(im):
            raise UserError(f"{h5file}: row {k} is image '{names[k]}', but imgid {i} of {data} is "
                            f"'{_image_file(im)}': the file was made for another prepared dataset")
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
    or matched by ``ids``; :func:`features.region_formats.read_scan_precomp`) or ``butd-tsv`` (``files``
    = the TSV files, matched by image id, all splits or only ``split``; :class:`ButdTsv`). Dataset rows
    (of the split, or of the whole dataset) the files lack are stored invalid and recorded as failures;
    so are rows with NaN or inf. Zero rows after each image's ``counts`` are padding (precomp files have no
    counts: an image's trailing all-zero rows are taken as padding, at least one region is kept). An existing
    imported store of the same images and shapes gains the rows (e.g. one split after another).
    """
    from features.region_formats import read_butd_tsv, read_scan_precomp
    from features.regions import REGION_DTYPES

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
        store = FeatureStore.open_or_create(
            out, np.arange(n, dtype=np.int64), outputs, block_size=block_size, config=config,
            provenance=provenance, overwrite=overwrite, dtypes=dtypes)
        valid = np.asarray(store.array("valid")[:], dtype=bool)
        valid[replaced] = False
        # One writer (this command), block by block: every chunk is written (a chunk file missing from
        # a finished block means damage, see features.verify), and memory stays one block.
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
