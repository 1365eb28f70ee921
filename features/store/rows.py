"""Rows of a feature store read on demand, for features too large to hold in memory.

:func:`features.store.read.read_matrix` reads a whole array; Karpathy COCO's grid regions (123,287 x 49 x 1280
float16, 15.5 GB) do not fit a training machine's memory that way. :func:`open_rows` opens the same
array with the same checks (the store matches the dataset, is complete, not being written, its rows
agree with their records) and returns a :class:`StoreRows`, which reads the rows a batch asks for and
nothing else. Each read

- refuses a valid row that is not finite, as ``read_matrix`` does for the whole array up front (here when
  the row is read: every row that reaches a model is checked);
- checks afterwards that the store's ``generation`` token is the one seen when it was opened, so a
  rewrite (``--rethreshold``, a re-extraction) that overlaps training is a one-line error, never a batch
  of mixed rows;
- names a damaged chunk in one line (:class:`features.store.array.StoreArray`).

Region stores are written one shard per block with one inner chunk per row
(:data:`features.store.layout.SHARD_ROW_BYTES`), so a random row costs one small read; a store with one chunk
per block (written before that, or small rows) is read a whole chunk per touched block, correct but slow.
The object pickles (by path), so a ``DataLoader``'s worker processes reopen the store themselves.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import google_crc32c
import numpy as np
from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
from zarr.codecs.bytes import Endian
from zarr.codecs.sharding import ShardingCodecIndexLocation

from features.store.array import StoreArray
from features.store.codec_bounds import DECODERS
from features.store.core import FeatureStore, StoreState
from features.store.read import _open_for_reading, check_row_records, consistent_read, first_nonfinite_row
from prep.dataset import PreparedDataset
from vsecore.errors import UserError

#: an empty inner chunk's index entry (offset and size both 2**64 - 1): the row is the fill value
_EMPTY = np.uint64(2**64 - 1)
#: the one row of a row checked alone is valid
_ONE = np.ones(1, dtype=bool)


class ShardRows:
    """Rows of a sharded row array (one inner chunk per row) read straight from its shard files.

    Zarr reads each inner chunk through its asynchronous pipeline and re-reads the shard's index on
    every call: about 2 ms per row, so a batch of 128 random region rows took 0.3 to 0.9 s. This reads
    each shard's index once (verified against its CRC-32C), then each row with one ``pread`` of its
    compressed bytes, decompressed straight into the batch. It handles exactly the layout the
    writer makes (:func:`features.store.layout.row_layout`, checked when the store was opened): a
    ``sharding_indexed`` codec, its index at the end (``bytes`` little-endian + ``crc32c``), inner chunks
    ``bytes`` little-endian + ``zstd`` or ``blosc`` (``--codec lz4``); :meth:`matches` says whether an array
    has it. The bytes are the ones Zarr would decode, so the rows are the same bits. A shard file that is
    missing or not a regular file (a folder in its place) raises here, and :class:`StoreRows` names it as
    the damaged chunk it is (the store is finished: every shard was written), where Zarr would have read
    NaN rows.
    """

    def __init__(self, array: StoreArray) -> None:
        self.folder = array.store.path / array.zarr.path
        self.array = array
        self.rows_per_shard = int(array.zarr.shards[0])
        self.row_shape = tuple(int(v) for v in array.zarr.shape[1:])
        self.dtype = np.dtype(array.zarr.dtype).newbyteorder("<")
        self.fill = array.zarr.fill_value
        #: the inner chunks' decompressor (:data:`features.store.codec_bounds.DECODERS`)
        self.decode = _decoder(array)
        self._index: dict[int, np.ndarray] = {}
        self._paths: dict[int, str] = {}

    @staticmethod
    def matches(array: StoreArray) -> bool:
        """Whether ``array`` has exactly the sharded layout this reader decodes."""
        codecs = array.zarr.metadata.codecs
        if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
            return False
        shard = codecs[0]
        inner, index = list(shard.codecs), list(shard.index_codecs)
        return (shard.index_location == ShardingCodecIndexLocation.end
                and tuple(shard.chunk_shape) == (1, *array.zarr.shape[1:])
                and len(inner) == 2 and isinstance(inner[0], BytesCodec)
                and _decoder(array) is not None
                and inner[0].endian in (Endian.little, None)
                and len(index) == 2 and isinstance(index[0], BytesCodec) and isinstance(index[1], Crc32cCodec)
                and index[0].endian in (Endian.little, None))

    def _file(self, shard: int) -> str:
        if shard not in self._paths:
            key = self.array.chunk_key((shard, *[0] * len(self.row_shape)))
            self._paths[shard] = str(self.folder / str(key))
        return self._paths[shard]

    def _shard_index(self, shard: int, fd: int) -> np.ndarray:
        """``(rows_per_shard, 2)`` uint64 offsets and sizes of a shard's inner chunks, CRC-checked."""
        if shard not in self._index:
            size = self.rows_per_shard * 16 + 4
            end = os.fstat(fd).st_size
            raw = os.pread(fd, size, end - size) if end >= size else b""
            if len(raw) != size or google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
                raise ValueError("the shard's index is truncated or does not match its checksum")
            self._index[shard] = np.frombuffer(raw[:-4], dtype="<u8").reshape(-1, 2)
        return self._index[shard]

    def read(self, unique: np.ndarray, out: np.ndarray, slots: np.ndarray | None = None) -> np.ndarray:
        """Rows ``unique`` ``(U,)`` (sorted, distinct) into ``out[slots]`` (``slots`` ``(U,)``, default
        ``0..U-1``; ``out`` ``(B, *row_shape)``) -> ``(U,)`` bool, whether each row holds a NaN or an inf.

        The shards are split among :func:`read_threads` threads, the calling one included; each thread
        opens its shards, reads their indexes, then each row with one ``pread`` decompressed straight into
        its slot and checked while it is in cache (zstd, ``pread`` and numpy's loops release the
        interpreter lock). Each row has its own slot, so the bits do not depend on the threads. Every
        thread has stopped when this returns or raises (the first error, after the others finished)."""
        slots = np.arange(len(unique)) if slots is None else slots
        nonfinite = np.zeros(len(unique), dtype=bool)
        if not len(unique):
            return nonfinite
        shards = unique // self.rows_per_shard
        groups = np.split(np.arange(len(unique)), np.flatnonzero(shards[1:] != shards[:-1]) + 1)
        threads = read_threads()
        work = [[groups[g] for g in part.tolist()]
                for part in np.array_split(np.arange(len(groups)), min(len(groups), threads))]
        futures = [_pool(threads).submit(self._read_shards, part, unique, slots, out, nonfinite)
                   for part in work[1:]]
        try:
            self._read_shards(work[0], unique, slots, out, nonfinite)
        finally:
            wait(futures)
        for future in futures:
            future.result()  # the first error, once every part has stopped writing into out
        return nonfinite

    def _read_shards(self, groups: list[np.ndarray], unique: np.ndarray, slots: np.ndarray, out: np.ndarray,
                     nonfinite: np.ndarray) -> None:
        """Each group (positions in ``unique`` of one shard's rows): its rows into ``out[slots]``, and
        whether each is not finite into ``nonfinite``."""
        for group in groups:
            shard = int(unique[group[0]]) // self.rows_per_shard
            fd = os.open(self._file(shard), os.O_RDONLY)
            try:
                index = self._shard_index(shard, fd)
                for j in group.tolist():
                    row = out[slots[j]]
                    offset, nbytes = index[int(unique[j]) - shard * self.rows_per_shard]
                    if offset == _EMPTY and nbytes == _EMPTY:
                        row[...] = self.fill
                    else:
                        data = os.pread(fd, int(nbytes), int(offset))
                        if len(data) != nbytes:
                            raise ValueError("an inner chunk is truncated")
                        self.decode(data, row)  # one row, its size checked, straight into the batch
                    nonfinite[j] = first_nonfinite_row(row.reshape(1, -1), _ONE) is not None
            finally:
                os.close(fd)


