"""``train pipeline NAME``: run a named pipeline's stages in order, skipping those up to date.

Each stage's *fingerprint* is the SHA-256 of its resolved settings and of the fingerprint of the
stage before it, so changing an option re-runs that stage and every later one. The prep stage's
fingerprint also covers its inputs: the SHA-256 of every input file, as ``prep.json`` records
them, so an edited caption file re-runs prep and everything after it. The runner keeps a small
state file next to each stage's output (``<out>.stage.json``) holding the fingerprint and whether
the stage finished:

- same fingerprint and finished, output present (and, for prep, every recorded input still the
  same size and SHA-256): skipped;
- same fingerprint but unfinished (the run was killed): resumed (feature blocks already done and
  the last training checkpoint are kept);
- otherwise the stage runs again, and never throws away expensive work without ``--overwrite``:
  prep replaces its own prepared dataset (cheap; a folder prep did not write is never replaced);
  features resume a store made with the same configuration and refuse one made with another;
  train refuses a run directory that already holds a run (a checkpoint or metrics): give
  ``train.out`` a new run folder, or pass ``--overwrite`` to replace it; ``--overwrite`` removes
  only what the run wrote, and a folder holding anything else (or a dataset, a store, ``/``) is
  refused as ``train --out`` refuses it (:class:`train.run.layout.RunDir`).

``--force`` treats every stage as out of date; it implies nothing destructive: prep is re-run,
a feature store of the same configuration is resumed (only missing blocks are computed), and a
finished training run is replaced only with ``--overwrite`` as well.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.schema import Pipeline, get_pipeline, load_pipelines
from prep.dataset import RECORD_FILE, changed_inputs
from train.run.layout import RunDir
from vsecore import console
from vsecore.errors import UserError
from vsecore.io import write_json_atomic
from vsecore.pipelines_file import explain_origins

#: the stages in the order they run (each stage's runner imports its stage's library when it runs: `train
#: pipeline --help` and `--list` load no stage library, a pipeline run `--until prep` no torch)
STAGES = ("prep", "features", "regions", "train", "classify", "compare", "evaluate")


def fingerprint(settings: dict[str, Any], upstream: str = "") -> str:
    """SHA-256 of a stage's settings (canonical JSON) chained with its upstream fingerprint."""
    blob = json.dumps(settings, sort_keys=True, default=str) + "|" + upstream
    return hashlib.sha256(blob.encode()).hexdigest()


def _state_file(out: str) -> Path:
    out_path = Path(out)
    return out_path.with_name(out_path.name + ".stage.json")


