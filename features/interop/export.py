"""``features export``: a finished store for other codebases.

VSE++/SCAN precomp (``data.py``): one ``{name}_ims.npy`` per split, one row per image in the split's image
order, float32; the validation split is called ``dev``; a row is a vector ``(C,)`` (VSE++) or SCAN's
regions ``(k, D)`` (with ``{name}_counts.npy``); ``{name}_caps.txt`` the captions one per line grouped by
image in the same order (the same count for every image: see :func:`precomp_captions`);
``{name}_ids.json`` every row's image (prepared imgid, COCO id, file). A test split of 5,000 images
(COCO's Karpathy 5k) is written as SCAN ships it: ``testall_*`` all 5,000 images, ``test_*`` the first
1,000. Also one HDF5 file (h5py) and, for region stores, one bottom-up-attention TSV.
"""


from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from features.store.core import FeatureStore
from features.store.read import REGION_ARRAYS, parse_spec, read_matrix, stored_region_counts
from prep.dataset import SPLITS, PreparedDataset
from vsecore import console
from vsecore.errors import UserError
from vsecore.io import atomic_file, deferred_interrupts, write_json_atomic
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


def _save_npy(fh: Any, array: np.ndarray, check: Callable[[], None] = lambda: None) -> None:
    """``np.save`` of a C-contiguous array into the open file ``fh``, written by ``fh.write`` in pieces:
    ``np.save`` goes through ``ndarray.tofile``, whose short write on a full disk is an ``OSError``
    without an errno (so no one-line message could say what happened). ``check`` runs before each piece
    (where a held-back Ctrl-C or SIGTERM is raised, :func:`vsecore.io.deferred_interrupts`)."""
    np.lib.format.write_array_header_1_0(fh, np.lib.format.header_data_from_array_1_0(array))
    data = memoryview(array).cast("B")
    for start in range(0, len(data), _NPY_WRITE_BYTES):
        check()
        fh.write(data[start:start + _NPY_WRITE_BYTES])


