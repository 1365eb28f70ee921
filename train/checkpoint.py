"""Checkpoints: atomic save and load of the whole training state, random generators included.

A checkpoint is one ``torch.save`` dictionary written to a temporary sibling file, flushed to
disk and renamed over the final name, so a run killed at any instant (SIGKILL included) leaves
either the previous complete checkpoint or the new complete one, never a torn file. The random
generator states (torch CPU and CUDA, numpy, Python) travel with it because continuing a run
exactly means continuing every random stream exactly.
"""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prep.errors import UserError
from prep.io import atomic_file


def rng_states() -> dict[str, Any]:
    """The global random generator states: torch CPU, every CUDA device, numpy and Python."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    """Put back the generator states saved by :func:`rng_states`.

    CUDA states are restored only when the same number of devices is present: resuming a GPU
    run on CPU is allowed, it just cannot be bit-identical.
    """
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, ``os.replace``)."""
    with atomic_file(path, "wb") as fh:
        torch.save(state, fh)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`; a :class:`UserError` if unreadable."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint")
    try:
        # weights_only=False: the state holds numpy / Python RNG tuples; these files are our own
        return torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # a foreign or damaged file: say which one
        raise UserError(f"{path}: not a readable checkpoint ({type(exc).__name__}: {exc})") from None


def remove_stale_temporaries(folder: str | os.PathLike) -> int:
    """Delete temporary files left by a writer killed mid-write; returns how many were removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    n = 0
    for tmp in folder.glob(".*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            n += 1
    return n