def _read_state(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _run_prep(pipe: Pipeline, resume: bool, overwrite: bool) -> None:
    # start-up: the stage's library, when the stage runs
    from prep.run import run_prep

    run_prep(pipe.prep, overwrite=True)  # the pipeline's own prepared dataset: cheap to redo


def _feature_stage(section: str) -> Callable[[Pipeline, bool, bool], None]:
    """The runner of a feature stage: ``features``, or ``regions`` (a second store, of region features)."""
    def run(pipe: Pipeline, resume: bool, overwrite: bool) -> None:
        # start-up: the stage's library, when the stage runs
        from features.run import run_features

        run_features(getattr(pipe, section), overwrite=overwrite and not resume)

    return run


def _run_compare(pipe: Pipeline, resume: bool, overwrite: bool) -> None:
    """``train compare`` with the section's settings; it resumes from its own folder in any case (finished
    runs are kept, the run it was in goes on)."""
    # start-up: the stage's library, when the stage runs
    from train.retrieval.compare import plan_from_section, run_compare

    run_compare(plan_from_section(pipe.compare, pipe.source))


def _run_train(pipe: Pipeline, resume: bool, overwrite: bool) -> None:
    # start-up: the stage's library, when the stage runs
    from train.retrieval.fit import run_training

    # a run killed while writing its first last.pt may still have best.pt to resume from
    run = RunDir(pipe.train.out)
    has_checkpoint = run.last.is_file() or run.best.is_file()
    # a pipeline that evaluates next prints the test table once, there
    run_training(pipe.train, resume=resume and has_checkpoint, overwrite=overwrite or resume,
                 test_table=getattr(pipe, "evaluate", None) is None)


def _run_classify(pipe: Pipeline, resume: bool, overwrite: bool) -> None:
    # start-up: the stage's library, when the stage runs
    from train.classification.fit import run_classification

    has_checkpoint = RunDir(pipe.classify.out).checkpoints.is_dir()
    run_classification(pipe.classify, resume=resume and has_checkpoint, overwrite=overwrite or resume)


def _run_evaluate(pipe: Pipeline, resume: bool, overwrite: bool) -> None:
    ev = pipe.evaluate
    if pipe.classify is not None:
        _evaluate_classification(pipe)
        return
    # start-up: the stage's library, when the stage runs
    from train.retrieval.evaluate.run import evaluate_run

    evaluate_run(Path(pipe.train.out), split=ev.split, protocols=list(ev.protocols), noise=ev.noise,
                 length_analysis=ev.length_analysis, chance=True)


def _evaluate_classification(pipe: Pipeline) -> None:
    """A classification pipeline's evaluate stage: the split's metrics and, with ``noise``, the accuracy
    per noise ratio (what ``train evaluate --run`` of the run does)."""
    # start-up: the stage's library, when the stage runs
    from train.classification.evaluate import evaluate_run as evaluate_classification_run

    evaluate_classification_run(Path(pipe.classify.out), split=pipe.evaluate.split, noise=pipe.evaluate.noise)


#: each stage's runner: ``(pipeline, resume, overwrite)``
RUNNERS: dict[str, Callable[[Pipeline, bool, bool], None]] = {
    "prep": _run_prep,
    "features": _feature_stage("features"),
    "train": _run_train,
    "classify": _run_classify,
    "regions": _feature_stage("regions"),
    "compare": _run_compare,
    "evaluate": _run_evaluate,
}


def _prep_record(out: str) -> dict[str, Any]:
    """The ``prep.json`` of a prepared dataset (empty when absent or unreadable)."""
    try:
        record = json.loads((Path(out) / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _prep_inputs_fingerprint(out: str, settings_fp: str) -> str:
    """The prep stage's fingerprint: its settings' chained with its inputs' SHA-256 (``prep.json``)."""
    inputs = [[i.get("path"), i.get("sha256")] for i in _prep_record(out).get("inputs", [])]
    return fingerprint({"inputs": inputs}, settings_fp)


def _output_of(pipe: Pipeline, stage: str) -> str:
    if stage == "evaluate":
        return str(RunDir((pipe.train or pipe.classify).out).eval_dir)
    return getattr(pipe, stage).out


def _prep_difference(record: dict[str, Any], section: Any) -> str | None:
    """The first setting (its ``out`` aside) in which a prepared dataset's ``prep.json`` differs from
    ``section``: ``prep.KEY: A in the folder, B in the pipeline``; None when it records these very settings.
    Both sides are the settings as validated, paths absolute (``prep`` makes a command line's so)."""
    options = record.get("options")
    if not isinstance(options, dict):
        return "its prep.json records no settings"
    wanted = section.model_dump(mode="json")
    for key in [*wanted, *(k for k in options if k not in wanted)]:
        if key != "out" and options.get(key) != wanted.get(key):
            folder, pipeline = json.dumps(options.get(key)), json.dumps(wanted.get(key))
            return f"prep.{key}: {folder} in the folder, {pipeline} in the pipeline"
    return None


def _check_outputs(pipe: Pipeline, name: str) -> None:
    """Each stage's output is a folder of its own: not the file system root, and not inside (or equal
    to) another stage's output (a feature store inside the prepared dataset would be replaced with it).
    The evaluation writes into the run directory it evaluates, its owner."""
    outputs = {stage: Path(_output_of(pipe, stage)).expanduser().resolve() for stage in STAGES
               if stage != "evaluate" and getattr(pipe, stage) is not None}
    for stage, out in outputs.items():
        if out == Path(out.anchor):
            raise UserError(f"pipeline '{name}': {stage}.out is the file system root; give it a folder of "
                            "its own")
        for other, folder in outputs.items():
            if other != stage and (out == folder or folder in out.parents):
                raise UserError(f"pipeline '{name}': {stage}.out {out} lies inside {other}.out {folder}; "
                                "give each stage a folder of its own")


def _hand_made_dataset_is_current(name: str, out: str, section: Any) -> bool:
    """A prepared dataset at ``prep.out`` that no pipeline made (no stage record beside it) is the user's:
    taken as it is (True) when it was made with these very settings from unchanged inputs, else an error
    naming the first setting that differs, or the first input that changed (replaced only with
    ``--overwrite``). A pipeline redoes the prepared datasets pipelines made freely."""
    record = _prep_record(out)
    difference = _prep_difference(record, section)
    changed = changed_inputs(record) if difference is None else []
    if difference is None and not changed:
        return True
    if difference is not None:
        why = f"with other settings ({difference})"
    else:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        why = f"from inputs that changed since ({changed[0]}{more})"
    raise UserError(f"{out}: prep.out of pipeline '{name}' holds a prepared dataset (or folder) that no "
                    f"pipeline made, {why}; set prep.out to a new folder, or run `train pipeline {name} "
                    "--overwrite` to replace it")


def _check_no_foreign_run(name: str, out: str, same: bool) -> None:
    """A finished run at ``train.out`` is replaced only with ``--overwrite``."""
    if RunDir(out).holds_run():
        why = ("was made with other settings, or by another command" if not same else
               "is this pipeline's finished run, which --force replaces only with --overwrite")
        raise UserError(f"{out}: the run directory of pipeline '{name}' already holds a run that {why}; "
                        f"set train.out to a new run folder, or run `train pipeline {name} --overwrite` "
                        f"to replace it")


def _run_stage(pipe: Pipeline, name: str, stage: str, out: str, fp: str, state: dict[str, Any],
               resume: bool, overwrite: bool, changed: list[str]) -> None:
    """Run one stage, its state file saying "running" meanwhile and "done" after (as it was if refused)."""
    state_path = _state_file(out)
    verb = "resuming" if resume else "running"
    because = ""
    if changed:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        because = f" (input changed: {changed[0]}{more})"
    console.info(f"[pipeline {name}] {stage}: {verb} -> {out}{because}")
    write_json_atomic(state_path, {"pipeline": name, "stage": stage, "fingerprint": fp,
                                   "status": "running", "started": time.time()})
    t0 = time.time()
    try:
        with explain_origins(pipe.origins):  # a missing path written with a variable names the variable
            RUNNERS[stage](pipe, resume, overwrite)
    except UserError:
        # refused (e.g. a store of other settings): the output is as it was, so is its state;
        # "running" would make the next run resume it instead of honouring --overwrite
        if state:
            write_json_atomic(state_path, state)
        else:
            state_path.unlink(missing_ok=True)
        raise
    write_json_atomic(state_path, {"pipeline": name, "stage": stage, "fingerprint": fp,
                                   "status": "done", "seconds": round(time.time() - t0, 1)})
    console.info(f"[pipeline {name}] {stage}: done in {time.time() - t0:.1f}s")


def run_pipeline(name: str, file: str | None = None, force: bool = False, until: str | None = None,
                 overwrite: bool = False) -> None:
    """Run the stages of pipeline ``name`` in order (see the module docstring for skipping).

    ``overwrite`` lets a stage replace a finished training run or a feature store made with other
    settings; without it those are an error.
    """
    pipe = get_pipeline(name, file)
    _check_outputs(pipe, name)
    upstream = ""
    last = STAGES.index(until) if until else len(STAGES) - 1
    if last < STAGES.index("evaluate"):  # the train stage then prints its test table itself
        pipe = dataclasses.replace(pipe, evaluate=None)
    for stage in STAGES[: last + 1]:
        section = getattr(pipe, stage)
        if section is None:
            continue
        fp = fingerprint({stage: section.model_dump()}, upstream)
        out = _output_of(pipe, stage)
        state = _read_state(_state_file(out))
        same = state.get("fingerprint") == fp and Path(out).exists()
        changed: list[str] = []
        if same and state.get("status") == "done" and not force:
            changed = changed_inputs(_prep_record(out)) if stage == "prep" else []
            if not changed:
                console.info(f"[pipeline {name}] {stage}: up to date ({out})")
                upstream = _prep_inputs_fingerprint(out, fp) if stage == "prep" else fp
                continue
        resume = same and state.get("status") == "running" and not force
        if stage == "prep" and Path(out).exists() and not overwrite and not state \
                and _hand_made_dataset_is_current(name, out, section):
            console.info(f"[pipeline {name}] {stage}: up to date ({out}, prepared with the same settings)")
            write_json_atomic(_state_file(out), {"pipeline": name, "stage": stage, "fingerprint": fp,
                                                 "status": "done", "adopted": True})
            upstream = _prep_inputs_fingerprint(out, fp)
            continue
        if stage in ("train", "classify") and not resume and not overwrite:
            _check_no_foreign_run(name, out, same)
        _run_stage(pipe, name, stage, out, fp, state, resume, overwrite, changed)
        upstream = _prep_inputs_fingerprint(out, fp) if stage == "prep" else fp


def list_pipelines(file: str | None) -> None:
    """Print each pipeline of ``file`` (every one validated): its name, stages and the first sentence of its
    description."""
    for name, pipe in load_pipelines(file).items():
        stages = [s for s in STAGES if getattr(pipe, s) is not None]
        console.result(f"{name:24s} {'+'.join(stages):30s} {pipe.description.split('. ')[0].rstrip('.')}")