def export_store(spec: str, data: str | os.PathLike, fmt: str, out: str | os.PathLike,
                 splits: Sequence[str] | None = None, allow_invalid: bool = False,
                 overwrite: bool = False, captions_per_image: int | None = None) -> list[Path]:
    """Write a finished store as precomp ``.npy`` files (``fmt="precomp"``) or one HDF5 file.

    The output is checked first with :mod:`vsecore.outputs` (never the store, the prepared dataset or
    anything inside them or inside another toolkit artifact; an existing file of the same name only
    with ``overwrite``). Rows of failed images are refused (they would be NaN in another codebase)
    unless ``allow_invalid``; so is a store made for another prepared dataset than ``data``
    (:func:`features.store.core.check_store_matches`). Every file is written atomically
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
    return _export_precomp(store, dataset, x, rows, out, regions, captions_per_image)


def _export_precomp(store: FeatureStore, dataset: PreparedDataset, x: np.ndarray, rows: dict[str, np.ndarray],
                    out: Path, regions: bool, captions_per_image: int | None) -> list[Path]:
    """The precomp files of every part of ``rows`` (:func:`_precomp_parts`) into ``out``; returns them."""
    path = store.path
    counts = stored_region_counts(store) if regions else None
    if counts is not None and len(np.unique(counts)) > 1:
        console.warning(f"{path}: regions per image vary ({int(counts.min())} to {int(counts.max())}): the "
                        "precomp rows are zero-padded to the largest; {split}_counts.npy says how many are "
                        "real (a loader without a mask would treat the padding as regions)")
    # every part's captions are checked (and the policy applied) before anything is written
    parts = [(name, part, _part_captions(dataset, part, captions_per_image, out / f"{name}_caps.txt"))
             for name, part in _precomp_parts(rows)]
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    # Ctrl-C and SIGTERM are held back and raised only inside a file's write (interrupts.check), never
    # between a temporary file's creation and the code that removes it on an exception: an interruption
    # leaves no .NAME.HOST-PID.XXXX.tmp (those of a killed export are removed by the next one)
    with deferred_interrupts() as interrupts:
        for name, part, captions in parts:
            written += _write_precomp(out, name, x, part, dataset, captions,
                                      None if counts is None else counts[part], interrupts.check)
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
                   captions: dict[str, tuple[list[str], dict[str, int]]], counts: np.ndarray | None = None,
                   check: Callable[[], None] = lambda: None) -> list[Path]:
    """``{name}_ims.npy``, for a region store ``{name}_counts.npy``, ``{name}_caps.txt`` (one per
    language after the first: ``{name}_caps.{lang}.txt``) and ``{name}_ids.json`` for the images
    ``rows``; returns the files.

    ``captions``: per language, the lines of :func:`precomp_captions` (each image's in the dataset's
    order, newlines folded to spaces, the same count for every image) and what its policy did, which the
    ids file records with the count per image. ``check``: raises a held-back interruption; it runs
    inside each file's write, where the temporary file is removed on the way out.
    """
    ims_name, *names, ids_name = _precomp_files(name, dataset.languages, counts is not None)
    ims = out / ims_name
    rows_x = np.ascontiguousarray(x[rows], dtype=np.float32)
    with _naming(ims), atomic_file(ims, "wb") as fh:
        _save_npy(fh, rows_x, check)
    del rows_x
    written = [ims]
    if counts is not None:
        counts_file, *names = names
        with _naming(out / counts_file), atomic_file(out / counts_file, "wb") as fh:
            _save_npy(fh, np.ascontiguousarray(counts, dtype=np.int32), check)
        written.append(out / counts_file)
    for lang, caps_name in zip(dataset.languages, names, strict=True):
        file = out / caps_name
        with _naming(file), atomic_file(file, "w") as fh:
            check()
            fh.write("".join(f"{t}\n" for t in captions[lang][0]))
        written.append(file)
        if captions[lang][1]["repeated"] or captions[lang][1]["dropped"]:
            lines, policy = captions[lang]
            console.info(f"{file}: {len(rows)} images x {len(lines) // max(1, len(rows))} captions; "
                         f"{policy['repeated']} repeated, {policy['dropped']} dropped")
    images = [dataset.images[int(r)] for r in rows]
    ids = {"dataset": str(dataset.root), "split": images[0].split if images else None,
           "images": [{"imgid": im.imgid, "cocoid": im.cocoid, "file": image_file(im)} for im in images],
           "captions_per_image": {lang: len(lines) // max(1, len(rows))
                                  for lang, (lines, _) in captions.items()},
           "captions_policy": {lang: policy for lang, (_, policy) in captions.items()}}
    with _naming(out / ids_name):
        write_json_atomic(out / ids_name, ids)
    written.append(out / ids_name)
    return written


def _export_butd_tsv(store: FeatureStore, dataset: PreparedDataset, rows: np.ndarray, valid: np.ndarray,
                     out: Path) -> Path:
    """One bottom-up-attention TSV (:func:`features.interop.region_formats.butd_tsv_lines`) of the valid
    ``rows`` of a region store with boxes and image sizes, read block by block; failed images are left out (an
    import records them as missing, as they are in the store). ``features import --format butd-tsv``
    reads it back to the same arrays, bit for bit."""
    from features.interop.region_formats import butd_tsv_lines

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


def image_file(image: object) -> str:
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
    h5.create_dataset("filename", data=[image_file(im) for im in images], dtype=h5py.string_dtype())
    h5.create_dataset("cocoid", data=np.array([-1 if im.cocoid is None else im.cocoid for im in images],
                                              dtype=np.int64))
    attrs = store.attrs
    h5.attrs["provenance"] = json.dumps(attrs.get("provenance", {}))
    h5.attrs["config"] = json.dumps(attrs.get("config", {}))
    check()
