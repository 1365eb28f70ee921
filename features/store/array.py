"""One array of a feature store: reads like the Zarr array, and a damaged chunk is a one-line error naming
the store, the array, the rows and the chunk file (:class:`StoreArray`)."""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import zarr

from features.store import codec_bounds
from features.store.layout import rows_per_file
from vsecore.errors import UserError

codec_bounds.install()  # every zstd or Blosc chunk a store reader decompresses is bounded by its chunk's size


class HasPath(Protocol):
    """The store an array belongs to (:class:`features.store.core.FeatureStore`): its folder names the
    files."""

    path: Path


class StoreArray:
    """One array of a store: reads and writes like the Zarr array, but a damaged chunk is a UserError.

    Zarr and its codecs raise assorted exceptions for a truncated or corrupt chunk file; a read that
    fails is retried chunk by chunk to name the first bad chunk, and becomes one line naming the
    store, the array, the rows and the chunk file, with the repair command. ``shape``, ``chunks``,
    ``dtype``, ``attrs`` ... are the Zarr array's.

    ``every_chunk``: every chunk file of the array is on disk (a finished store whose writer writes every
    chunk, :meth:`features.store.core.FeatureStore.array`). Zarr reads a missing chunk file, or a folder in
    its place, as the fill value (NaN rows); for such an array that is damage, named like any other
    (:func:`chunk_file_problem`), after each read and by every direct reader.
    """

    def __init__(self, store: HasPath, name: str, array: zarr.Array, every_chunk: bool = False) -> None:
        self.store, self.name, self.zarr = store, name, array
        self.every_chunk = every_chunk

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.zarr, attr)

    def __getitem__(self, key: Any) -> Any:
        return self._read(lambda: self.zarr[key], key)

    @property
    def oindex(self) -> OrthogonalRows:
        """Zarr's orthogonal selection (``array.oindex[rows]``), read and checked as ``array[...]`` is."""
        return OrthogonalRows(self)

    def _read(self, fetch: Callable[[], Any], key: Any) -> Any:
        """``fetch()``, the read of selection ``key``; a damaged chunk (or, where :attr:`every_chunk`, a
        missing one) is a one-line UserError."""
        try:
            values = fetch()
        except Exception as exc:  # noqa: BLE001 - codecs raise RuntimeError, ValueError, ...
            raise self._damage(key, exc) from None
        if self.every_chunk:
            self.check_chunk_files(self._file_rows(key))
        return values

    def __setitem__(self, key: Any, value: Any) -> None:
        self.zarr[key] = value

    def chunk_key(self, chunk: tuple[int, ...]) -> str:
        """The path of chunk ``chunk`` (grid coordinates) relative to the array, e.g. ``c/3/0``."""
        return str(self.zarr.metadata.encode_chunk_key(chunk))

    def _file_rows(self, key: Any) -> Iterable[int]:
        """The row coordinates of the chunk files (shards of a sharded array) a selection ``key`` reads
        (all of them when it cannot say)."""
        first = key[0] if isinstance(key, tuple) and key else key
        rows, n = rows_per_file(self.zarr), self.zarr.shape[0]
        if isinstance(first, np.ndarray) and first.dtype.kind in "iu":
            return np.unique(first.reshape(-1) % max(n, 1) // rows).tolist()
        if isinstance(first, slice) and first.step in (None, 1):
            lo, hi, _ = first.indices(n)
            return range(lo // rows, math.ceil(hi / rows)) if hi > lo else ()
        if isinstance(first, (int, np.integer)) and n:
            return (int(first) % n // rows,)
        return range(math.ceil(n / rows))

    def _damage(self, key: Any, exc: Exception) -> Exception:
        """The UserError for a failed read of ``key``; ``exc`` itself if no chunk is unreadable."""
        for r in self._file_rows(key):
            found = self.damaged_chunk(r * rows_per_file(self.zarr), (r + 1) * rows_per_file(self.zarr))
            if found is not None:
                return self._damage_error(found)
        return exc

    def _damage_error(self, found: tuple[str, int, int, str]) -> UserError:
        file, start, stop, reason = found
        return UserError(f"{self.store.path}: array '{self.name}' is damaged at rows {start}-{stop - 1} "
                         f"(chunk file {file}: {reason}); run `features verify {self.store.path} --repair`, "
                         "then the store's `features` command to recompute it")

    def _chunks_of(self, file_rows: Iterable[int]) -> Iterator[tuple[int, ...]]:
        """Grid coordinates of the chunk files at the row coordinates ``file_rows`` (every column chunk)."""
        columns = list(np.ndindex(*self._file_grid()[1:]))
        for r in file_rows:
            for rest in columns:
                yield (int(r), *rest)

    def _found(self, coords: tuple[int, ...], reason: str) -> tuple[str, int, int, str]:
        rows = rows_per_file(self.zarr)
        start = coords[0] * rows
        stop = min(start + rows, self.zarr.shape[0])
        return f"{self.zarr.path}/{self.chunk_key(coords)}", start, stop, reason

    def damaged_chunk(self, lo: int, hi: int) -> tuple[str, int, int, str] | None:
        """The first chunk of rows ``lo:hi`` whose file is not a regular file, is missing (where
        :attr:`every_chunk`) or cannot be decoded: ``(file relative to the store, first row, stop row,
        reason)``, or ``None``."""
        rows = rows_per_file(self.zarr)
        folder = self.store.path / self.zarr.path
        for coords in self._chunks_of(range(lo // rows, max(lo // rows, math.ceil(hi / rows)))):
            problem = chunk_file_problem(folder / self.chunk_key(coords), self.every_chunk)
            if problem is not None:
                return self._found(coords, problem)
            try:
                self.zarr.get_block_selection(coords)
            except Exception as exc:  # noqa: BLE001 - codecs raise RuntimeError, ValueError, ...
                return self._found(coords, one_line(exc))
        return None

    def check_chunk_files(self, file_rows: Iterable[int]) -> None:
        """A one-line UserError naming the first chunk file at the row coordinates ``file_rows`` that is
        missing (where :attr:`every_chunk`) or not a regular file; ``stat`` only. Zarr has just read such a
        file as the fill value, so this is what tells damage from the rows of failed images."""
        folder = self.store.path / self.zarr.path
        for coords in self._chunks_of(file_rows):
            problem = chunk_file_problem(folder / self.chunk_key(coords), self.every_chunk)
            if problem is not None:
                raise self._damage_error(self._found(coords, problem))

    def _file_grid(self) -> tuple[int, ...]:
        """Chunk files along each axis (shards of a sharded array, else chunks)."""
        per_file = self.zarr.shards or self.zarr.chunks
        return tuple(math.ceil(s / c) for s, c in zip(self.zarr.shape, per_file, strict=True))

    def chunk_files(self, blocks: Iterable[int]) -> dict[int, list[Path]]:
        """Chunk files holding the rows of each of ``blocks`` (row chunk = block; every column chunk)."""
        folder = self.store.path / self.zarr.path
        columns = list(np.ndindex(*self._file_grid()[1:]))
        return {int(b): [folder / self.chunk_key((int(b), *rest)) for rest in columns] for b in blocks}


class OrthogonalRows:
    """``array.oindex[...]`` of a :class:`StoreArray`: Zarr's orthogonal selection, read and checked as
    ``array[...]`` is (a region export reads its rows so)."""

    def __init__(self, array: StoreArray) -> None:
        self.array = array

    def __getitem__(self, key: Any) -> Any:
        return self.array._read(lambda: self.array.zarr.oindex[key], key)


#: what :func:`chunk_file_problem` says of a chunk file that is not there
MISSING = "missing"


def chunk_file_problem(file: str | os.PathLike, required: bool = True) -> str | None:
    """Why ``file`` cannot be the chunk file it should be: :data:`MISSING` (only when ``required``: a
    finished block of a store that writes every chunk), ``"a folder, not a file"``, ``"not a regular
    file"`` (a FIFO, device or socket); ``None`` when it is a regular file (links followed) or may be
    absent. The one rule of every reader and of ``features verify``
    (:func:`features.store.verify.check_files`)."""
    try:
        mode = os.stat(file).st_mode
    except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a file where a folder of the path goes
        return MISSING if required else None
    except OSError as exc:
        return f"unreadable ({exc.strerror or type(exc).__name__})"
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    if not stat.S_ISREG(mode):
        return "not a regular file (a FIFO, device or socket)"
    return None


def one_line(exc: BaseException) -> str:
    """An exception's text on one line of at most 160 characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."
