"""Atomic writes shared by every stage: nothing half-written is ever left under a final name."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing; on success fsync it and rename it to ``path``.

    On any exception the temporary file is removed and ``path`` is left as it was, so a reader (or a
    run killed at any instant) only ever sees a complete file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file and an atomic rename."""
    with atomic_file(path, "w") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=indent)
        fh.write("\n")


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``final`` in one rename.

    On any exception the temporary directory is removed and ``final`` is left as it was.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        yield tmp
        if final.exists():
            if not overwrite:
                raise FileExistsError(final)
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
