"""``train pipeline NAME``: run a named pipeline's stages in order, skipping those up to date.

Each stage's *fingerprint* is the SHA-256 of its resolved settings and of the fingerprints of the
stages before it, so changing an option re-runs that stage and every later one. The runner keeps
a small state file next to each stage's output (``<out>.stage.json``) holding the fingerprint and
whether the stage finished:

- same fingerprint and finished, output present: skipped;
- same fingerprint but unfinished (the run was killed): resumed (feature blocks already done and
  the last training checkpoint are kept);
- a different fingerprint, or an output of unknown origin: recomputed from scratch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prep.errors import UserError
from prep.io import write_json_atomic
from prep.pipelines import Pipeline, default_pipelines_file, get_pipeline, load_pipelines

STAGES = ("prep", "features", "train", "evaluate")


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


def _run_prep(pipe: Pipeline, resume: bool) -> None:
    from prep.cli import run_prep

    run_prep(pipe.prep)


def _run_features(pipe: Pipeline, resume: bool) -> None:
    from features.cli import run_features

    run_features(pipe.features, overwrite=not resume)


def _run_train(pipe: Pipeline, resume: bool) -> None:
    from train.fit import run_training

    has_checkpoint = (Path(pipe.train.out) / "checkpoints").is_dir()
    run_training(pipe.train, resume=resume and has_checkpoint, overwrite=not resume)


def _run_evaluate(pipe: Pipeline, resume: bool) -> None:
    from train.evaluate_cli import evaluate_run

    ev = pipe.evaluate
    evaluate_run(Path(pipe.train.out), split=ev.split, protocols=list(ev.protocols), noise=ev.noise,
                 length_analysis=ev.length_analysis, chance=True)


RUNNERS: dict[str, Callable[[Pipeline, bool], None]] = {
    "prep": _run_prep,
    "features": _run_features,
    "train": _run_train,
    "evaluate": _run_evaluate,
}


def _output_of(pipe: Pipeline, stage: str) -> str:
    if stage == "evaluate":
        return str(Path(pipe.train.out) / "eval")
    return getattr(pipe, stage).out


def run_pipeline(name: str, file: str | None = None, force: bool = False, until: str | None = None) -> None:
    """Run the stages of pipeline ``name`` in order (see the module docstring for skipping)."""
    pipe = get_pipeline(name, file)
    upstream = ""
    last = STAGES.index(until) if until else len(STAGES) - 1
    for stage in STAGES[: last + 1]:
        section = getattr(pipe, stage)
        if section is None:
            continue
        fp = fingerprint({stage: section.model_dump()}, upstream)
        upstream = fp
        out = _output_of(pipe, stage)
        state_path = _state_file(out)
        state = _read_state(state_path)
        same = state.get("fingerprint") == fp and Path(out).exists()
        if same and state.get("status") == "done" and not force:
            print(f"[pipeline {name}] {stage}: up to date ({out})", flush=True)
            continue
        resume = same and state.get("status") == "running" and not force
        verb = "resuming" if resume else "running"
        print(f"[pipeline {name}] {stage}: {verb} -> {out}", flush=True)
        write_json_atomic(state_path, {"pipeline": name, "stage": stage, "fingerprint": fp,
                                       "status": "running", "started": time.time()})
        t0 = time.time()
        RUNNERS[stage](pipe, resume)
        write_json_atomic(state_path, {"pipeline": name, "stage": stage, "fingerprint": fp,
                                       "status": "done", "seconds": round(time.time() - t0, 1)})
        print(f"[pipeline {name}] {stage}: done in {time.time() - t0:.1f}s", flush=True)


def _list(file: str | None) -> None:
    path = Path(file) if file else default_pipelines_file()
    for name, pipe in load_pipelines(path).items():
        stages = [s for s in STAGES if getattr(pipe, s) is not None]
        print(f"{name:24s} {'+'.join(stages):30s} {pipe.description.split('. ')[0].rstrip('.')}")


def _command(args: argparse.Namespace) -> int:
    if args.list or not args.name:
        _list(args.pipelines)
        return 0
    if args.until and args.until not in STAGES:
        raise UserError(f"--until must be one of {', '.join(STAGES)}")
    run_pipeline(args.name, args.pipelines, force=args.force, until=args.until)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``pipeline`` subcommand to the ``train`` parser."""
    p = sub.add_parser(
        "pipeline",
        help="run a named pipeline (prep -> features -> train -> evaluate), skipping up-to-date stages",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", nargs="?", help="pipeline name in pipelines.yaml (omit to list them)")
    p.add_argument("--pipelines", metavar="FILE", default=None,
                   help="pipelines file (default: $VSE_PIPELINES, ./pipelines.yaml, or the project's)")
    p.add_argument("--list", action="store_true", help="list the pipelines and their stages, then exit")
    p.add_argument("--force", action="store_true", help="re-run every stage even if up to date")
    p.add_argument("--until", metavar="STAGE", default=None,
                   help=f"stop after this stage ({', '.join(STAGES)})")
    p.set_defaults(func=_command)
