"""Faults a feature store must survive (issues 16 and 22): images that cost too much, thresholds that are
not numbers, planted lock files, damaged stores given to training, images folders that vanish, readers
racing a rewrite, signals, read-only stores.

Real COCO images of ``coco_sample``; ``features cnn`` with EfficientNet-Lite0, random weights, 64 px.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from helpers import BASE, make_image_dataset
from PIL import Image

from features.cli import main
from features.extractors.images import ImageError, load_image
from features.store.core import FeatureStore
from features.store.read import read_matrix
from vsecore.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("features: error:") and "\n" not in err, err
    return err


@pytest.fixture(scope="module")
def data(coco_sample, tmp_path_factory) -> Path:
    return make_image_dataset(tmp_path_factory.mktemp("prep") / "a", coco_sample, 8)


def cnn(data: Path, out: Path, *extra: str) -> int:
    return main(["cnn", "--data", str(data), "--out", str(out), *BASE, "--block-size", "2", *extra])


# -- issue 16 item 1: one image kills extraction -------------------------------------------------------
def strip_png(path: Path, width: int = 20000, height: int = 2) -> Path:
    Image.new("RGB", (width, height), (200, 10, 10)).save(path)
    return path


def test_pixel_strip_is_refused_from_its_header(tmp_path):
    strip = strip_png(tmp_path / "strip.png")
    assert strip.stat().st_size < 1000
    with pytest.raises(ImageError, match="aspect ratio 20000x2 is 10000:1"):
        load_image(strip)
    wide = strip_png(tmp_path / "wide.png", 3000, 100)  # 30:1 passes the aspect bound ...
    assert load_image(wide).size == (3000, 100)
    with pytest.raises(ImageError, match="would have .* pixels"):  # ... not a large resize of it
        load_image(wide, resize=1024)


def test_strip_is_recorded_invalid_and_input_size_is_bounded(coco_sample, tmp_path, capsys):
    strip = strip_png(tmp_path / "strip.png", 6000, 2)
    data = make_image_dataset(tmp_path / "prep", coco_sample, 4, extra={3: strip})
    out = tmp_path / "s.zarr"
    assert cnn(data, out) == 0
    assert "failed imgid 3" in capsys.readouterr().out
    x, valid = read_matrix(str(out))
    assert valid.tolist() == [True, True, True, False]
    assert "aspect ratio" in FeatureStore(out).attrs["failures"][0]["reason"]
    for size in ("0", "100000"):
        assert main(["cnn", "--data", str(data), "--out", str(tmp_path / "x.zarr"), *BASE,
                     "--input-size", size]) == 2
        assert f"--input-size {size}: must be between" in one_line_error(capsys)
    assert not (tmp_path / "x.zarr").exists()


def test_query_featurizer_refuses_the_strip_in_one_line(data, tmp_path):
    from features.featurize import Featurizer

    out = tmp_path / "q.zarr"
    assert cnn(data, out) == 0
    rows, failures = Featurizer.from_store(str(out))([strip_png(tmp_path / "strip.png")])
    assert rows.shape[0] == 0 and "aspect ratio" in failures[0]["reason"]


# -- issue 16 item 5: FNE thresholds accept NaN / inf ---------------------------------------------------
@pytest.fixture
def fne_store(data, tmp_path) -> Path:
    """A finished FNE store of the colour mapper (rows 0-4 train), 8 rows in blocks of 3."""
    from helpers import ColourFactory, new_store, paths_of

    from features.executors.extract import extract
    from features.executors.in_process import InProcessExecutor
    from features.store.ternary import finish_fne

    out = tmp_path / "f.zarr"
    store = new_store(out, 8, block=3, name="fne/raw", config={"cnn": "colour", "thresholds": [-0.25, 0.15]})
    extract(store, paths_of(data), ColourFactory("fne/raw"), InProcessExecutor(), progress=False)
    finish_fne(store, np.arange(8) < 5, -0.25, 0.15)
    store.set_attrs(complete=True)
    return out


@pytest.mark.parametrize("low,high", [("nan", "0.15"), ("-inf", "inf"), ("-0.25", "inf"), ("0.2", "0.2")])
def test_rethreshold_refuses_non_finite_or_unordered_thresholds(fne_store, capsys, low, high):
    before = FeatureStore(fne_store).array("fne/ternary")[:]
    assert main(["fne", "--out", str(fne_store), "--rethreshold", f"--threshold-low={low}",
                 f"--threshold-high={high}"]) == 2
    assert "--threshold-" in one_line_error(capsys)
    np.testing.assert_array_equal(FeatureStore(fne_store).array("fne/ternary")[:], before)


def test_verify_recomputes_ternary_rows_and_checks_recorded_thresholds(fne_store, data, capsys):
    from features.store.verify import verify_store

    assert verify_store(fne_store, data).ok
    store = FeatureStore(fne_store, mode="r+")
    tern = store.array("fne/ternary")
    # what `--threshold-low nan` used to write: no -1 left, the attributes naming the NaN
    tern[:] = np.maximum(tern[:], 0)
    report = verify_store(fne_store)
    assert not report.ok and any("differ from fne/raw" in p for ps in report.blocks.values() for p in ps)
    assert not report.rows_damaged  # derived from fne/raw: re-derived without re-extracting
    tern.attrs["thresholds"] = [float("nan"), 0.15]
    assert main(["verify", str(fne_store)]) == 2
    out = capsys.readouterr().out
    assert "recorded thresholds [nan, 0.15] are unusable" in out


def test_verify_recomputes_train_statistics_with_the_dataset(fne_store, data):
    from features.store.verify import verify_store

    store = FeatureStore(fne_store, mode="r+")
    store.array("fne/mean")[:] = store.array("fne/mean")[:] * 2 + 1
    store.array("fne/ternary")[:] = 0  # ternary rows follow the tampered statistics: only stats differ
    from features.store.ternary import write_ternary

    write_ternary(store, -0.25, 0.15)
    assert verify_store(fne_store).ok  # without the splits the statistics cannot be recomputed
    report = verify_store(fne_store, data)
    assert not report.ok and "differ from the train rows of fne/raw" in " ".join(report.store_problems)


# -- issue 16 item 6: lock files follow symlinks -------------------------------------------------------
def test_features_refuses_a_symlink_planted_at_the_lock(data, tmp_path, capsys):
    from vsecore.io import lock_path

    out = tmp_path / "s.zarr"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    lock_path(out).symlink_to(victim)
    assert cnn(data, out) == 2
    assert "is a symlink, not a regular file" in one_line_error(capsys)
    assert victim.read_text() == "precious" and not out.exists()


# -- issue 16 item 9: training reads a store that verify calls damaged ----------------------------------
@pytest.fixture(scope="module")
def cnn_store(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cnn") / "s.zarr"
    assert cnn(data, out) == 0
    return out


@pytest.mark.parametrize("damage", ["imgid", "unrecorded-invalid"])
def test_reader_refuses_rows_that_disagree_with_their_records(cnn_store, tmp_path, damage):
    import shutil

    out = tmp_path / "s.zarr"
    shutil.copytree(cnn_store, out)
    store = FeatureStore(out, mode="r+")
    if damage == "imgid":
        store.array("imgid")[2:4] = [3, 2]
        expected = "row 2 holds imgid 3"
    else:
        store.array("valid")[5] = False
        expected = "imgid 5 is invalid without a recorded failure"
    with pytest.raises(UserError, match=expected) as err:
        read_matrix(str(out))
    assert "features verify" in str(err.value) and "--repair" in str(err.value)
    from features.store.verify import verify_store

    assert not verify_store(out).ok  # and verify agrees


# -- issue 22 item 6: readers see a half-rewritten store ------------------------------------------------
def synthetic_fne_store(path: Path, rows: int = 96, width: int = 24, seed: int = 0, block: int = 2) -> Path:
    """A finished FNE store of random activations in blocks of ``block`` rows (48 chunk files per array)."""
    from features.store.ternary import finish_fne

    store = FeatureStore.create(path, np.arange(rows), {"fne/raw": width}, block, {"cnn": "random"},
                                {"network": "random"}, overwrite=path.exists())
    raw = np.random.default_rng(seed).normal(size=(rows, width)).astype(np.float32)
    for b in range(store.n_blocks):
        start, stop = store.block_rows(b)
        store.write_block(b, {"fne/raw": raw[start:stop]}, np.ones(stop - start, dtype=bool), [])
    finish_fne(store, np.arange(rows) < rows // 2, -0.25, 0.15)
    store.set_attrs(complete=True)
    return path


def race(reader, writer, seconds: float = 4.0, pause: float = 0.3) -> tuple[list, list[str]]:
    """Run ``writer()`` in a loop in a thread (``pause`` seconds between calls) while this thread calls
    ``reader()``; the reader's results and the messages of its UserErrors."""
    import threading
    import time

    stop = threading.Event()
    errors: list[BaseException] = []

    def loop():
        try:
            while not stop.is_set():
                writer()
                time.sleep(pause)  # a moment between rewrites: some reads complete, some overlap
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=loop)
    thread.start()
    results, refused = [], []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            try:
                results.append(reader())
            except UserError as exc:
                refused.append(str(exc))
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    return results, refused


