"""Saved inputs of ``train evaluate``: embeddings, the caption-image map and similarity matrices from
``.npy`` files of any codebase, checked with one-line errors (no pickles are ever loaded).

Every file is read from its checked header (:mod:`vsecore.containers`): the dtype and shape are checked,
and the data the header declares must fit in the file (or the archive entry), before any data is read, so
a forged header (shape ``(10**11, 1024)`` on a 1 KB file) is one line, not a MemoryError."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from train.retrieval.evaluate.ranking import Log
from vsecore.containers import (
    ContainerError,
    Member,
    NpyHeader,
    npy_header,
    npz_headers,
    open_regular,
    read_npy,
    read_npz,
)
from vsecore.errors import UserError

_ZIP_MAGIC = b"PK\x03\x04"


def _load_npy(path: Path, what: str, check: Callable[[NpyHeader], None], npz: bool = False) -> np.ndarray:
    """The array of ``path`` (``.npy``; with ``npz`` also an ``.npz`` of one array, deflated or not), read
    only after ``check`` passed its header (dtype, shape: a one-line :class:`UserError`) and the header
    declared no more data than the file holds. A missing, unreadable or special file (a FIFO, a device) is
    a one-line UserError."""
    try:
        with open_regular(path) as fh:
            is_zip = fh.read(4) == _ZIP_MAGIC
        if npz and is_zip:
            headers = npz_headers(path, compressed=True)
            if len(headers) != 1:
                raise UserError(f"{path}: expected one array in the .npz, found {sorted(headers)}")
            (name, header), = headers.items()
            check(header)
            pinned = Member(dtypes=(header.dtype.str,), shape=header.shape)
            return read_npz(path, {name: pinned}, {}, compressed=True)[name]
        header = npy_header(path)
        check(header)
        return read_npy(path, Member(dtypes=(header.dtype.str,), shape=header.shape))
    except FileNotFoundError:
        raise UserError(f"{path}: {what} file not found") from None
    except (ContainerError, OSError) as exc:
        raise UserError(f"{path}: cannot read {what} as .npy ({exc})") from None
    except MemoryError:  # a header within the file's size, but an array larger than this machine holds
        raise UserError(f"{path}: not enough memory for the {what} array its header declares") from None


def load_embedding_file(path: str | Path, what: str) -> np.ndarray:
    """A 2-D float array from ``.npy`` (or ``.npz`` with one array), as float32 (rows, d)."""
    path = Path(path)

    def check(header: NpyHeader) -> None:
        if len(header.shape) != 2 or header.dtype.kind not in "iufc":
            raise UserError(f"{path}: {what} embeddings must be a 2-D numeric array, got {header.dtype} "
                            f"{header.shape}")

    data = _load_npy(path, f"{what} embeddings", check, npz=True)
    return np.ascontiguousarray(data, dtype=np.float32)


def load_caption_image(path: str | Path, n_images: int, n_captions: int, grouped: bool = False) -> np.ndarray:
    """The (M,) image row of each caption from ``.npy`` (``train export-embeddings`` writes it as
    ``{split}_caption_image.npy``): integers, one per caption, each in ``0..N-1``, every image with at
    least one caption (any number each); with ``grouped`` (a ``--sims`` matrix), in image order.
    Anything else is a one-line :class:`UserError` naming the file."""
    path = Path(path)

    def check(header: NpyHeader) -> None:
        if len(header.shape) != 1 or header.dtype.kind not in "iu":
            raise UserError(f"{path}: expected a 1-D integer array (the image row of each caption), got "
                            f"{header.dtype} {header.shape}")
        if header.shape[0] != n_captions:
            raise UserError(f"{path}: {header.shape[0]} entries for {n_captions} captions (one per caption)")

    ci = _load_npy(path, "caption-image", check)
    if n_captions and (int(ci.min()) < 0 or int(ci.max()) >= n_images):
        bad = int(np.flatnonzero((ci < 0) | (ci >= n_images))[0])
        raise UserError(f"{path}: caption {bad} names image row {int(ci[bad])}, outside 0..{n_images - 1}")
    counts = np.bincount(ci, minlength=n_images)
    if (counts == 0).any():
        missing = np.flatnonzero(counts == 0)
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise UserError(f"{path}: image rows without any caption cannot be ranked: "
                        f"{', '.join(map(str, missing[:5]))}{more}")
    if grouped and n_captions > 1 and (np.diff(ci) < 0).any():
        raise UserError(f"{path}: the captions of a similarity matrix must be grouped by image "
                        "(all captions of image 0, then of image 1, ...)")
    return ci.astype(np.int64)


def caption_image_beside(cap_emb: str | Path) -> Path | None:
    """``{prefix}_caption_image.npy`` beside ``{prefix}_cap.npy`` (what ``export-embeddings`` writes), if
    it is there."""
    cap_emb = Path(cap_emb)
    if not cap_emb.name.endswith("_cap.npy"):
        return None
    candidate = cap_emb.with_name(cap_emb.name[: -len("_cap.npy")] + "_caption_image.npy")
    return candidate if candidate.is_file() else None


def vsepp_images(images: np.ndarray, n_captions: int, captions_per_image: int, log: Log) -> np.ndarray:
    """Image rows in the VSE++ layout: one per image, or one per caption reduced to every k-th row."""
    k = captions_per_image
    if k < 1:
        raise UserError("--captions-per-image must be at least 1")
    if images.shape[0] == n_captions and k > 1:
        repeats = images.reshape(-1, k, images.shape[1])
        same = bool((repeats == repeats[:, :1]).all())
        log(f"note: the image file has one row per caption ({n_captions}); taking every {k}th row "
            f"-> {n_captions // k} images" + ("" if same else " (the repeated rows are NOT identical)"))
        images = images[::k]
    if images.shape[0] * k != n_captions:
        raise UserError(f"{images.shape[0]} images x {k} captions per image != {n_captions} captions "
                        "(check --captions-per-image or the files)")
    return images


def load_similarity_file(path: str | Path) -> np.ndarray:
    """A precomputed (images, captions) similarity matrix from ``.npy``, memory-mapped (never read whole)."""
    path = Path(path)
    try:
        npy_header(path)  # a regular file whose header declares no more than it holds (a FIFO would block)
        sims = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{path}: similarity matrix file not found") from None
    except (ValueError, OSError) as exc:  # ContainerError is a ValueError
        raise UserError(f"{path}: cannot read a similarity matrix as .npy ({exc})") from None
    if not isinstance(sims, np.ndarray):
        raise UserError(f"{path}: expected one array in .npy format (save the matrix with np.save)")
    return sims


def sims_images(sims: np.ndarray, captions_per_image: int, transposed: bool, name: str) -> int:
    """The number of images N of an (N, k * N) matrix, or of a (k * N, N) one with ``transposed``.

    A (k * N, N) matrix given without ``transposed`` is an error that says it looks transposed.
    """
    k = captions_per_image
    if sims.ndim != 2:
        raise UserError(f"{name}: a similarity matrix must be 2-D, got shape {sims.shape}")
    rows, cols = sims.shape
    n, m = (cols, rows) if transposed else (rows, cols)
    if m == n * k:
        return n
    if not transposed and rows == cols * k:
        raise UserError(f"{name}: shape {sims.shape} is (captions, images) = ({k} x {cols}, {cols}): the "
                        "matrix is transposed; give --sims-transposed to read it as it is")
    layout = "(captions, images)" if transposed else "(images, captions)"
    raise UserError(f"{name}: shape {sims.shape} read as {layout} is not (N, {k} x N) "
                    "(check --captions-per-image and --sims-transposed)")
