"""Text inputs received from someone else: special files and unreadable numbers (issue 30.1, 30.2); and
``.npy`` inputs of ``train evaluate`` read from checked headers (issue 41.3).

Every command's text input goes through ``vsecore.io.read_text``: a regular file of bounded size,
opened without blocking. One table: file kind x corruption -> exit 2 and one line naming the file, in
a subprocess under an address-space cap and a time cap.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

#: the subprocess's address-space cap: torch's CUDA build maps about 3 GiB of virtual memory at start
MEMORY_CAP = 6 << 30
TIME_CAP = 60


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=TIME_CAP,
                          preexec_fn=_limits, cwd=cwd, env=dict(os.environ, OMP_NUM_THREADS="1"))


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def dev_zero(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


def huge(path: Path) -> Path:
    with open(path, "wb") as f:
        f.truncate(20 << 20)  # 20 MB of NUL bytes (sparse)
    return path


def long_integer(path: Path) -> Path:
    path.write_text("pipelines:\n  demo:\n    prep: {dataset: synthetic, num_images: " + "9" * 5000 + "}\n")
    return path


def deep_yaml(path: Path) -> Path:
    path.write_text("pipelines: " + "[" * 100000 + "]" * 100000 + "\n")
    return path


def forged_npy(path: Path) -> Path:
    """A .npy file whose header declares 10,000,000 x 1,000 float32 (40 GB) on 1 KB of data (issue 41.3)."""
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (10**7, 1000)})
        fh.write(bytes(1000))
    return path


def run_folder(make: Callable[[Path], Path]) -> Callable[[Path], Path]:
    """A run folder whose config.json is made by ``make``."""
    def build(path: Path) -> Path:
        path.mkdir()
        (path / ".vse-run").write_text("")
        (path / "checkpoints").mkdir()
        make(path / "config.json")
        return path
    return build


#: (case, make the input at a path, the command (INPUT is replaced), the text the one line names)
CASES = [
    ("pipelines file /dev/zero", dev_zero, ("train", "pipeline", "--pipelines", "INPUT", "--list"),
     "is not a regular file"),
    ("pipelines file FIFO", fifo, ("train", "pipeline", "--pipelines", "INPUT", "--list"),
     "is not a regular file"),
    ("pipelines file of 20 MB", huge, ("train", "pipeline", "--pipelines", "INPUT", "--list"),
     "bytes, more than"),
    ("pipelines file with a 5000-digit integer", long_integer,
     ("train", "pipeline", "--pipelines", "INPUT", "--list"), "a value cannot be read"),
    ("prep --pipelines FIFO", fifo, ("prep", "synthetic", "--pipelines", "INPUT", "--pipeline", "demo"),
     "is not a regular file"),
    ("Karpathy JSON that is a FIFO", fifo,
     ("prep", "coco", "--karpathy", "INPUT", "--images", "images", "--out", "o"), "is not a regular file"),
    ("Karpathy JSON linked to /dev/zero", dev_zero,
     ("prep", "coco", "--karpathy", "INPUT", "--images", "images", "--out", "o"), "is not a regular file"),
    ("a run's config.json that is a FIFO", run_folder(fifo), ("train", "evaluate", "--run", "INPUT"),
     "is not a regular file"),
    ("a run's config.json linked to /dev/zero", run_folder(dev_zero), ("train", "evaluate", "--run", "INPUT"),
     "is not a regular file"),
    ("embeddings whose .npy header declares 40 GB on 1 KB", forged_npy,
     ("train", "evaluate", "--img-emb", "INPUT", "--cap-emb", "INPUT", "--measure", "cosine"),
     "but the file holds 1,000 after it"),
    ("a similarity matrix that is a FIFO", fifo, ("train", "evaluate", "--sims", "INPUT"),
     "not a regular file"),
]


@pytest.mark.parametrize("case,make,command,names", CASES, ids=[c[0] for c in CASES])
def test_special_and_oversized_text_inputs_are_one_line(tmp_path: Path, case: str,
                                                         make: Callable[[Path], Path],
                                                         command: tuple[str, ...], names: str) -> None:
    (tmp_path / "images").mkdir()
    target = make(tmp_path / "input")
    done = run(*[str(target) if a == "INPUT" else a for a in command], cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (case, done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and ": error: " in lines[0], (case, done.stderr[-2000:])
    assert names in lines[0] and "input" in lines[0], (case, lines[0])


def test_deeply_nested_yaml_stays_one_line(tmp_path: Path) -> None:
    deep_yaml(tmp_path / "p.yaml")
    done = run("train", "pipeline", "--pipelines", str(tmp_path / "p.yaml"), "--list", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
