"""Issue 43.1: a block mapped in pieces keeps its work (issue 44.1: with the writer thread and the reader's
settings).

A block is still the unit of resumption and of Zarr chunks, but the mapper runs a few images at a time, the
progress bar counts them, and the rows mapped so far are committed every ``VSE_PIECE_SECONDS`` and when the
run is interrupted. A Ctrl-C (a real SIGINT to a real ``features cnn``) inside the first block keeps the
images it mapped, the re-run maps only the rest, and the store equals an uninterrupted run's bit for bit;
so does a SIGKILL after a periodic commit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import ColourFactory, ColourMapper, make_image_dataset, new_store, paths_of

from features.cli import main
from features.executors import pieces
from features.executors.extract import extract, retry_failures
from features.executors.in_process import InProcessExecutor
from features.store.core import FeatureStore

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: one block of 24 images, 10 crops each, one image per call of the mapper on the CPU
CNN = ["--cnn", "efficientnet_lite0", "--weights", "none", "--crops", "10", "--input-size", "96",
       "--block-size", "24", "--batch-size", "1", "--device", "cpu", "--threads", "1"]


@pytest.fixture(scope="module")
def data(coco_sample, tmp_path_factory) -> Path:
    return make_image_dataset(tmp_path_factory.mktemp("prep"), coco_sample, 24)


@pytest.fixture(scope="module")
def clean(data, tmp_path_factory) -> Path:
    """The uninterrupted run's store."""
    out = tmp_path_factory.mktemp("clean") / "clean.zarr"
    assert main(["cnn", "--data", str(data), "--out", str(out), *CNN, "--no-progress"]) == 0
    return out


