"""``train classify`` killed at every boundary resumes to the files of a run never stopped (issue 41, item 9).

A driver process imports the toolkit once and forks one child per boundary: the child runs ``train classify``
with every rename into the run counted (the start, which renames the run's marker and ``config.json`` into
place in one step, each checkpoint, ``metrics.jsonl``, ``curves.png``, ``eval/test.json``) and SIGKILLs
itself just before rename K (its temporary file complete beside it) or after the last one. Each stopped run
is then continued with ``--resume`` (or, stopped before it started, started again by the same command) and
compared with the uninterrupted run: ``best.pt`` and ``last.pt`` entry by entry (tensors, steps, histories
and every random generator state, Python's included), ``metrics.jsonl``, ``eval/`` and the files left.
Validation is scripted (epoch 1 improves, epoch 2 does not), so both kinds of epoch end are covered.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import CLASSIFY_TINY

from train.classification.fit import ClassificationTrainer
from train.cli import main as train_main
from train.engine import trainer
from train.run.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
#: keys whose values are clock readings (left out of every comparison)
TIMINGS = {"time_s", "train_time_s", "val_time_s", "texts_per_s", "captions_per_s", "train_time"}
#: the scripted validation accuracy of the epoch being ended (index: epochs completed before it)
SCORES = (10.0, 5.0)
ARGS = [*CLASSIFY_TINY, "--checkpoint-every", "4", "--epochs", "2", "-q"]

#: forks a child per boundary K (argv: data, the folder of the runs, the train options as JSON): K = 0 runs
#: the uninterrupted run and writes the number of renames into the runs' folder to ``steps``; K > 0 SIGKILLs
#: the child just before rename K, and K = -1 just after the last one
KILL_DRIVER = r'''
import json, os, signal, sys
from train.classification.fit import ClassificationTrainer
from train.cli import main

data, runs, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
SCORES = (10.0, 5.0)
ClassificationTrainer.validate = lambda self: (SCORES[self.epoch], {"scripted": SCORES[self.epoch]})
real = {"replace": os.replace, "rename": os.rename}

def run(kill_at, last):
    import torch
    torch.set_num_threads(1)
    seen = [0]
    def counted(name):
        def move(src, dst, **kw):
            ours = os.fspath(dst).startswith(runs)
            if ours:
                seen[0] += 1
                if seen[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            real[name](src, dst, **kw)
            if ours and kill_at == -1 and seen[0] == last:
                os.kill(os.getpid(), signal.SIGKILL)
        return move
    os.replace, os.rename = counted("replace"), counted("rename")
    code = main(["classify", "--data", data, *args, "--out", os.path.join(runs, f"k{kill_at}")])
    if kill_at == 0:
        with open(os.path.join(runs, "steps"), "w") as fh:
            fh.write(str(seen[0]))
    return code

def child(kill_at, last=0):
    pid = os.fork()
    if pid == 0:
        os._exit(run(kill_at, last))
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

assert child(0) == 0
steps = int(open(os.path.join(runs, "steps")).read())
for k in [*range(1, steps + 1), -1]:
    assert child(k, steps) == -signal.SIGKILL, k
print(steps)
'''


def scripted_validate(self: trainer.Trainer) -> tuple[float, dict[str, Any]]:
    return SCORES[self.epoch], {"scripted": SCORES[self.epoch]}


def assert_same(a: Any, b: Any, where: str, names: tuple[str, str]) -> None:
    """``a`` and ``b`` equal: tensors exactly, dictionaries key by key (timings aside), the rest by ``==``;
    strings of ``a`` naming its run (``names[0]``) as those of ``b`` name theirs."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) - TIMINGS == set(b) - TIMINGS, where
        for key in sorted(set(a) - TIMINGS, key=str):
            assert_same(a[key], b[key], f"{where}.{key}", names)
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]", names)
    elif isinstance(a, str):
        assert a.replace(names[0], names[1]) == b, f"{where}: {a!r} != {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def run_files(run: Path) -> dict[str, Any]:
    """What a resumed run must end with: both checkpoints (random states included), the metrics records,
    every eval/ file and the names of every file in the run (train.log's lines differ by their times)."""
    files: dict[str, Any] = {"files": sorted(str(p.relative_to(run)) for p in run.rglob("*"))}
    for name in ("best.pt", "last.pt"):
        files[name] = load_checkpoint(run / "checkpoints" / name)
    files["metrics.jsonl"] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    files["eval"] = {p.name: json.loads(p.read_text()) for p in sorted((run / "eval").glob("*.json"))}
    return files


def beside(run: Path) -> list[str]:
    """The hidden siblings of ``run`` other than its lock: a killed start's folder, temporaries."""
    return sorted(p.name for p in run.parent.iterdir()
                  if p.name.startswith(f".{run.name}.") and not p.name.endswith(".lock"))


