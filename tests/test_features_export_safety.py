"""``features export`` / ``import`` against hostile outputs and inputs, a full disk, Ctrl-C, stale temporaries

Each hostile case: exit status 2, one line on stderr, and nothing outside the output changed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import imported_store, minimal_prepared

from features.cli import main
from vsecore.io import _host_tag

ROOT = Path(__file__).resolve().parents[1]
N_TRAIN, N_TEST, WIDTH = 8, 4, 16


def _prepared(root: Path, n_train: int = N_TRAIN, n_test: int = N_TEST) -> Path:
    return minimal_prepared(root, n_train, n_test)


def _store(data: Path, out: Path, width: int = WIDTH, seed: int = 0) -> Path:
    return imported_store(data, out, width, seed)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    data = _prepared(tmp_path / "data")
    _store(data, tmp_path / "s.zarr")
    return tmp_path


def _tree(path: Path) -> dict[str, bytes | None]:
    """Every entry under ``path`` with the bytes of its files (folders: None)."""
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(path.rglob("*"))}


def _one_line_error(args: list[str], capsys: pytest.CaptureFixture) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("features: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def _export(work: Path, fmt: str, out: str, *more: str) -> list[str]:
    return ["export", "--store", str(work / "s.zarr"), "--data", str(work / "data"), "--format", fmt,
            "--out", out, *more]


def _setup_user_file(work: Path) -> str:
    (work / "mine.h5").write_bytes(b"the user's own file")
    return str(work / "mine.h5")


def _setup_user_precomp(work: Path) -> str:
    (work / "theirs").mkdir()
    (work / "theirs" / "train_ims.npy").write_bytes(b"someone else's features")
    return str(work / "theirs")


def _setup_other_store(work: Path) -> str:
    other = _store(work / "data", work / "other.zarr", seed=1)
    return str(other / "exported.h5")


def _setup_folder(work: Path) -> str:
    (work / "folder").mkdir()
    return str(work / "folder")


#: (case, --format, --out (a path under the work folder, or a setup function), words of the message)
HOSTILE_OUTPUTS = [
    ("the dataset's dataset.json", "hdf5", "data/dataset.json", "input"),
    ("the dataset folder", "precomp", "data", "input"),
    ("inside the dataset folder", "precomp", "data/precomp", "input"),
    ("the store's zarr.json", "hdf5", "s.zarr/zarr.json", "input"),
    ("the store itself", "hdf5", "s.zarr", "input"),
    ("inside another store", "hdf5", _setup_other_store, "feature store"),
    ("an existing file", "hdf5", _setup_user_file, "--overwrite"),
    ("a folder holding a same-named file", "precomp", _setup_user_precomp, "--overwrite"),
    ("an existing folder as the hdf5 file", "hdf5", _setup_folder, "folder"),
    ("an existing file as the precomp folder", "precomp", _setup_user_file, "not a folder"),
    ("the file system root", "hdf5", "/", "root"),
]


@pytest.mark.parametrize("case, fmt, out, words", HOSTILE_OUTPUTS, ids=[c[0] for c in HOSTILE_OUTPUTS])
def test_export_refuses_outputs_it_may_not_write(work, capsys, case, fmt, out, words):
    target = out(work) if callable(out) else ("/" if out == "/" else str(work / out))
    before = _tree(work)
    err = _one_line_error(_export(work, fmt, target), capsys)
    assert words in err
    assert _tree(work) == before


def test_export_overwrite_replaces_only_its_own_files(work, capsys):
    mine = _setup_user_file(work)
    assert main(_export(work, "hdf5", mine, "--overwrite")) == 0
    with h5py.File(mine, "r") as h5:
        assert h5["global"].shape == (N_TRAIN + N_TEST, WIDTH)
    folder = Path(_setup_user_precomp(work))
    (folder / "notes.txt").write_text("kept")
    assert main(_export(work, "precomp", str(folder), "--overwrite")) == 0
    assert (folder / "notes.txt").read_text() == "kept"
    assert np.load(folder / "train_ims.npy").shape == (N_TRAIN, WIDTH)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_export_removes_temporaries_of_dead_writers(work):
    out = work / "precomp"
    out.mkdir()
    pid = _dead_pid()
    stale = [out / f".train_ims.npy.{_host_tag()}-{pid}.ab12cd34.tmp",
             work / f".f.h5.{_host_tag()}-{pid}.x1.tmp",
             out / f".train_ims.npy.{pid}.tmp", work / f".f.h5.{pid}.tmp"]  # as exports before left them
    live = out / f".train_ims.npy.{_host_tag()}-{os.getpid()}.ab12cd34.tmp"  # a live writer's: kept
    for path in [*stale, live]:
        path.write_bytes(b"\0" * 1024)
    assert main(_export(work, "precomp", str(out))) == 0
    assert main(_export(work, "hdf5", str(work / "f.h5"))) == 0
    assert not any(p.exists() for p in stale) and live.exists()
    assert not [p for p in work.rglob("*.tmp") if p != live]


def _tmpfs(path: Path, size: str) -> Path:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.decode().strip()})")
    return path


@pytest.fixture
def small_disk(tmp_path: Path):
    disk = _tmpfs(tmp_path / "disk", "1m")
    yield disk
    subprocess.run(["umount", str(disk)], check=False)


def _features(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "features", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.parametrize("fmt, name", [("hdf5", "x.h5"), ("precomp", "p")])
def test_export_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, small_disk, fmt, name):
    """A 1 MB disk, a 2.5 MB export: exit 2 and one line (was: exit 139 after four 'Exception ignored')."""
    data = _prepared(tmp_path / "data")
    _store(data, tmp_path / "s.zarr", width=64 * 1024)
    done = _features("export", "--store", str(tmp_path / "s.zarr"), "--data", str(data), "--format", fmt,
                     "--out", str(small_disk / name))
    assert done.returncode == 2, done.stderr[-2000:]
    err = done.stderr.strip()
    assert "\n" not in err and "no space left" in err and str(small_disk) in err, err
    assert not [p for p in small_disk.rglob("*") if p.is_file()]


@pytest.mark.parametrize("signum, status, word", [(signal.SIGINT, 130, "interrupted"),
                                                  (signal.SIGTERM, 143, "terminated")])
def test_hdf5_export_stops_on_ctrl_c(tmp_path, signum, status, word):
    """SIGINT (SIGTERM) while the HDF5 file is written: exit 130 (143), one line, no file (SIGINT was
    ignored: 'Exception ignored ... KeyboardInterrupt', then exit 0)."""
    data = _prepared(tmp_path / "data", n_train=3000)
    _store(data, tmp_path / "s.zarr", width=2048)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "features", "export", "--store", str(tmp_path / "s.zarr"),
                             "--data", str(data), "--format", "hdf5", "--out", str(out / "x.h5")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120

    def writing() -> bool:  # HDF5 is writing the features (not reading the store before)
        return any(p.stat().st_size > 2**20 for p in out.iterdir())

    while not writing() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err[-2000:]
    assert err.strip() == f"features: {word}"
    assert list(out.iterdir()) == []


def _npy_with_header(path: Path, shape: tuple[int, ...], body: bytes) -> str:
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": shape})
        fh.write(body)
    return str(path)


#: (case, make the --npy file, words of the message)
HOSTILE_IMPORTS = [
    ("header claims 1e7 x 1000 on 1 KB",
     lambda d: _npy_with_header(d / "h.npy", (10_000_000, 1000), b"\0" * 1024), "header declares"),
    ("complex values",
     lambda d: np.save(d / "c.npy", np.ones((N_TEST, 3), np.complex64)) or str(d / "c.npy"), "complex"),
    ("not a .npy file",
     lambda d: (d / "t.npy").write_text("hello") and str(d / "t.npy"), "cannot read as .npy"),
    ("a folder", lambda d: str(d), "folder"),
]


@pytest.mark.parametrize("case, make, words", HOSTILE_IMPORTS, ids=[c[0] for c in HOSTILE_IMPORTS])
def test_import_refuses_hostile_npy(work, capsys, case, make, words):
    inputs = work / "inputs"
    inputs.mkdir()
    npy = make(inputs)
    before = _tree(work)
    err = _one_line_error(["import", "--npy", npy, "--data", str(work / "data"), "--split", "test",
                           "--out", str(work / "i.zarr")], capsys)
    assert words in err
    assert _tree(work) == before


@pytest.mark.parametrize("where, words", [
    ("data/features.zarr", "input"), ("s.zarr/inner.zarr", "feature store"), ("/", "root")])
def test_import_refuses_a_store_inside_an_artifact(work, capsys, where, words):
    np.save(work / "t.npy", np.ones((N_TEST, 3), np.float32))
    before = _tree(work)
    out = where if where == "/" else str(work / where)
    err = _one_line_error(["import", "--npy", str(work / "t.npy"), "--data", str(work / "data"),
                           "--split", "test", "--out", out], capsys)
    assert words in err and _tree(work) == before


def test_hdf5_import_refuses_complex_features(work, capsys):
    h5file = work / "c.h5"
    with h5py.File(h5file, "w") as h5:
        h5["global"] = np.ones((N_TRAIN, 3), np.complex64)
        h5["imgid"] = np.arange(N_TRAIN)
    before = _tree(work)
    err = _one_line_error(["import", "--format", "hdf5", "--h5", str(h5file), "--data", str(work / "data"),
                           "--out", str(work / "i.zarr")], capsys)
    assert "complex" in err and _tree(work) == before


def test_deferred_interrupts_raise_at_check_and_restore_handlers():
    from vsecore.errors import Terminated
    from vsecore.io import deferred_interrupts

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), deferred_interrupts() as interrupts:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        reached = True  # noted, not raised: the writer goes on to its next check
        interrupts.check()
    assert reached and signal.getsignal(signal.SIGINT) is before
    with pytest.raises(Terminated), deferred_interrupts():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # never checked: raised when the block ends
