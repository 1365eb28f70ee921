"""The one owner of a run directory's layout: its file names, its marker, and what train may replace.

A run directory holds::

    .vse-run               the marker (vsecore.outputs.RUN_MARKER), written with config.json when a run starts
    config.json            resolved settings, sizes, fingerprints of the inputs, code version
    checkpoints/best.pt    the best validation rsum so far (complete training state)
    checkpoints/last.pt    the newest state: end of an epoch, or mid-epoch every checkpoint_every steps
    metrics.jsonl          one JSON object per finished epoch
    curves.png, train.log, tensorboard/
    eval/                  test.json after training; train evaluate's <split>_<checkpoint>[_<lang>].json,
                           noise_<split>.json/.png and length_<split>.json; train compare's
                           compare_test.json
    eval.stage.json        the evaluate stage's state of ``train pipeline``

:class:`RunDir` names these paths (no other module spells them, but for the four a run is recognised
by, ``config.json``, ``checkpoints/``, ``best.pt`` and ``last.pt``, which it takes from
:mod:`vsecore.outputs`: the output rules of every stage need them), recognises a run
(:func:`vsecore.outputs.is_run_folder`: the marker, or for runs written before it existed,
``config.json`` beside a ``checkpoints/`` folder holding only checkpoints), lists the entries train
did not write, and applies the ``--out`` rule of a training run (:meth:`RunDir.prepare`) and of a
command writing into a run's ``eval/`` (:meth:`RunDir.check_eval_output`). ``docs/safety.md`` states
the rules.

A run starts in one step (:meth:`RunDir.write_config`): its marker and ``config.json`` are made in a
hidden sibling folder and renamed to ``--out``, so a run killed at any instant leaves either no run (no
folder, or the empty one it was given) or a run with both; never a marker without ``config.json``,
which ``--resume`` could not continue (it takes the run's settings from that file).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vsecore.errors import UserError
from vsecore.io import MAX_TEXT_BYTES, write_json_atomic
from vsecore.jsonfile import parse_json
from vsecore.lines import open_lines
from vsecore.outputs import (
    RUN,
    RUN_BEST,
    RUN_CHECKPOINT_FILES,
    RUN_CHECKPOINTS,
    RUN_CONFIG,
    RUN_LAST,
    RUN_MARKER,
    check_not_input,
    check_output_file,
    enclosing_artifact,
    foreign_files,
    is_run_folder,
    is_written_file,
)

#: the names a run is recognised by are vsecore.outputs' (its output rules need them)
CONFIG, CHECKPOINTS, BEST, LAST = RUN_CONFIG, RUN_CHECKPOINTS, RUN_BEST, RUN_LAST
METRICS = "metrics.jsonl"
CURVES = "curves.png"
TENSORBOARD = "tensorboard"
TRAIN_LOG = "train.log"
EVAL = "eval"
TEST_EVAL = "test.json"
#: what ``train compare`` read of the run, with the identity of the checkpoint it was computed from
COMPARE_EVAL = "compare_test.json"
#: the evaluate stage's state file of ``train pipeline`` (``<run>/eval`` + ``.stage.json``)
EVAL_STAGE = "eval.stage.json"

#: what resumes a stopped ``train <family>`` or ``train classify`` run (:meth:`RunDir.kept`)
RESUME_ADVICE = "re-run with --resume"

#: top-level files train writes into a run directory
_TOP_FILES = frozenset({RUN_MARKER, CONFIG, METRICS, CURVES, TRAIN_LOG, EVAL_STAGE})
_CHECKPOINT_FILES = RUN_CHECKPOINT_FILES
#: files of ``eval/``: the test evaluation after training and ``train evaluate``'s default outputs
_EVAL_FILE = re.compile(r"test\.json|compare_test\.json|(train|val|test)_(best|last)(_[\w.-]+)?\.json"
                        r"|noise_(train|val|test)\.(json|png)|length_(train|val|test)\.json")
_TENSORBOARD_FILE = re.compile(r"events\.out\.tfevents\..+")
#: the text of the marker
_MARKER_TEXT = "a run directory written by `train`: --overwrite replaces only the files train writes here\n"
#: the hidden sibling a run's first files are made in (:meth:`RunDir.write_config`): ``.<name>.start-<pid>``
_STARTING = re.compile(r"\.(?P<name>.+)\.start-\d+")
#: what that folder holds: the marker, config.json, or config.json's temporary (killed while writing it)
_STARTED_FILE = re.compile(rf"{re.escape(RUN_MARKER)}|{re.escape(CONFIG)}|\.{re.escape(CONFIG)}\..+\.tmp")


def evaluation_name(split: str, checkpoint: str, lang: str | None = None) -> str:
    """``train evaluate``'s results of ``split`` with ``checkpoint``:
    ``<split>_<checkpoint>[_<lang>].json``."""
    return f"{split}_{checkpoint}_{lang}.json" if lang else f"{split}_{checkpoint}.json"


def noise_name(split: str, suffix: str = "json") -> str:
    """The noise analysis of ``split``: ``noise_<split>.json`` (its figure: ``suffix="png"``)."""
    return f"noise_{split}.{suffix}"


def length_name(split: str) -> str:
    """The text-length analysis of ``split``: ``length_<split>.json``."""
    return f"length_{split}.json"


def is_eval_file(name: str) -> bool:
    """Whether ``name`` is a file train writes into a run's ``eval/`` folder (see the module doc)."""
    return _EVAL_FILE.fullmatch(name) is not None


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


