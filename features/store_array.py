"""One array of a feature store: reads like the Zarr array, and a damaged chunk is a one-line error naming
the store, the array, the rows and the chunk file (:class:`StoreArray`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import zarr

from features import codec_bounds
from features.store_layout import rows_per_file
from vsecore.errors import UserError

codec_bounds.install()  # every zstd or Blosc chunk a store reader decompresses is bounded by its chunk's size


class HasPath(Protocol):
    """The store an array belongs to (:class:`features.store.FeatureStore`): its folder names the files."""

    path: Path


class StoreArray:
    """One array of a store: reads and writes like the Zarr array, but a damaged chunk is a UserError.

    Zarr and its codecs raise assorted exceptions for a truncated or corrupt chunk file; a read that
    fails is retried chunk by chunk to name the first bad chunk, and becomes one line naming the
    store, the array, the rows and the chunk file, with the repair command. ``shape``, ``chunks``,
    ``dtype``, ``attrs`` ... are the Zarr array's.
    """

    def __init__(self, store: HasPath, name: str, array: zarr.Array) -> None:
        self.store, self.name, self.zarr = store, name, array

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.zarr, attr)

    def __getitem__(self, key: Any) -> Any:
        try:
            return self.zarr[key]
        except Exception as exc:  # noqa: BLE001 - codecs raise RuntimeError, ValueError, ...
            raise self._damage(key, exc) from None

    def __setitem__(self, key: Any, value: Any) -> None:
        self.zarr[key] = value

    def chunk_key(self, chunk: tuple[int, ...]) -> str:
        """The path of chunk ``chunk`` (grid coordinates) relative to the array, e.g. ``c/3/0``."""
        return str(self.zarr.metadata.encode_chunk_key(chunk))

    def _damage(self, key: Any, exc: Exception) -> Exception:
        """The UserError for a failed read of ``key``; ``exc`` itself if no chunk is unreadable."""
        first = key[0] if isinstance(key, tuple) and key else key
        n = self.zarr.shape[0]
        if isinstance(first, np.ndarray) and first.size:
            lo, hi = int(first.min()), int(first.max()) + 1
        elif isinstance(first, slice) and first.step in (None, 1):
            lo, hi, _ = first.indices(n)
        elif isinstance(first, (int, np.integer)) and n:
            lo = int(first) % n
            hi = lo + 1
        else:
            lo, hi = 0, n
        found = self.damaged_chunk(lo, hi)
        if found is None:
            return exc
        file, start, stop, reason = found
        return UserError(f"{self.store.path}: array '{self.name}' is damaged at rows {start}-{stop - 1} "
                         f"(chunk file {file}: {reason}); run `features verify {self.store.path} --repair`, "
                         "then the store's `features` command to recompute it")

    def damaged_chunk(self, lo: int, hi: int) -> tuple[str, int, int, str] | None:
        """The first chunk of rows ``lo:hi`` that cannot be decoded: ``(file relative to the store,
        first row, stop row, reason)``, or ``None``."""
        rows = rows_per_file(self.zarr)
        for r in range(lo // rows, max(lo // rows, math.ceil(hi / rows))):
            for rest in np.ndindex(*self._file_grid()[1:]):
                try:
                    self.zarr.get_block_selection((r, *rest))
                except Exception as exc:  # noqa: BLE001 - codecs raise RuntimeError, ValueError, ...
                    file = f"{self.zarr.path}/{self.chunk_key((r, *rest))}"
                    return file, r * rows, min((r + 1) * rows, self.zarr.shape[0]), one_line(exc)
        return None

    def _file_grid(self) -> tuple[int, ...]:
        """Chunk files along each axis (shards of a sharded array, else chunks)."""
        per_file = self.zarr.shards or self.zarr.chunks
        return tuple(math.ceil(s / c) for s, c in zip(self.zarr.shape, per_file, strict=True))

    def chunk_files(self, blocks: Iterable[int]) -> dict[int, list[Path]]:
        """Chunk files holding the rows of each of ``blocks`` (row chunk = block; every column chunk)."""
        folder = self.store.path / self.zarr.path
        columns = list(np.ndindex(*self._file_grid()[1:]))
        return {int(b): [folder / self.chunk_key((int(b), *rest)) for rest in columns] for b in blocks}


def one_line(exc: BaseException) -> str:
    """An exception's text on one line of at most 160 characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."
