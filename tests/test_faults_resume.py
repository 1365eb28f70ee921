"""A training run stopped at any checkpoint write resumes to the files of a run never stopped (issue 29).

Every ``save_checkpoint`` of a 3-epoch ``train chain`` and a 3-epoch ``train classify`` run is a place where
the process may die: just before the write and just after its rename. The tests stop a run there (an
exception raised by a patched writer: deterministic, no timing), resume it with ``--resume``, and compare
``best.pt``, ``last.pt``, ``metrics.jsonl`` and ``eval/`` with those of a run that was never stopped, by
their contents (tensors, steps, epochs, histories), the timings aside. Validation is scripted (epoch 1
improves, epoch 2 does not, epoch 3 does), so both kinds of epoch end are covered whatever the kernels give.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import CLASSIFY_TINY, FullDisk, make_prepared, make_store

from train.cli import main as train_main
from train.engine import trainer
from train.run import checkpoint
from train.run.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: keys whose values are clock readings (left out of every comparison)
TIMINGS = {"time_s", "train_time_s", "val_time_s", "captions_per_s", "texts_per_s", "train_time"}
#: the scripted validation score of the epoch being ended (index: epochs completed before it)
SCORES = (10.0, 5.0, 20.0)
CHAIN_TINY = ["--p", "0.125", "--d", "32", "--batch-size", "4", "--seed", "3", "--device", "cpu"]


def scripted_validate(self: trainer.Trainer) -> tuple[float, dict[str, Any]]:
    return SCORES[self.epoch], {"scripted": SCORES[self.epoch]}


def assert_same(a: Any, b: Any, where: str, names: tuple[str, str] = ("", "")) -> None:
    """``a`` and ``b`` equal: tensors exactly, dictionaries key by key (timings aside), the rest by ``==``;
    ``names``: the two runs' folder names, which strings of ``a`` name as those of ``b``."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) - TIMINGS == set(b) - TIMINGS, where
        for key in set(a) - TIMINGS:
            assert_same(a[key], b[key], f"{where}.{key}", names)
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]", names)
    elif isinstance(a, str) and names[0]:
        assert a.replace(names[0], names[1]) == b, f"{where}: {a!r} != {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def run_files(run: Path) -> dict[str, Any]:
    """What a resumed run must end with: both checkpoints, the metrics records and every eval/ file."""
    files: dict[str, Any] = {}
    for name in ("best.pt", "last.pt"):
        path = run / "checkpoints" / name
        files[name] = load_checkpoint(path) if path.is_file() else None
    files["metrics.jsonl"] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    files["eval"] = {p.name: json.loads(p.read_text()) for p in sorted((run / "eval").glob("*.json"))}
    files["checkpoints/"] = sorted(p.name for p in (run / "checkpoints").iterdir())
    return files


@contextlib.contextmanager
def stopped_at(write: int | None, when: str = "after") -> Iterator[list[Path]]:
    """Count the checkpoint writes; raise ``KeyboardInterrupt`` just ``before`` or ``after`` write number
    ``write`` (None: never). Yields the paths written."""
    real, written = trainer.save_checkpoint, []

    def save(path: Path, state: dict[str, Any]) -> None:
        if len(written) + 1 == write and when == "before":
            raise KeyboardInterrupt
        real(path, state)
        written.append(Path(path))
        if len(written) == write and when == "after":
            raise KeyboardInterrupt

    trainer.save_checkpoint = save
    try:
        yield written
    finally:
        trainer.save_checkpoint = real


