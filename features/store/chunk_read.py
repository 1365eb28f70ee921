"""A whole feature array read straight from its chunk files, each chunk decompressed into its place.

``np.asarray(array[:])`` through Zarr decodes every chunk into a buffer of its own, copies it into the
result and waits on Zarr's asynchronous pipeline: reading Karpathy COCO's VGG19 ``global`` array (123,287 x
4,096 float32, 482 chunks of 4 MB) took 5.5 s of a 12 s run load on the 2-core machine. This reads each
chunk file with one ``read`` and decompresses it with zstd straight into the rows it holds (a chunk as wide
as the array is a contiguous block of the result; a narrower one, FNE's, goes through one chunk-sized
buffer), a few chunks at a time in threads (libzstd releases the GIL): 2.2 s for the same array.

It handles exactly the layout the store's writer makes for arrays with one chunk per block
(:func:`features.store.layout.row_layout`, checked when the store was opened): a regular chunk grid, codecs
``bytes`` (little-endian) + ``zstd``, a fixed-size data type; :func:`matches` says whether an array has it,
and :func:`read_whole` returns ``None`` for any other, which Zarr then reads. A chunk file that is absent is
the fill value, as Zarr reads it, except in an array whose every chunk is on disk
(:attr:`features.store.array.StoreArray.every_chunk`): there it is damage, as is a folder in a chunk's place,
and the caller names it. Every chunk is bounded as the Zarr reader bounds it
(:mod:`features.store.codec_bounds`): the file may hold at most zstd's worst case for the chunk's bytes, and
the frame must declare exactly the chunk's size, so the bytes are the ones Zarr would decode, into the same
bits.
"""

from __future__ import annotations

import itertools
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from zarr.codecs import BytesCodec, ZstdCodec
from zarr.codecs.bytes import Endian
from zarr.core.chunk_grids import RegularChunkGrid

from features.store.array import StoreArray
from features.store.codec_bounds import zstd_decode_into

#: chunks decompressed at once (threads); more do not help a 2-core machine, and 4 keep a larger one busy
READ_THREADS = 4


def matches(array: StoreArray) -> bool:
    """Whether ``array`` has exactly the layout :func:`read_whole` decodes (module docstring)."""
    meta = array.zarr.metadata
    codecs = list(getattr(meta, "codecs", ()))
    try:
        dtype = np.dtype(array.zarr.dtype)
    except TypeError:
        return False
    return (getattr(meta, "zarr_format", None) == 3 and isinstance(meta.chunk_grid, RegularChunkGrid)
            and len(codecs) == 2 and isinstance(codecs[0], BytesCodec) and isinstance(codecs[1], ZstdCodec)
            and codecs[0].endian in (Endian.little, None) and dtype.kind in "biuf" and not dtype.hasobject)


def compress_bound(nbytes: int) -> int:
    """The most bytes zstd may need for ``nbytes`` of content (libzstd's ``ZSTD_COMPRESSBOUND``), plus its
    largest frame header and checksum: a chunk file larger than this is not one chunk."""
    margin = ((128 << 10) - nbytes >> 11) if nbytes < (128 << 10) else 0
    return nbytes + (nbytes >> 8) + margin + 32


def read_whole(array: StoreArray, threads: int = READ_THREADS) -> np.ndarray | None:
    """The whole of ``array`` ``(N, ...)`` in its stored dtype (the bits Zarr reads), or ``None`` when its
    layout is not the writer's (:func:`matches`). A chunk that cannot be decoded raises (``ValueError``,
    ``OSError``, zstd's ``RuntimeError``); the caller names it (:meth:`StoreArray._damage`)."""
    if not matches(array):
        return None
    shape = tuple(int(v) for v in array.zarr.shape)
    chunks = tuple(int(v) for v in array.zarr.metadata.chunk_grid.chunk_shape)
    dtype = np.dtype(array.zarr.dtype).newbyteorder("<")
    out = np.empty(shape, dtype=dtype)
    if out.size == 0:
        return out
    folder = array.store.path / array.zarr.path
    fill = array.zarr.fill_value
    chunk_nbytes = math.prod(chunks) * dtype.itemsize
    grid = [range(math.ceil(n / c)) for n, c in zip(shape, chunks, strict=True)]
    whole_rows = chunks[1:] == shape[1:]  # a chunk spans every column: its rows are one block of ``out``

    def one(coords: tuple[int, ...]) -> None:
        region = tuple(slice(i * c, min((i + 1) * c, n))
                       for i, c, n in zip(coords, chunks, shape, strict=True))
        dest = out[region]
        try:
            with open(folder / array.chunk_key(coords), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > compress_bound(chunk_nbytes):
                    raise ValueError(f"the chunk file holds {size} bytes, more than a zstd frame of "
                                     f"{chunk_nbytes} bytes can")
                data = f.read(size + 1)
        except FileNotFoundError:
            if array.every_chunk:  # a finished block's chunk was written: its absence is damage
                raise
            dest[...] = fill  # an absent chunk is the fill value, as Zarr reads it
            return
        if whole_rows and dest.shape == chunks:  # a full chunk: straight into the result
            zstd_decode_into(data, dest)
            return
        buffer = np.empty(chunks, dtype=dtype)
        zstd_decode_into(data, buffer)
        dest[...] = buffer[tuple(slice(0, s) for s in dest.shape)]

    all_chunks = list(itertools.product(*grid))
    if threads <= 1 or len(all_chunks) == 1:
        for coords in all_chunks:
            one(coords)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for _ in pool.map(one, all_chunks):  # the first chunk that fails raises here
                pass
    return out