def _features(args: list[str], **env: str) -> subprocess.Popen:
    """``features ARGS`` in a subprocess (one torch thread, progress as plain lines on stdout)."""
    environ = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env)
    return subprocess.Popen([sys.executable, "-m", "features", *args], cwd=ROOT, env=environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def assert_same_store(a: Path, b: Path) -> None:
    """Every array of two finished stores equal bit for bit, the same failures, and no piece record left."""
    x, y = FeatureStore(a), FeatureStore(b)
    for name in ("global", "valid", "imgid", "blocks_done"):
        left, right = np.asarray(x.array(name)[:]), np.asarray(y.array(name)[:])
        assert left.dtype == right.dtype and left.tobytes() == right.tobytes(), name
    assert same_failures(x, y)
    assert x.attrs["complete"] and not (a / pieces.RECORD).exists()


def same_failures(x: FeatureStore, y: FeatureStore) -> bool:
    """The ``failures`` arrays of two stores hold the same strings (compared as strings: the bytes of a
    numpy string array hold pointers into its own memory, never equal between two arrays)."""
    return x.array("failures")[:].tolist() == y.array("failures")[:].tolist()


def test_ctrl_c_in_the_first_block_keeps_the_images_mapped(data, clean, tmp_path, capsys) -> None:
    """SIGINT after the progress line of the 3rd image (no periodic commit: VSE_PIECE_SECONDS 1000): the
    interrupt commits what was mapped, says "N of 24 images kept (0 of 1 blocks finished)", and the re-run
    maps only the other 24 - N images into a store equal to the uninterrupted one."""
    out = tmp_path / "s.zarr"
    proc = _features(["cnn", "--data", str(data), "--out", str(out), *CNN],
                     VSE_PROGRESS_SECONDS="0", VSE_PIECE_SECONDS="1000")
    seen = 0
    deadline = time.monotonic() + 300
    while seen < 3:  # "features: 3/24 img (12%), ...": a line per image, from the first one
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        if line.startswith("features: ") and "/24 img" in line:
            seen = int(line.split("/24 img")[0].rsplit(" ", 1)[-1])
            assert "ETA" in line or seen >= 24, line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    kept = int(FeatureStore(out).array(pieces.RECORD)[0])
    assert seen <= kept < 24 and not FeatureStore(out).blocks_done().any()
    assert err.strip().splitlines()[-1] == (f"features: interrupted: {kept} of 24 images kept (0 of 1 blocks "
                                            "finished), re-run the same command to resume")
    capsys.readouterr()
    assert main(["cnn", "--data", str(data), "--out", str(out), *CNN, "--no-progress"]) == 0
    assert f"wrote {24 - kept} rows, skipped {kept} already done, 0 failed" in capsys.readouterr().out
    assert_same_store(out, clean)


def test_sigkill_after_a_periodic_commit_resumes_from_it(data, clean, tmp_path, capsys) -> None:
    """VSE_PIECE_SECONDS 0 commits after every image: a SIGKILL once two are on disk loses at most the image
    being mapped, and the re-run ends equal to the uninterrupted store."""
    out = tmp_path / "s.zarr"
    proc = _features(["cnn", "--data", str(data), "--out", str(out), *CNN, "--no-progress"],
                     VSE_PIECE_SECONDS="0")
    record = out / pieces.RECORD / "c" / "0"
    deadline = time.monotonic() + 300
    while not (record.is_file() and int(FeatureStore(out).array(pieces.RECORD)[0]) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = int(FeatureStore(out).array(pieces.RECORD)[0])
    assert 2 <= kept < 24
    capsys.readouterr()
    assert main(["cnn", "--data", str(data), "--out", str(out), *CNN, "--no-progress"]) == 0
    assert f"wrote {24 - kept} rows, skipped {kept} already done" in capsys.readouterr().out
    assert_same_store(out, clean)


class PiecewiseColours(ColourMapper):
    """The colour statistics two images a call; with ``stop_after``, Ctrl-C at that call."""

    images_per_call = 2

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__()
        self.calls, self.images, self.stop_after = 0, 0, stop_after

    def __call__(self, images):
        self.calls += 1
        if self.calls == self.stop_after:
            raise KeyboardInterrupt
        self.images += len(images)
        return super().__call__(images)


class PiecewiseFactory(ColourFactory):
    def __init__(self, mapper: PiecewiseColours) -> None:
        super().__init__()
        self.mapper, self.key = mapper, f"piecewise:{id(mapper)}"

    def build(self) -> PiecewiseColours:
        return self.mapper


@pytest.fixture(scope="module")
def with_bad(coco_sample, tmp_path_factory) -> Path:
    """10 images, rows 1 (missing file: transient) and 6 (not an image) unusable."""
    root = tmp_path_factory.mktemp("bad")
    (root / "noise.jpg").write_bytes(b"not an image at all" * 10)
    extra = {1: root / "missing.jpg", 6: root / "noise.jpg"}
    return make_image_dataset(root / "prep", coco_sample, 10, extra=extra)


def test_pieces_keep_their_failures_and_the_resumed_store_is_the_same(with_bad, tmp_path) -> None:
    """Blocks of 5, two images a call: a Ctrl-C at the 5th call (block 1's second) keeps block 0 and the
    first two rows of block 1 with the failure of row 6 among them; the resumed run maps only the 3 other
    rows; the store is the uninterrupted one, failures and validity included."""
    paths = paths_of(with_bad)
    reference = new_store(tmp_path / "ref.zarr", 10, block=5)
    extract(reference, paths, ColourFactory(), InProcessExecutor(), progress=False)
    store = new_store(tmp_path / "s.zarr", 10, block=5)
    with pytest.raises(KeyboardInterrupt):
        extract(store, paths, PiecewiseFactory(PiecewiseColours(stop_after=5)), InProcessExecutor(),
                progress=False)
    assert store.blocks_done().tolist() == [True, False]
    (rows, failures), = pieces.kept(store, [1]).values()
    assert rows == 2 and [f["imgid"] for f in failures] == [6] and pieces.rows_kept(store) == 7
    resumed = PiecewiseColours()
    summary = extract(store, paths, PiecewiseFactory(resumed), InProcessExecutor(), progress=False)
    assert (summary.rows_written, summary.rows_skipped, resumed.images) == (3, 7, 3)
    assert [f["imgid"] for f in summary.failures] == [1, 6]
    for name in ("global", "valid", "blocks_done"):
        a, b = np.asarray(store.array(name)[:]), np.asarray(reference.array(name)[:])
        assert a.tobytes() == b.tobytes(), name
    assert same_failures(store, reference)
    assert not (store.path / pieces.RECORD).exists()


def test_a_transient_failure_among_kept_rows_is_retried(with_bad, tmp_path) -> None:
    """The record of an unfinished block whose kept rows hold a transient failure (row 1: missing file) is
    forgotten by the re-run's retry, which maps the block again from its first row."""
    paths = paths_of(with_bad)
    store = new_store(tmp_path / "s.zarr", 10, block=10)
    with pytest.raises(KeyboardInterrupt):
        extract(store, paths, PiecewiseFactory(PiecewiseColours(stop_after=3)), InProcessExecutor(),
                progress=False)
    assert pieces.kept(store, [0])[0][0] == 4 and [f["imgid"] for f in pieces.kept(store, [0])[0][1]] == [1]
    assert retry_failures(store) == (1, 1)
    assert pieces.kept(store, [0]) == {}
    summary = extract(store, paths, PiecewiseFactory(PiecewiseColours()), InProcessExecutor(), progress=False)
    assert summary.rows_written == 10


def test_a_flagged_block_never_trusts_an_old_record(with_bad, tmp_path) -> None:
    """A record left for a finished block (an older version finished it without knowing the record) is
    zeroed when a run starts, so a block cleared later is mapped whole."""
    paths = paths_of(with_bad)
    store = new_store(tmp_path / "s.zarr", 10, block=5)
    extract(store, paths, ColourFactory(), InProcessExecutor(), progress=False)
    pieces.ensure_record(store)
    store.array(pieces.RECORD)[0] = 3
    pieces.forget_finished(store)
    assert store.array(pieces.RECORD)[:].tolist() == [0, 0]
    store.clear_blocks([0])
    mapper = PiecewiseColours()
    summary = extract(store, paths, PiecewiseFactory(mapper), InProcessExecutor(), progress=False)
    assert summary.rows_written == 5 and mapper.images == 4  # row 1 is a missing file


def test_a_write_error_in_the_writer_thread_is_one_line_and_keeps_earlier_blocks(data, tmp_path, capsys,
                                                                                  monkeypatch) -> None:
    """The store is written by the writer thread: its full disk still ends the run in one line naming what
    is kept, and the blocks before it are flagged in order."""
    import errno

    real = FeatureStore.write_block

    def full(self, block, *args, **kwargs):
        if block == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, block, *args, **kwargs)

    monkeypatch.setattr(FeatureStore, "write_block", full)
    out = tmp_path / "s.zarr"
    base = ["cnn", "--data", str(data), "--out", str(out), "--cnn", "efficientnet_lite0", "--weights", "none",
            "--crops", "1", "--input-size", "32", "--block-size", "4", "--device", "cpu", "--no-progress"]
    assert main(base) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot write the feature store: no space left on the device" in err[0]
    assert "; 12 of 24 images kept (3 of 6 blocks finished), the same command resumes" in err[0]
    assert FeatureStore(out).blocks_done().tolist() == [True] * 3 + [False] * 3


def test_dask_workers_pinned_to_one_device_each(data, tmp_path) -> None:
    """Issue 44.4 on the CPU: a local cluster of two workers pinned to devices (``CUDA_VISIBLE_DEVICES``
    and a ``GPU`` resource each), first both sharing device 0, then one each on 0 and 1: every block asks for
    a GPU, the results say which pinned worker ran them, and the store equals the in-process one."""
    pytest.importorskip("distributed")
    from features.executors import open_executor
    from features.executors.dask_cluster import pinned_workers

    specs = pinned_workers(3, ["0", "1"])
    assert [s["options"]["env"]["CUDA_VISIBLE_DEVICES"] for s in specs.values()] == ["0", "1", "0"]
    assert all(s["options"]["resources"] == {"GPU": 1} and s["options"]["nthreads"] == 1
               for s in specs.values())
    paths = paths_of(data)
    reference = new_store(tmp_path / "ref.zarr", 24, block=3)
    extract(reference, paths, ColourFactory(), InProcessExecutor(), progress=False)
    for devices in (["0"], ["0", "1"]):
        store = new_store(tmp_path / f"{len(devices)}.zarr", 24, block=3)
        with open_executor("local", workers=2, devices=devices) as executor:
            seen = executor.client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
            held = [w["resources"] for w in executor.client.scheduler_info()["workers"].values()]
            assert executor.resources() == {"GPU": 1}
            summary = extract(store, paths, ColourFactory(), executor, progress=False)
        assert sorted(seen.values()) == sorted(devices * (2 // len(devices)))
        assert held == [{"GPU": 1}, {"GPU": 1}]
        assert sum(summary.devices.values()) == 8
        assert set(summary.devices) <= {f"cpu (CUDA_VISIBLE_DEVICES={d})" for d in devices}
        np.testing.assert_array_equal(store.array("global")[:], reference.array("global")[:])
