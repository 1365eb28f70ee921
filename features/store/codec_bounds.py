"""Compressed chunks (zstd, Blosc) decompress into a buffer of the size their chunk must have, never more.

A zstd frame may declare any content size, or none, and a few kilobytes of run-length blocks inflate to
gigabytes: a store received from elsewhere could make a reader allocate without bound before any check
saw the rows. Every chunk of a feature store has a size known from its array's metadata (checked
against the store's record by :mod:`features.store.layout`): ``prod(chunk shape) x item size`` bytes for
a fixed-size data type. :class:`BoundedZstdCodec` replaces Zarr's ``zstd`` codec in this process
(:func:`install`, called when :mod:`features.store.array` is imported, so by every store reader): it reads the
frame's declared size first (:func:`frame_size`), refuses a frame that declares another size or none,
and decompresses into a buffer of exactly that size (libzstd stops at the buffer's end). Variable-length
chunks (the ``failures`` strings) are bounded by :data:`MAX_VARIABLE_CHUNK_BYTES`.

Blosc chunks (region stores written with ``--codec lz4``, :data:`features.store.codecs.ROW_CODECS`) carry
their sizes in a 16-byte header (:func:`blosc_sizes`): :class:`BoundedBloscCodec` replaces Zarr's
``blosc`` codec the same way, and also requires the header's compressed size to be the chunk's own
length, so that c-blosc never reads past the bytes it was given. Blosc decompresses in the calling
thread (``numcodecs.blosc.use_threads = False``): a reader's threads are the toolkit's
(:func:`features.store.rows.read_threads`), not a second pool behind a global lock.

Writers are unchanged: numcodecs and Zarr always write the content size into the frame header.
"""

from __future__ import annotations

import math

import numcodecs.blosc
import numpy as np
import zarr
from numcodecs import Zstd
from zarr.codecs import BloscCodec, ZstdCodec
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import Buffer
from zarr.registry import register_codec

#: the most bytes one chunk of a variable-length array (a block's failure records) may decompress to
MAX_VARIABLE_CHUNK_BYTES = 16 << 20

_MAGIC = b"\x28\xb5\x2f\xfd"
#: the Blosc 1.x format versions of a chunk's first byte (c-blosc writes 2)
_BLOSC_VERSIONS = (1, 2)
#: the decompressor of the direct readers (stateless: one serves every thread)
_ZSTD = Zstd()


def frame_size(data: bytes | memoryview | np.ndarray) -> int | None:
    """The content size a zstd frame's header declares (RFC 8878, 3.1.1.1), ``None`` when it has none
    (or ``data`` is not a zstd frame)."""
    head = bytes(memoryview(data)[:18])
    if len(head) < 6 or head[:4] != _MAGIC:
        return None
    descriptor = head[4]
    single_segment = (descriptor >> 5) & 1
    at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    size = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    if size == 0 or len(head) < at + size:
        return None
    value = int.from_bytes(head[at:at + size], "little")
    return value + 256 if size == 2 else value


def chunk_bytes(spec: ArraySpec) -> int | None:
    """Bytes a chunk of ``spec`` holds once decompressed, ``None`` for a variable-length data type."""
    item = getattr(spec.dtype, "item_size", None)
    if not isinstance(item, int):
        return None
    return math.prod(spec.shape) * item


def check_frame(declared: int | None, expected: int | None, what: str = "the zstd frame") -> int:
    """The size to decompress a frame into: ``expected`` (fixed-size chunks), else the declared size
    up to :data:`MAX_VARIABLE_CHUNK_BYTES`. A ValueError (a damaged chunk) for a frame that declares no
    size, another size, or too many bytes (``what`` names the frame, or the Blosc header, in it)."""
    if declared is None:
        raise ValueError(f"{what} declares no content size (the toolkit's writers always do)")
    if expected is not None and declared != expected:
        raise ValueError(f"{what} declares {declared} bytes, but the chunk holds {expected}")
    if expected is None and declared > MAX_VARIABLE_CHUNK_BYTES:
        raise ValueError(f"{what} declares {declared} bytes, over the {MAX_VARIABLE_CHUNK_BYTES} "
                         "a variable-length chunk may hold")
    return declared