def test_classify_killed_at_every_boundary_resumes_to_the_uninterrupted_run(textcls_prepared, tmp_path,
                                                                             capsys, monkeypatch) -> None:
    """SIGKILL before each rename into the run and after the last: ``--resume`` then ends with the files of
    the run never stopped, random states included. Killed before the run started (its marker and
    config.json appear together, in one rename), there is no run: ``--resume`` says so and the same command
    starts it (before, a kill between the marker and config.json left a folder --resume refused: "nothing to
    resume")."""
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", KILL_DRIVER, str(textcls_prepared), str(runs),
                           json.dumps(ARGS)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = int(proc.stdout.split()[-1])
    expected = run_files(runs / "k0")
    monkeypatch.setattr(ClassificationTrainer, "validate", scripted_validate)
    capsys.readouterr()
    not_started = []
    for k in [*range(1, steps + 1), -1]:
        run = runs / f"k{k}"
        if not (run / "config.json").is_file():  # killed before the run started: no run, not even its folder
            assert not run.exists(), f"killed at {k}: {sorted(p.name for p in run.iterdir())}"
            assert train_main(["classify", "--out", str(run), "--resume", "-q"]) == 2
            err = capsys.readouterr().err.strip()
            assert err == (f"train: error: no run at {run} to resume (no .vse-run, or config.json beside "
                           "checkpoints/); drop --resume to start one"), (k, err)
            assert train_main(["classify", "--data", str(textcls_prepared), *ARGS, "--out", str(run)]) == 0
            not_started.append(k)
        else:
            assert train_main(["classify", "--out", str(run), "--resume", "-q"]) == 0, capsys.readouterr().err
        assert_same(run_files(run), expected, f"killed at {k}", (run.name, "k0"))
        assert beside(run) == [], k
    # config.json made in the start's folder, the start, 5 checkpoints (mid-epoch, best and last of epoch 1,
    # mid-epoch and last of epoch 2), metrics.jsonl and curves.png twice, eval/test.json
    assert steps == 12 and not_started == [1, 2]


@contextlib.contextmanager
def stopped_after(write: int | None) -> Iterator[None]:
    """Ctrl-C right after checkpoint write number ``write`` (None: never)."""
    real, written = trainer.save_checkpoint, []

    def save(path: Path, state: dict[str, Any]) -> None:
        real(path, state)
        written.append(path)
        if len(written) == write:
            raise KeyboardInterrupt

    trainer.save_checkpoint = save
    try:
        yield
    finally:
        trainer.save_checkpoint = real


@pytest.mark.parametrize("drawer", ["curves", "first validation"])
def test_a_library_drawing_from_pythons_random_leaves_a_resumed_run_equal(drawer, textcls_prepared, tmp_path,
                                                                         capsys, monkeypatch) -> None:
    """A library that draws from Python's global generator outside the training steps (here each time the
    curves are drawn, or on its first use in a process: the first validation of a command) moved the state
    that the checkpoints record, and a resumed run, which draws its curves once more on resuming and makes
    its first use of the library at another point, ended with another Python state in ``last.pt`` than the
    run never stopped (tensors and metrics equal). The trainer now keeps the global generators over
    everything that is no training step, and puts the checkpoint's states back when its first step runs."""
    if drawer == "curves":
        real_plot = trainer.plot_training_curves

        def plot(*args: Any, **kwargs: Any) -> Any:
            random.random()
            return real_plot(*args, **kwargs)

        monkeypatch.setattr(trainer, "plot_training_curves", plot)
        monkeypatch.setattr(ClassificationTrainer, "validate", scripted_validate)
    else:
        def validate(self: trainer.Trainer) -> tuple[float, dict[str, Any]]:
            if not getattr(self, "library_ready", False):  # a new command: a new process's first use
                random.random()
                self.library_ready = True
            return scripted_validate(self)

        monkeypatch.setattr(ClassificationTrainer, "validate", validate)
    argv = ["classify", "--data", str(textcls_prepared), *ARGS]
    assert train_main([*argv, "--out", str(tmp_path / "straight")]) == 0
    expected = run_files(tmp_path / "straight")
    for write in range(1, 6):  # mid-epoch, best and last of epoch 1, mid-epoch and last of epoch 2
        run = tmp_path / f"stopped-{write}"
        with stopped_after(write):
            assert train_main([*argv, "--out", str(run)]) == 130
        assert train_main(["classify", "--out", str(run), "--resume", "-q"]) == 0
        assert_same(run_files(run), expected, f"stopped after write {write}", (run.name, "straight"))
    capsys.readouterr()