def test_reader_racing_rethreshold_sees_one_version_or_is_told(tmp_path):
    from features.run import rethreshold_store
    from features.store.ternary import ternarize

    path = synthetic_fne_store(tmp_path / "f.zarr")
    store = FeatureStore(path)
    raw, mean, std = store.array("fne/raw")[:], store.array("fne/mean")[:], store.array("fne/std")[:]
    versions = [ternarize(raw, mean, std, *t) for t in ((-0.25, 0.15), (-1.0, 1.0))]
    turn = iter(range(10**9))

    def writer():
        rethreshold_store(path, *((-1.0, 1.0) if next(turn) % 2 == 0 else (-0.25, 0.15)))

    results, refused = race(lambda: read_matrix(f"{path}:fne", keep_dtype=True)[0], writer, pause=0.05)
    mixed = [x for x in results if not any(np.array_equal(x, v) for v in versions)]
    rows_of = [[np.flatnonzero((x == v).all(axis=1) & ~(x == w).all(axis=1)).tolist() for v, w in
                (versions, versions[::-1])] for x in mixed]
    assert not mixed, f"{len(mixed)} of {len(results)} reads mixed two versions (rows of each: {rows_of})"
    assert refused and results, (len(refused), len(results))
    assert all("being rewritten" in m or "rewritten" in m or "being written" in m for m in refused), refused