def zstd_decode_into(data: bytes | memoryview | np.ndarray, out: np.ndarray) -> None:
    """Decompress the zstd frame ``data`` into ``out`` (a contiguous fixed-size array, filled whole): the
    frame must declare exactly ``out``'s bytes (:func:`check_frame`), and libzstd never writes past it. A
    ValueError (or zstd's RuntimeError) for a damaged chunk."""
    target = out.reshape(-1).view(np.uint8)
    check_frame(frame_size(data), target.size)
    _ZSTD.decode(data, out=target)


def blosc_sizes(data: bytes | memoryview | np.ndarray) -> tuple[int, int] | None:
    """``(uncompressed bytes, compressed bytes)`` a Blosc (1.x) chunk's header declares, ``None`` when
    ``data`` is too short to hold one or names a format version this reader does not know."""
    head = bytes(memoryview(data).cast("B")[:16])
    if len(head) < 16 or head[0] not in _BLOSC_VERSIONS:
        return None
    return int.from_bytes(head[4:8], "little"), int.from_bytes(head[12:16], "little")


def check_blosc(data: bytes | memoryview | np.ndarray, expected: int | None) -> int:
    """The size to decompress the Blosc chunk ``data`` into (as :func:`check_frame` for zstd): its header
    must declare ``expected`` bytes (else at most :data:`MAX_VARIABLE_CHUNK_BYTES`) and its compressed
    size must be ``len(data)``. A ValueError (a damaged chunk) otherwise."""
    sizes = blosc_sizes(data)
    if sizes is None:
        raise ValueError("not a Blosc chunk (no 16-byte header of a known version)")
    declared, compressed = sizes
    if compressed != memoryview(data).nbytes:
        raise ValueError(f"the Blosc header declares {compressed} compressed bytes, but the chunk has "
                         f"{memoryview(data).nbytes}")
    return check_frame(declared, expected, "the Blosc header")


def blosc_decode_into(data: bytes | memoryview | np.ndarray, out: np.ndarray) -> None:
    """Decompress the Blosc chunk ``data`` into ``out`` (contiguous, fixed size, filled whole), after
    :func:`check_blosc`. A ValueError (or Blosc's RuntimeError) for a damaged chunk."""
    target = out.reshape(-1).view(np.uint8)
    check_blosc(data, target.size)
    numcodecs.blosc.decompress(data, target)


#: the direct readers' decompressors by Zarr codec (:class:`features.store.rows.ShardRows`)
DECODERS = {ZstdCodec: zstd_decode_into, BloscCodec: blosc_decode_into}


class BoundedZstdCodec(ZstdCodec):
    """Zarr's ``zstd`` codec, decompressing into a buffer of the chunk's own size (module docstring)."""

    def _decode_sync(self, chunk_bytes_in: Buffer, chunk_spec: ArraySpec) -> Buffer:
        data = chunk_bytes_in.as_numpy_array().view(np.uint8).reshape(-1)
        size = check_frame(frame_size(data), chunk_bytes(chunk_spec))
        out = np.empty(size, dtype=np.uint8)
        self._zstd_codec.decode(data, out=out)  # libzstd refuses to write past the buffer
        return chunk_spec.prototype.buffer.from_array_like(out)


class BoundedBloscCodec(BloscCodec):
    """Zarr's ``blosc`` codec, decompressing into a buffer of the chunk's own size (module docstring)."""

    def _decode_sync(self, chunk_bytes_in: Buffer, chunk_spec: ArraySpec) -> Buffer:
        data = chunk_bytes_in.as_numpy_array().view(np.uint8).reshape(-1)
        out = np.empty(check_blosc(data, chunk_bytes(chunk_spec)), dtype=np.uint8)
        numcodecs.blosc.decompress(data, out)
        return chunk_spec.prototype.buffer.from_array_like(out)


def install() -> None:
    """Make :class:`BoundedZstdCodec` and :class:`BoundedBloscCodec` the ``zstd`` and ``blosc`` codecs of
    every Zarr array this process opens; Blosc runs in its caller's thread."""
    register_codec("zstd", BoundedZstdCodec)
    register_codec("blosc", BoundedBloscCodec)
    zarr.config.set({"codecs.zstd": f"{__name__}.BoundedZstdCodec",
                     "codecs.blosc": f"{__name__}.BoundedBloscCodec"})
    numcodecs.blosc.use_threads = False