@pytest.fixture(scope="module")
def chain_inputs(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("chain")
    prepared = make_prepared(root / "prepared", n_train=40, n_val=8, n_test=8)
    store = make_store(root / "feats.zarr", prepared)
    return ["chain", "--data", str(prepared), "--features", f"{store}:global", *CHAIN_TINY,
            "--checkpoint-every", "20"]


@pytest.fixture(scope="module")
def classify_inputs(request: pytest.FixtureRequest) -> list[str]:
    """``train classify`` on the tiny prepared dataset of test_textcls (its fixture, imported here)."""
    prepared = request.getfixturevalue("textcls_prepared")
    return ["classify", "--data", str(prepared), *CLASSIFY_TINY, "--checkpoint-every", "4"]


def _stop_everywhere_then_resume(argv: list[str], tmp_path: Path, capsys, monkeypatch) -> None:
    from train.classification.fit import ClassificationTrainer

    monkeypatch.setattr(trainer.Trainer, "validate", scripted_validate)
    monkeypatch.setattr(ClassificationTrainer, "validate", scripted_validate)
    argv = [*argv, "--epochs", "3", "-q"]
    with stopped_at(None) as writes:
        assert train_main([*argv, "--out", str(tmp_path / "straight")]) == 0
    expected = run_files(tmp_path / "straight")
    assert [p.name for p in writes].count("best.pt") == 2 and len(writes) >= 7  # best in epochs 1 and 3
    assert expected["last.pt"]["finished"] and expected["last.pt"]["epoch"] == 3
    capsys.readouterr()
    for write in range(1, len(writes) + 1):
        for when in ("before", "after"):
            run = tmp_path / f"{when}-{write}"
            with stopped_at(write, when):
                assert train_main([*argv, "--out", str(run)]) == 130
            err = capsys.readouterr().err.strip()
            if write == 1 and when == "before":  # stopped before its first checkpoint
                assert err == "train: interrupted"
            else:
                assert err.startswith("train: interrupted (") and err.endswith(" kept: re-run with --resume)")
            assert train_main([argv[0], "--out", str(run), "--resume"]) == 0, (when, write)
            out = capsys.readouterr().out
            if write == 1 and when == "before":
                assert "no checkpoint yet (stopped before the first one), so starting from the first" in out
            assert_same(run_files(run), expected, f"{when} write {write} ({writes[write - 1].name})",
                        (run.name, "straight"))


def test_a_classification_stopped_in_its_final_evaluation_says_what_it_kept(classify_inputs, tmp_path, capsys,
                                                                            monkeypatch) -> None:
    """Ctrl-C after training, while the best checkpoint is scored on the test split: the one line names the
    epochs kept, as a stop during training does (it said only "interrupted")."""
    from train.classification import fit

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fit, "evaluate_run", interrupted)  # the test evaluation after training
    assert train_main([*classify_inputs, "--epochs", "2", "-q", "--out", str(tmp_path / "run")]) == 130
    assert capsys.readouterr().err.strip() == "train: interrupted (epoch 2 kept: re-run with --resume)"


def test_chain_stopped_at_every_checkpoint_write_resumes_to_the_same_files(chain_inputs, tmp_path, capsys,
                                                                            monkeypatch) -> None:
    _stop_everywhere_then_resume(chain_inputs, tmp_path, capsys, monkeypatch)


def test_classify_stopped_at_every_checkpoint_write_resumes_to_the_same_files(classify_inputs, tmp_path,
                                                                               capsys, monkeypatch) -> None:
    _stop_everywhere_then_resume(classify_inputs, tmp_path, capsys, monkeypatch)