@dataclass(frozen=True)
class RunDir:
    """A run directory: its paths, whether it holds a run, and what train may replace in it."""

    path: Path

    def __init__(self, path: str | os.PathLike) -> None:
        object.__setattr__(self, "path", Path(path))

    # -- the layout ---------------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        """``config.json``."""
        return self.path / CONFIG

    @property
    def marker(self) -> Path:
        """The marker :data:`vsecore.outputs.RUN_MARKER`."""
        return self.path / RUN_MARKER

    @property
    def checkpoints(self) -> Path:
        """The ``checkpoints/`` folder."""
        return self.path / CHECKPOINTS

    def checkpoint(self, which: str) -> Path:
        """``checkpoints/best.pt`` or ``checkpoints/last.pt`` (``which``: best, last or the file name; a
        :class:`UserError` for another)."""
        name = which if which.endswith(".pt") else f"{which}.pt"
        if name not in _CHECKPOINT_FILES:
            raise UserError(f"unknown checkpoint '{which}' (expected best or last)")
        return self.checkpoints / name

    @property
    def best(self) -> Path:
        """``checkpoints/best.pt``."""
        return self.checkpoints / BEST

    @property
    def last(self) -> Path:
        """``checkpoints/last.pt``."""
        return self.checkpoints / LAST

    @property
    def metrics(self) -> Path:
        """``metrics.jsonl``."""
        return self.path / METRICS

    @property
    def curves(self) -> Path:
        """``curves.png``."""
        return self.path / CURVES

    @property
    def tensorboard(self) -> Path:
        """``tensorboard/``."""
        return self.path / TENSORBOARD

    @property
    def log(self) -> Path:
        """``train.log``."""
        return self.path / TRAIN_LOG

    @property
    def eval_dir(self) -> Path:
        """``eval/``."""
        return self.path / EVAL

    @property
    def test_eval(self) -> Path:
        """``eval/test.json``, the test evaluation written after training."""
        return self.eval_dir / TEST_EVAL

    # -- what is there ------------------------------------------------------------------------------
    def is_run(self) -> bool:
        """Whether the folder holds a run: the marker, or (runs written before it) ``config.json``
        beside a ``checkpoints/`` folder holding only files train writes."""
        return is_run_folder(self.path)

    def holds_run(self) -> bool:
        """Whether a run was started here (its ``config.json``, a checkpoint or a metrics record): starting
        over then needs ``--overwrite`` (``train <family>`` and ``train pipeline`` alike)."""
        return (self.config.is_file() or self.metrics.is_file()
                or any(self.checkpoint(n).is_file() for n in _CHECKPOINT_FILES))

    def foreign_entries(self) -> list[str]:
        """Entries train did not write (relative names, sorted): ``--overwrite`` refuses a run holding any."""
        if not self.path.is_dir():
            return []
        foreign = []
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            name = entry.name
            if entry.is_dir(follow_symlinks=False) and name in (CHECKPOINTS, EVAL, TENSORBOARD):
                written = {CHECKPOINTS: _CHECKPOINT_FILES, EVAL: _EVAL_FILE,
                           TENSORBOARD: _TENSORBOARD_FILE}[name]
                foreign += [f"{name}/{n}" for n in foreign_files(self.path / name, written)]
            elif not is_written_file(entry, _TOP_FILES):
                foreign.append(name)
        return foreign

    def kept(self, advice: str = RESUME_ADVICE) -> str | None:
        """What a stopped training run keeps, for :func:`vsecore.errors.resume_hint`, e.g. ``epoch 3 kept:
        re-run with --resume`` (``advice``: what resumes it); None without a checkpoint."""
        if not (self.last.is_file() or self.best.is_file()):
            return None
        try:
            epochs = self._epochs_recorded()
        except UserError:  # unreadable: the hint still names the checkpoint
            epochs = 0
        where = f"epoch {epochs}" if epochs else "a checkpoint of epoch 1"
        return f"{where} kept: {advice}"

    def _epochs_recorded(self) -> int:
        """The epoch records of ``metrics.jsonl`` (none without it), read a line at a time with the bounds of
        every line-oriented input (:func:`vsecore.lines.open_lines`); a line that is not JSON is a
        :class:`UserError`."""
        if not self.metrics.is_file():
            return 0
        with open_lines(self.metrics, "a run's metrics.jsonl", most=MAX_TEXT_BYTES) as lines:
            return sum(1 for n, line in enumerate(lines, 1) if line.strip()
                       and parse_json(line, f"{self.metrics}: line {n}") is not None)

    # -- the rules ----------------------------------------------------------------------------------
    def check(self, resume: bool, overwrite: bool, inputs: Iterable[str | os.PathLike | None] = ()) -> None:
        """Check ``--out`` before a run starts (or resumes), changing nothing (see :meth:`prepare`).

        Refused with one line: ``/``, a file, an input of the run, a folder inside (or being) a prepared
        dataset, feature store or another run, a folder holding files train did not write, a run
        without ``--resume``/``--overwrite``, and ``--resume`` where there is no run.
        """
        path, out = self.path, _resolved(self.path)
        if out == Path(out.anchor):
            raise UserError(f"--out {path}: is the file system root; give the run a folder of its own")
        if (path.exists() or path.is_symlink()) and not path.is_dir():
            raise UserError(f"--out {path}: exists and is not a folder; give a new or empty folder")
        check_not_input(path, inputs)
        found = enclosing_artifact(out)
        if found is not None and not (found[0] == out and found[1] == RUN):
            folder, kind = found
            where = f"is a {kind}" if folder == out else f"lies inside the {kind} {folder}"
            raise UserError(f"--out {path}: {where}; give the run a new or empty folder")
        if resume:
            if not self.is_run():
                raise UserError(f"no run at {path} to resume (no {RUN_MARKER}, or {CONFIG} beside "
                                f"{CHECKPOINTS}/); drop --resume to start one")
            if not (self.last.is_file() or self.best.is_file() or self.config.is_file()):
                # without config.json the plain command starts it (holds_run is False): no loop of refusals
                raise UserError(f"{path}: nothing to resume (no {CHECKPOINTS}/{LAST}, {BEST} or {CONFIG}); "
                                "drop --resume to start")
            return  # a run stopped before its first checkpoint starts from the first step (the trainer)
        if not (path.is_dir() and any(path.iterdir())):
            return
        foreign = self.foreign_entries()
        if not self.is_run():
            first = (foreign or sorted(p.name for p in path.iterdir()))[0]
            raise UserError(f"--out {path}: not a run directory and holds a file train did not write: "
                            f"{first}; give --out a new or empty folder")
        if self.holds_run() and not overwrite:
            raise UserError(f"--out {path}: already holds a run ({self._describe()}); use --resume to "
                            "continue it or --overwrite to start over")
        if foreign:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            raise UserError(f"--out {path}: holds a file train did not write: {foreign[0]}{more}; "
                            "move it away or give another --out (--overwrite replaces only a whole run)")

    def prepare(self, resume: bool, overwrite: bool, inputs: Iterable[str | os.PathLike | None] = ()) -> None:
        """:meth:`check`, then for a run that resumes write the marker (a run from before markers gets one);
        for a new one remove what an old run wrote (``--overwrite``: its marker too) and nothing else, and
        write nothing: the run starts when :meth:`write_config` writes its marker and ``config.json`` in one
        step. Call it holding the run directory's lock."""
        self.check(resume, overwrite, inputs)
        if resume:
            self.mark()
            return
        if self.path.is_dir():
            self.clear()
        self._remove_starts()

    def _describe(self) -> str:
        there = [f"{CHECKPOINTS}/{n}" for n in (LAST, BEST) if self.checkpoint(n).is_file()]
        there += [p.name for p in (self.metrics, self.config) if p.is_file()]
        return ", ".join(there)

    def mark(self) -> None:
        """Write the marker (a run written before markers existed gets one when it resumes)."""
        if not self.marker.is_file():
            self.marker.write_text(_MARKER_TEXT, encoding="utf-8")

    def has_started(self) -> bool:
        """Whether the run has started: its marker is there (then ``train.log`` and the checkpoints may be
        written)."""
        return self.marker.is_file()

    def write_config(self, config: dict[str, Any]) -> None:
        """Write ``config.json`` atomically; the first write starts the run (:meth:`has_started`).

        A run starts in one step: the marker and ``config.json`` are written into the hidden sibling
        ``.<name>.start-<pid>``, which is then renamed to the run's folder (over the empty one
        :meth:`prepare` left, if any), so no instant shows the marker without ``config.json``. A folder
        that cannot be replaced so (a mount point, the working directory) gets both in place, marker first.
        """
        if self.has_started():
            write_json_atomic(self.config, config)
            return
        target = _resolved(self.path)
        staging = target.with_name(f".{target.name}.start-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            (staging / RUN_MARKER).write_text(_MARKER_TEXT, encoding="utf-8")
            write_json_atomic(staging / CONFIG, config)
            if not _replaceable(target) or not _renamed(staging, target):
                self.path.mkdir(parents=True, exist_ok=True)
                self.mark()
                write_json_atomic(self.config, config)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _remove_starts(self) -> None:
        """Remove the ``.<name>.start-<pid>`` siblings of starts killed before their rename (the lock held:
        no other start of this run is under way); only those holding nothing but the marker and config.json
        (or its temporary)."""
        target = _resolved(self.path)
        with contextlib.suppress(OSError):
            for entry in os.scandir(target.parent):
                found = _STARTING.fullmatch(entry.name)
                if (found and found["name"] == target.name and entry.is_dir(follow_symlinks=False)
                        and all(_STARTED_FILE.fullmatch(e.name) for e in os.scandir(entry.path))):
                    shutil.rmtree(entry.path, ignore_errors=True)

    def clear(self) -> None:
        """Remove the files train writes, the marker included (the new run writes its own when it starts),
        and the folders they leave empty; keep everything else."""
        for name, written in ((CHECKPOINTS, _CHECKPOINT_FILES), (EVAL, _EVAL_FILE),
                              (TENSORBOARD, _TENSORBOARD_FILE)):
            folder = self.path / name
            if not folder.is_dir() or folder.is_symlink():
                continue
            for entry in os.scandir(folder):
                if is_written_file(entry, written):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
            with contextlib.suppress(OSError):
                folder.rmdir()
        # the marker goes last: a folder cleared half-way is still the run train may clear again
        written = [e.path for e in os.scandir(self.path) if is_written_file(e, _TOP_FILES)]
        for path in sorted(written, key=lambda p: os.path.basename(p) == RUN_MARKER):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def check_eval_output(self, path: str | os.PathLike, *, option: str, overwrite: bool,
                          inputs: Iterable[str | os.PathLike | None] = (), default: bool = False) -> Path:
        """Check a file a reader of this run writes (``--json``, ``--ranks``, ``--gallery``, its outputs).

        Inside the run, only its ``eval/`` folder may be written, where a ``default`` output (one the
        command names itself, e.g. ``eval/test_best.json``) of a name train writes there
        (:func:`is_eval_file`) is replaced without ``overwrite``: a re-evaluation replaces its own
        results. Elsewhere the rules of :func:`vsecore.outputs.check_output_file` apply. The run's
        ``config.json`` and checkpoints are inputs in any case.
        """
        out, root = _resolved(path), _resolved(self.path)
        inputs = [*inputs, self.config, self.checkpoints]
        if out == root or root in out.parents:
            if not (out.parent == _resolved(self.eval_dir)):
                check_not_input(path, inputs, option)
                raise UserError(f"{option} {path}: lies inside the run directory {self.path} but not in its "
                                f"{EVAL}/ folder; write it to {self.eval_dir} or elsewhere")
            own = default and is_eval_file(out.name)
            return check_output_file(path, inputs=inputs, overwrite=overwrite or own, owner=self.path,
                                     option=option)
        return check_output_file(path, inputs=inputs, overwrite=overwrite, option=option)


def _replaceable(target: Path) -> bool:
    """Whether the folder a run starts in may be replaced by a rename: absent, or an empty folder that is
    not this process's working directory (nor above it) and not a mount point."""
    if not target.exists():
        return True
    cwd = _resolved(os.getcwd())
    return (target.is_dir() and not target.is_symlink() and not any(target.iterdir())
            and target != cwd and target not in cwd.parents and not os.path.ismount(target))


def _renamed(staging: Path, target: Path) -> bool:
    """Rename ``staging`` to ``target`` (replacing an empty folder, whose permissions the new one keeps);
    False where the file system refuses (the caller then writes in place)."""
    with contextlib.suppress(OSError):
        if target.is_dir():
            os.chmod(staging, stat.S_IMODE(target.stat().st_mode))
    try:
        os.rename(staging, target)
    except OSError:
        return False
    return True