def test_a_ternary_swapped_under_a_reader_is_told_by_the_array_itself(tmp_path, monkeypatch):
    """The array's own identity is a second check, independent of the store's generation: with the
    generation check disabled, a --rethreshold swap between opening the array and reading it is still
    a one-line error, never the rows of another version."""
    from features.run import rethreshold_store
    from features.store import read as store_read

    path = synthetic_fne_store(tmp_path / "f.zarr")
    monkeypatch.setattr(FeatureStore, "check_unchanged", lambda self, before: None)
    real_read = store_read._read_whole  # the whole array's read (its chunk files, else Zarr)
    swapped = []

    def swap_first(array):
        if array.name == "fne/ternary" and not swapped:
            swapped.append(True)
            rethreshold_store(path, -1.0, 1.0)
        return real_read(array)

    monkeypatch.setattr(store_read, "_read_whole", swap_first)
    with pytest.raises(UserError, match="array 'fne/ternary' was rewritten while it was being read"):
        read_matrix(f"{path}:fne", keep_dtype=True)
    assert swapped
    x, _ = read_matrix(f"{path}:fne", keep_dtype=True)  # read again: the new version, whole
    store = FeatureStore(path)
    assert store.array("fne/ternary").attrs["thresholds"] == [-1.0, 1.0] and x.dtype == np.int8


def test_a_reader_that_sees_the_new_ternary_vanish_takes_the_swapped_one(tmp_path, monkeypatch):
    """The instant of a --rethreshold swap a racing reader once hit (CI, 1 run in ~10): the old array is
    gone, the new one was there a moment ago and is renamed now; the reader takes the final name."""
    from features.store.core import TERNARY, TERNARY_NEW

    store = FeatureStore(synthetic_fne_store(tmp_path / "f.zarr"))
    real = store._exists
    monkeypatch.setattr(store, "_exists",
                        lambda name: name == TERNARY_NEW or (name != TERNARY and real(name)))
    assert store._resolve(TERNARY) == TERNARY