def test_a_run_stopped_before_its_first_checkpoint_is_not_stuck(classify_inputs, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    with stopped_at(1, "before"):
        assert train_main([*classify_inputs, "--epochs", "1", "-q", "--out", str(run)]) == 130
    assert (run / "config.json").is_file() and not list((run / "checkpoints").glob("*.pt"))
    capsys.readouterr()
    assert train_main(["classify", "--out", str(run), "--resume"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "no checkpoint yet" in line]
    assert lines == [f"resuming {run}: no checkpoint yet (stopped before the first one), so starting from "
                     "the first step"]
    assert (run / "checkpoints" / "last.pt").is_file() and (run / "eval" / "test.json").is_file()


def _full_disk_after(monkeypatch, writes: int, room: int = 4096) -> None:
    """Checkpoint writes after the first ``writes`` find the disk full (``room`` bytes left)."""
    real, done = checkpoint.atomic_file, []

    @contextlib.contextmanager
    def atomic_file(path: Any, mode: str = "wb") -> Iterator[Any]:
        done.append(path)
        with real(path, mode) as fh:
            yield fh if len(done) <= writes else FullDisk(fh, room)

    monkeypatch.setattr(checkpoint, "atomic_file", atomic_file)


@pytest.mark.parametrize("room", [4096, 0])
def test_a_full_disk_during_torch_save_says_so(tmp_path, monkeypatch, room) -> None:
    path = tmp_path / "last.pt"
    checkpoint.save_checkpoint(path, {"model": {"w": torch.ones(2)}, "epoch": 1})
    _full_disk_after(monkeypatch, 0, room)
    with pytest.raises(checkpoint.UserError) as caught:
        checkpoint.save_checkpoint(path, {"model": {"w": torch.zeros(100_000)}, "epoch": 2})
    assert str(caught.value) == (f"{path}: could not write the checkpoint (no space left on the device: "
                                 "free space there (or write elsewhere) and run again); the previous "
                                 "checkpoint, if any, is unchanged")
    assert load_checkpoint(path)["epoch"] == 1 and [p.name for p in tmp_path.iterdir()] == ["last.pt"]


@pytest.mark.parametrize("task", ["classify", "chain"])
def test_a_full_disk_during_training_says_what_was_kept(task, classify_inputs, chain_inputs, tmp_path, capsys,
                                                         monkeypatch) -> None:
    argv = classify_inputs if task == "classify" else chain_inputs
    monkeypatch.setattr(trainer.Trainer, "validate", scripted_validate)
    from train.classification.fit import ClassificationTrainer

    monkeypatch.setattr(ClassificationTrainer, "validate", scripted_validate)
    _full_disk_after(monkeypatch, 3)  # epoch 1's mid-epoch last.pt, best.pt and last.pt are written
    run = tmp_path / "run"
    assert train_main([*argv, "--epochs", "3", "-q", "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"train: error: {run / 'checkpoints' / 'last.pt'}: could not write the checkpoint (no "
                   "space left on the device: free space there (or write elsewhere) and run again); the "
                   "previous checkpoint, if any, is unchanged (epoch 1 kept: re-run with --resume)")
    monkeypatch.undo()  # the disk has room again
    monkeypatch.setattr(trainer.Trainer, "validate", scripted_validate)
    monkeypatch.setattr(ClassificationTrainer, "validate", scripted_validate)
    assert train_main([task, "--out", str(run), "--resume", "-q"]) == 0
    assert load_checkpoint(run / "checkpoints" / "last.pt")["finished"]


# -- features recompress killed or interrupted at every boundary (issue 41, item 9) ------------------------
ROOT = Path(__file__).resolve().parents[1]

#: a child process per boundary (forked from one driver, which imports the toolkit once): run the command
#: with every write step counted (each StoreArray write, attribute update, and the new store's temporary
#: folder made and about to be renamed) and SIGKILL itself before step K; K = 0 counts the steps into a file
KILL_DRIVER = r'''
import contextlib, os, signal, sys
import features.store.core as store
from features.cli import main
from features.store.array import StoreArray

source, base = sys.argv[1:]
real_set, real_attrs = StoreArray.__setitem__, store.FeatureStore._update_attrs
real_dir = store.atomic_directory

def run(kill_at):
    seen = [0]
    def step():
        seen[0] += 1
        if seen[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    def setitem(self, key, value):
        step(); real_set(self, key, value)
    def update(self, values):
        step(); real_attrs(self, values)
    @contextlib.contextmanager
    def directory(final, overwrite=True):
        with real_dir(final, overwrite) as tmp:
            step()  # the temporary folder exists, empty
            yield tmp
            step()  # the new store is whole in it, not yet renamed into place
    StoreArray.__setitem__, store.FeatureStore._update_attrs = setitem, update
    store.atomic_directory = directory
    code = main(["recompress", source, "--codec", "lz4", "--out", f"{base}-{kill_at}", "-q"])
    if kill_at == 0:
        with open(f"{base}.steps", "w") as f:
            f.write(str(seen[0]))
    return code

def child(kill_at):
    pid = os.fork()
    if pid == 0:
        os._exit(run(kill_at))
    return os.waitpid(pid, 0)[1]

assert os.waitstatus_to_exitcode(child(0)) == 0
steps = int(open(f"{base}.steps").read())
for k in range(1, steps + 1):
    status = os.waitstatus_to_exitcode(child(k))
    assert status == -signal.SIGKILL, (k, status)
print(steps)
'''


def _region_store(path: Path, rows: int = 20, block: int = 10) -> Path:
    """A finished zstd region store of 32 KiB rows (one inner chunk per row), ``rows // block`` blocks."""
    from features.store.core import FeatureStore

    store = FeatureStore.create(path, np.arange(rows), {"regions": (2, 4096)}, block,
                                config={"kind": "regions"}, provenance={"network": "random"})
    rng = np.random.default_rng(7)
    for b in range(store.n_blocks):
        start, stop = store.block_rows(b)
        store.write_block(b, {"regions": rng.standard_normal((stop - start, 2, 4096)).astype(np.float32)},
                          np.ones(stop - start, bool), [])
    store.set_attrs(complete=True)
    return path


def _store_contents(path: Path) -> dict[str, Any]:
    """A store's record (its generation aside) and every array's values, as comparable Python objects."""
    from features.store.core import FeatureStore

    store = FeatureStore(path)
    contents: dict[str, Any] = {"attrs": {k: v for k, v in store.attrs.items() if k != "generation"}}
    for name in ("imgid", "valid", "failures", "blocks_done", "regions"):
        values = np.asarray(store.array(name)[:])
        contents[name] = values.tolist() if values.dtype.kind in "OUT" else values.tobytes()
    return contents


def _beside(out: Path) -> list[str]:
    """What lies beside the store ``out`` in its folder: its lock, temporaries and half-built copies."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def test_recompress_killed_at_every_boundary_then_rerun_is_the_uninterrupted_copy(tmp_path, capsys) -> None:
    """SIGKILL before every write step of `features recompress` (the new copy's temporary folder made, whole
    but not renamed, each array write, each record update), then the same command again: the copy is the
    uninterrupted one, and nothing is left beside it (a copy killed while created left its
    `.NAME.zarr.XXXXXXXX.partial`, which neither the re-run nor --overwrite removed)."""
    from features.cli import main

    source = _region_store(tmp_path / "z.zarr")
    base = tmp_path / "l.zarr"
    done = subprocess.run([sys.executable, "-c", KILL_DRIVER, str(source), str(base)], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = int(done.stdout.split()[-1])
    assert steps >= 10  # two in the creation, four writes per block, the final record
    expected = _store_contents(Path(f"{base}-0"))
    partials = 0
    for k in range(1, steps + 1):
        out = Path(f"{base}-{k}")
        partials += any(name.endswith(".partial") for name in _beside(out))
        capsys.readouterr()
        assert main(["recompress", str(source), "--codec", "lz4", "--out", str(out)]) == 0, k
        assert _store_contents(out) == expected, f"killed before step {k}"
        assert _beside(out) == [], (k, _beside(out))
    assert partials == 2  # the two kills inside the creation left a half-built copy, now removed


#: `features recompress` with a Ctrl-C sent at its K-th file write (Zarr's store `set`), which then waits
#: 2 s in Zarr's event loop: the command's wait for that write ends, the write does not
SIGINT_DRIVER = r'''
import asyncio, os, signal, sys
from zarr.storage import LocalStore
at, calls, real = int(sys.argv[1]), [0], LocalStore.set
async def set_(self, key, value):
    calls[0] += 1
    if calls[0] == at:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(2)
    return await real(self, key, value)
LocalStore.set = set_
from features.entry import main
sys.exit(main(sys.argv[2:]))
'''


@pytest.mark.parametrize("at, copying", [(3, False), (24, True), (28, True)],
                         ids=["creating the copy", "copying block 0", "copying block 1"])
def test_recompress_interrupted_mid_write_says_one_line(tmp_path, at, copying) -> None:
    """Ctrl-C while Zarr writes (the new copy's creation, then a block's rows): exactly one line, status
    130, and no half-built copy beside it. Zarr's coroutine went on after the interrupt and printed
    "Task was destroyed but it is pending!" and "cannot schedule new futures after shutdown" (30 to 76
    lines in 3 of 14 manual trials; 7 to 223 lines here), and a write into the new copy's temporary folder
    made it again after it was removed. The same command then finishes the copy."""
    from features.cli import main

    source, out = _region_store(tmp_path / "z.zarr", rows=30), tmp_path / "l.zarr"
    argv = ["recompress", str(source), "--codec", "lz4", "--out", str(out)]
    done = subprocess.run([sys.executable, "-c", SIGINT_DRIVER, str(at), *argv], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 130 and len(lines) == 1, done.stderr[-3000:]
    if copying:
        assert lines[0].startswith("features: interrupted: ") and lines[0].endswith(
            " blocks kept, re-run the same command to resume"), lines
    else:
        assert lines == ["features: interrupted"]
    assert [n for n in _beside(out) if n.endswith(".partial")] == []
    assert main(argv) == 0
    assert _store_contents(out)["regions"] == _store_contents(source)["regions"]