def _decoder(array: StoreArray) -> Any:
    """The decompressor (:data:`DECODERS`) of a sharded array's inner chunks, None for another compressor."""
    codecs = array.zarr.metadata.codecs
    inner = list(codecs[0].codecs) if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec) else []
    compressor = inner[1] if len(inner) == 2 else None
    return next((decode for kind, decode in DECODERS.items() if isinstance(compressor, kind)), None)


def read_threads() -> int:
    """Threads that read and decompress a batch's rows: ``VSE_READ_THREADS``, else the CPUs this process
    may use, at most 4 (1: in the calling thread)."""
    value = os.environ.get("VSE_READ_THREADS")
    if value is not None:
        try:
            threads = int(value)
        except ValueError:
            raise UserError(f"VSE_READ_THREADS={value!r}: expected a whole number of threads") from None
        if threads < 1:
            raise UserError(f"VSE_READ_THREADS={value!r}: expected at least 1")
        return threads
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(4, cpus))


#: this process's reading threads: (pid, threads, pool); a forked DataLoader worker makes its own
_POOL: tuple[int, int, ThreadPoolExecutor] | None = None


def _pool(threads: int) -> ThreadPoolExecutor:
    """This process's reading pool of ``threads`` threads."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid() or _POOL[1] != threads:
        _POOL = (os.getpid(), threads, ThreadPoolExecutor(threads, thread_name_prefix="vse-rows"))
    return _POOL[2]


class StoreRows:
    """One row array of a finished store, read a few rows at a time; indexes like a numpy array.

    Args:
        store: the open store; name: its array (``global``, ``fne/ternary``, ``regions``, ...).
        valid: ``(N,)`` bool, the store's ``valid`` column (read and checked by :func:`open_rows`).
        state: the store's state when it was opened; every read checks the store still has it.
    """

    def __init__(self, store: FeatureStore, name: str, valid: np.ndarray, state: StoreState) -> None:
        self.path, self.name = store.path, name
        self.valid = np.asarray(valid, dtype=bool)
        self.state = state
        self._store: FeatureStore | None = store
        #: the array's identity when opened: every read checks it still has it (a worker that reopens
        #: the store compares with this one too)
        self._identity = store.array_identity(name)
        self._array: StoreArray | None = store.array(name)
        self.shape: tuple[int, ...] = tuple(int(v) for v in self._array.shape)
        self.dtype = np.dtype(self._array.dtype)
        per_file = self._array.zarr.chunks[0]
        #: one inner chunk per row (a sharded region array): read runs of rows as slices
        self.row_chunks = int(per_file) == 1
        #: read the shard files directly (:class:`ShardRows`) where the layout is the writer's
        self.direct = self.row_chunks and ShardRows.matches(self._array)
        self._shards: ShardRows | None = None

    # the open Zarr handles stay behind when pickled (DataLoader workers reopen the store)
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_store", "_array", "_shards")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _store=None, _array=None, _shards=None)

    def _open(self) -> tuple[FeatureStore, StoreArray]:
        if self._store is None or self._array is None:
            self._store = FeatureStore(self.path)
            self._array = self._store.array(self.name)
        return self._store, self._array

    @property
    def ndim(self) -> int:
        """Number of dimensions (2 for ``(N, C)``, 3 for ``(N, k, D)``)."""
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole array in its stored dtype (none of them held)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: int | slice | np.ndarray) -> np.ndarray:
        """Rows ``index`` (an int, a slice or an integer array) in the stored dtype: ``(B, *row_shape)``."""
        if isinstance(index, (int, np.integer)):
            return self.take(np.array([int(index)]))[0]
        if isinstance(index, slice):
            return self.take(np.arange(*index.indices(self.shape[0])))
        return self.take(np.asarray(index))

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` ``(B,)`` (any order, repeats allowed) -> ``(B, *row_shape)`` in the stored dtype.

        Each distinct row is read once; a valid row that is not finite, a damaged chunk or a store
        rewritten since it was opened is a one-line :class:`UserError`.
        """
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise IndexError(f"rows {rows.min()}..{rows.max()} outside 0..{self.shape[0] - 1}")
        unique, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
        store, array = self._open()
        with consistent_read(store):
            out, nonfinite = self._read(array, unique, first, inverse.reshape(-1))
            store.check_unchanged(self.state)
            store.check_array_unchanged(self.name, self._identity)
        bad = np.flatnonzero(nonfinite & self.valid[unique])
        if len(bad):
            row = int(unique[bad[0]])
            raise UserError(f"{self.path}: row {row} (imgid {row}) of '{self.name}' is marked valid but is "
                            f"not finite (NaN or inf); run `features verify {self.path} --repair`, then the "
                            "store's `features` command to recompute it")
        return out

    def _read(self, array: StoreArray, unique: np.ndarray, first: np.ndarray, inverse: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``unique[inverse]`` ``(B, *row_shape)`` of sorted distinct ``unique`` ``(U,)`` (``first``: the
        position of each one's first use), and ``(U,)`` bool: each distinct row holds a NaN or an inf.

        Shard files in the writer's layout are read directly, each row into its first slot
        (:class:`ShardRows`; repeats copied after); else runs of consecutive rows as slices (one inner
        chunk per row), or one orthogonal selection (each touched chunk decoded once)."""
        if self.direct and len(unique):
            if self._shards is None or self._shards.array is not array:
                self._shards = ShardRows(array)
            out = np.empty((len(inverse), *self.shape[1:]), dtype=self.dtype)
            try:
                nonfinite = self._shards.read(unique, out, first)
            except Exception as exc:  # noqa: BLE001 - zstd, the index, the file (missing, a folder): name it
                raise array._damage((unique,), exc) from None
            repeats = np.flatnonzero(first[inverse] != np.arange(len(inverse)))
            out[repeats] = out[first[inverse[repeats]]]
            return out, nonfinite
        rows = self._read_unique(array, unique)
        nonfinite = np.zeros(len(unique), dtype=bool)
        bad = first_nonfinite_row(rows, self.valid[unique])
        if bad is not None:
            nonfinite[bad] = True
        return rows[inverse], nonfinite

    def _read_unique(self, array: StoreArray, unique: np.ndarray) -> np.ndarray:
        """Sorted distinct rows ``(U, *row_shape)`` through Zarr."""
        if not len(unique):
            return np.zeros((0, *self.shape[1:]), dtype=self.dtype)
        if not self.row_chunks:
            return np.asarray(array.oindex[(unique,)])  # damaged or missing chunks named (StoreArray)
        out = np.empty((len(unique), *self.shape[1:]), dtype=self.dtype)
        breaks = np.flatnonzero(np.diff(unique) != 1) + 1
        starts = np.concatenate([[0], breaks])
        stops = np.concatenate([breaks, [len(unique)]])
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            out[a:b] = array[int(unique[a]):int(unique[b - 1]) + 1]
        return out


def open_rows(spec: str, dataset: PreparedDataset | str | os.PathLike | None = None) -> tuple[StoreRows,
                                                                                           np.ndarray]:
    """``(rows read on demand (N, *row_shape), valid (N,) bool)`` of ``STORE[:key]`` (as for
    :func:`features.store.read.read_matrix`, the int8 FNE's ``fne`` key included), after the same checks:
    ``dataset`` matches, the store is complete and not being written, ``valid`` agrees with the
    recorded failures and ``imgid`` is the row number."""
    store, _, name = _open_for_reading(spec, dataset)
    with consistent_read(store):
        valid = np.asarray(store.array("valid")[:], dtype=bool)
        check_row_records(store, valid)
        rows = StoreRows(store, name, valid, store.opened_state)
    return rows, valid


def stored_bytes(spec: str) -> int:
    """Bytes of the array ``STORE[:key]`` names, in its stored dtype, from the metadata alone."""
    from features.store.read import parse_spec
    from features.store.spec import SPEC_ARRAYS

    path, key = parse_spec(spec)
    store = FeatureStore(path)
    if key is None:
        key = next((k for k in ("global", "fne", "regions") if store.has(SPEC_ARRAYS[k])), "global")
    if not store.has(SPEC_ARRAYS[key]):
        return 0  # the reader names the missing array
    array = store.array(SPEC_ARRAYS[key])
    return int(np.prod(array.shape, dtype=np.int64)) * np.dtype(array.dtype).itemsize