def test_reader_racing_overwrite_sees_one_version_or_is_told(tmp_path):
    path = synthetic_fne_store(tmp_path / "f.zarr", seed=0, block=8)
    versions = [FeatureStore(path).array("fne/raw")[:]]
    other = synthetic_fne_store(tmp_path / "g.zarr", seed=1, block=8)
    versions.append(FeatureStore(other).array("fne/raw")[:])
    turn = iter(range(10**9))

    def writer():
        from vsecore.io import exclusive_lock

        with exclusive_lock(path, "the feature store"):
            synthetic_fne_store(path, seed=next(turn) % 2, block=8)

    results, refused = race(lambda: read_matrix(f"{path}:fne_raw"), writer, seconds=6.0, pause=0.6)
    bad = [x for x, valid in results if not valid.all() or not any(np.array_equal(x, v) for v in versions)]
    assert not bad, f"{len(bad)} of {len(results)} reads returned rows of no complete version"
    assert refused and results, (len(refused), len(results))


# -- issue 22 item 5: an images folder briefly unavailable becomes permanent damage ----------------------
def two_folder_dataset(coco_sample: Path, root: Path) -> tuple[Path, Path]:
    """8 images: rows 0-3 in ``root/a``, rows 4-7 in ``root/b``; returns (prepared folder, ``root/b``)."""
    import shutil

    names = sorted((coco_sample / "images").iterdir())[:8]
    extra = {}
    for i, src in enumerate(names):
        folder = root / ("a" if i < 4 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        extra[i] = Path(shutil.copy(src, folder / src.name))
    return make_image_dataset(root / "prep", coco_sample, 8, extra=extra), root / "b"


def test_vanished_images_folder_stops_the_run_and_a_rerun_resumes(coco_sample, tmp_path, capsys):
    data, folder = two_folder_dataset(coco_sample, tmp_path)
    out = tmp_path / "s.zarr"
    folder.rename(tmp_path / "elsewhere")
    assert cnn(data, out) == 2
    err = one_line_error(capsys)
    assert "the images folder looks unavailable" in err and str(folder) in err
    assert "4 of 8 images kept (2 of 4 blocks finished)" in err and "re-run the same command to resume" in err
    store = FeatureStore(out)
    assert store.blocks_done().tolist() == [True, True, False, False] and not store.block_failures()
    (tmp_path / "elsewhere").rename(folder)
    assert cnn(data, out) == 0
    assert "wrote 4 rows, skipped 4 already done, 0 failed" in capsys.readouterr().out
    x, valid = read_matrix(str(out))
    assert valid.all()


def test_transient_failures_are_listed_by_verify_and_retried_by_a_rerun(coco_sample, tmp_path, capsys):
    data, folder = two_folder_dataset(coco_sample, tmp_path)
    out = tmp_path / "s.zarr"
    image = sorted(folder.iterdir())[1]  # imgid 5
    image.rename(tmp_path / "aside.jpg")
    assert cnn(data, out) == 0
    assert "failed imgid 5" in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0
    report = capsys.readouterr().out
    assert "1 image(s) recorded as failed" in report and "1 may be transient" in report
    assert f"failed imgid 5: {image}: missing file" in report
    (tmp_path / "aside.jpg").rename(image)
    assert cnn(data, out) == 0
    captured = capsys.readouterr()
    assert "retrying 1 image(s)" in captured.err
    assert "wrote 2 rows, skipped 6 already done, 0 failed" in captured.out
    assert read_matrix(str(out))[1].all()


def test_retry_failed_retries_permanent_failures_too(coco_sample, tmp_path, capsys):
    data, folder = two_folder_dataset(coco_sample, tmp_path)
    out = tmp_path / "s.zarr"
    image = sorted(folder.iterdir())[0]  # imgid 4
    good = image.read_bytes()
    image.write_bytes(b"not an image at all")
    assert cnn(data, out) == 0
    image.write_bytes(good)
    assert cnn(data, out) == 0  # "not a recognised image file" is not retried by a plain re-run
    assert "wrote 0 rows, skipped 8 already done, 1 failed" in capsys.readouterr().out
    assert cnn(data, out, "--retry-failed") == 0
    assert "wrote 2 rows, skipped 6 already done, 0 failed" in capsys.readouterr().out


def test_many_transient_failures_in_a_row_stop_a_block(tmp_path):
    from features.executors.extract import MAX_TRANSIENT_IN_A_ROW, ImagesUnavailable, check_images_available

    records = [{"imgid": i, "path": str(tmp_path / f"{i}.jpg"), "reason": "I/O error (Stale file handle)"}
               for i in range(MAX_TRANSIENT_IN_A_ROW)]
    check_images_available(records[:-1])  # one fewer: recorded
    check_images_available(records[::2])  # not in a row
    with pytest.raises(ImagesUnavailable, match=f"{MAX_TRANSIENT_IN_A_ROW} images in a row failed"):
        check_images_available(records)


# -- issue 22 item 7: SIGTERM, Ctrl-C during imports ----------------------------------------------------
@pytest.mark.parametrize("sig,status", [("SIGTERM", 143), ("SIGINT", 130)])
def test_signal_mid_extraction_says_what_is_kept(data, tmp_path, sig, status):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "s.zarr"
    cmd = [sys.executable, "-m", "features", "cnn", "--data", str(data), "--out", str(out), *BASE,
           "--block-size", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    flags = out / "blocks_done" / "c"
    deadline = time.monotonic() + 120
    while not (flags.is_dir() and any(flags.iterdir())):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(getattr(signal, sig))
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == status, err
    assert "Traceback" not in err
    kept = int(FeatureStore(out).blocks_done().sum())
    assert err.strip().splitlines()[-1] == (f"features: interrupted: {kept} of 8 images kept ({kept} of 8 "
                                            "blocks finished), re-run the same command to resume")
    assert cnn(data, out, "--block-size", "1") == 0  # and the re-run resumes


@pytest.mark.parametrize("how,status,word", [("raise KeyboardInterrupt", 130, "interrupted"),
                                             ("os.kill(os.getpid(), signal.SIGTERM)", 143, "terminated")])
def test_interrupt_while_importing_is_one_line(how, status, word):
    import os
    import subprocess
    import sys

    code = ("import builtins, os, signal, sys\n"
            "real = builtins.__import__\n"
            "def slow(name, *a, **k):\n"
            "    if name == 'features.cli':\n"
            f"        {how}\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = slow\n"
            "from features.entry import main\n"
            "sys.exit(main(['cnn', '--help']))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert proc.returncode == status, proc.stderr
    assert proc.stderr.strip() == f"features: {word} (while starting; nothing was written)"


# -- issue 22 item 2: read-only stores, full disks ------------------------------------------------------
def test_read_only_store_is_said_before_any_block(data, tmp_path, monkeypatch, capsys):
    import errno
    import os

    out = tmp_path / "s.zarr"
    assert cnn(data, out, "--block-size", "4") == 0
    FeatureStore(out, mode="r+").clear_blocks([1])
    capsys.readouterr()
    real_open = os.open

    def read_only(path, *args, **kwargs):
        if ".write-probe" in str(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    monkeypatch.setattr("features.run.cached_mapper", lambda f: pytest.fail("the model was loaded"))
    assert cnn(data, out, "--block-size", "4") == 2
    err = one_line_error(capsys)
    assert "the feature store is not writable: read-only file system" in err and "nothing was computed" in err
    assert FeatureStore(out).blocks_done().tolist() == [True, False]


def test_full_disk_mid_run_says_what_is_kept(data, tmp_path, monkeypatch, capsys):
    import errno
    import os

    out = tmp_path / "s.zarr"
    real_write = FeatureStore.write_block

    def full(self, block, *args, **kwargs):
        if block == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(self, block, *args, **kwargs)

    monkeypatch.setattr(FeatureStore, "write_block", full)
    assert cnn(data, out) == 2
    err = one_line_error(capsys)
    assert "cannot write the feature store: no space left on the device" in err
    assert "4 of 8 images kept (2 of 4 blocks finished), the same command resumes" in err
    monkeypatch.undo()
    assert cnn(data, out) == 0
    assert "wrote 4 rows, skipped 4 already done" in capsys.readouterr().out


def test_only_the_gather_of_cancelled_blocks_is_silenced() -> None:
    """The scheduler's "Couldn't gather keys" of blocks an interrupted run cancelled (every key forgotten)
    is dropped, which once made the line below two lines under load; any other gather failure is shown."""
    import logging

    from features.executors.dask_cluster import _CancelledGatherFilter

    def record(states: object) -> logging.LogRecord:
        return logging.LogRecord("distributed.scheduler", logging.ERROR, __file__, 1,
                                 "Couldn't gather keys: %s", (states,), None)

    keep = _CancelledGatherFilter().filter
    assert not keep(record({"features-block-0-45d20396": "forgotten"}))
    assert keep(record({"features-block-0-45d20396": "memory", "features-block-1-45d20396": "forgotten"}))
    assert keep(record({"features-block-2-45d20396": "erred"})) and keep(record({}))
    assert keep(logging.LogRecord("distributed.scheduler", logging.ERROR, __file__, 1, "other %s",
                                  ({"k": "forgotten"},), None))


def test_ctrl_c_of_a_local_dask_run_is_one_line(data, tmp_path):
    """Ctrl-C reaches the whole process group (driver, nannies, workers): one line, no worker traceback,
    no distributed warnings, and the workers are stopped without their 4 s grace period."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("distributed")
    out = tmp_path / "s.zarr"
    cmd = [sys.executable, "-m", "features", "cnn", "--data", str(data), "--out", str(out), *BASE,
           "--block-size", "1", "--scheduler", "local", "--workers", "1", "--threads", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    flags = out / "blocks_done" / "c"
    deadline = time.monotonic() + 180
    while not (flags.is_dir() and any(flags.iterdir())):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("features: interrupted: "), err


def test_verify_refuses_a_store_rewritten_while_it_verified(fne_store, monkeypatch):
    from features.store import verify

    real = verify._check_store

    def rewritten_meanwhile(store, data):
        report = real(store, data)
        FeatureStore(fne_store, mode="r+").set_attrs(note="a writer came by")
        return report

    monkeypatch.setattr(verify, "_check_store", rewritten_meanwhile)
    with pytest.raises(UserError, match="rewritten while it was being verified"):
        verify.verify_store(fne_store)


def test_vanished_images_folder_stops_a_dask_run_too(coco_sample, tmp_path, capsys):
    pytest.importorskip("distributed")
    data, folder = two_folder_dataset(coco_sample, tmp_path)
    out = tmp_path / "s.zarr"
    folder.rename(tmp_path / "elsewhere")
    assert cnn(data, out, "--scheduler", "local", "--workers", "1", "--threads", "1") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the images folder looks unavailable" in err and "blocks finished)" in err
    assert not FeatureStore(out).block_failures()


@pytest.mark.parametrize("key,value,names", [
    ("resize", 10**6, "resize 1000000 is not a whole number from 0 to 4096"),
    ("resize", 100, "--resize 100: must be between 224"),
    ("input_size", 10**6, "input_size 1000000"),
    ("crops", "10", "crops '10' is not a whole number"),
    ("batch_size", 1.5, "batch_size 1.5"),
    ("seed", -1, "seed -1"),
    ("amp", "yes", "amp 'yes' is not true or false"),
    ("resize", 10**5000, "resize (an integer of 16610 bits)"),
], ids=["resize-1e6", "resize-below-crop", "input_size-1e6", "crops-string", "batch-float", "seed-negative",
        "amp-string", "resize-5000-digits"])
def test_a_recorded_extractor_configuration_is_checked_before_the_network_loads(monkeypatch, key, value,
                                                                                names):
    """A model folder's record of its store configures the featurizer: every number is bounded as the
    `features` options are, before the backbone is built or any image resized."""
    from features.extractors.crop_mapper import ImageMapper
    from features.extractors.grid_mapper import GridRegionMapper

    for module in ("features.extractors.crop_mapper", "features.extractors.grid_mapper"):
        monkeypatch.setattr(f"{module}.load_backbone", lambda *a, **k: pytest.fail("the network was built"))
    config = {"cnn": "vgg16", "weights": "none", "kind": "global", "input_size": 224, key: value}
    for mapper in (ImageMapper, GridRegionMapper):
        if mapper is GridRegionMapper and key in ("resize", "crops"):
            continue
        with pytest.raises(UserError, match=re.escape(names)):
            mapper.from_config(config)
