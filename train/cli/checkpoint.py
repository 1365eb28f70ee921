"""``train convert-checkpoints --run R``: re-save a run's checkpoints from before format 2, once.

Checkpoints written before checkpoint format 2 pickled the numpy random state, so the safe loader
every command now uses (``torch.load(weights_only=True)``) refuses them. This command reads them
with the unsafe loader, which runs any code a pickled object in them carries, and writes them back
in format 2 (tensors, numbers, strings and lists only). Run it only on runs you wrote yourself or
trust; a run someone shared should be opened as it is, or shared as a model folder
(``train export-model``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from train.cli.options import add_run_arguments, run_from_arguments
from train.run.layout import RunDir
from vsecore import console
from vsecore.errors import UserError, resume_hint
from vsecore.io import exclusive_lock


def convert_run_checkpoints(run_dir: str | Path) -> list[tuple[Path, bool]]:
    """Convert every ``checkpoints/*.pt`` of ``run_dir`` (see the module doc); ``(path, converted)`` each,
    ``converted`` False for a checkpoint already in format 2. Holds the run directory's lock; a failure
    (a full disk) names what was converted before it."""
    from train.run.checkpoint import convert_checkpoint  # start-up: torch only when the command runs

    run_dir = Path(run_dir)
    files = sorted(RunDir(run_dir).checkpoints.glob("*.pt"))
    if not files:
        raise UserError(f"{run_dir}: no checkpoints/*.pt to convert")
    console.warning(f"{run_dir}: converting unpickles the checkpoints (torch.load with weights_only=False), "
                    "which runs any code inside them: do this only for runs you wrote or trust")
    done: list[tuple[Path, bool]] = []

    def kept() -> str:
        converted = [p.name for p, c in done if c]
        return (f"{', '.join(converted) or 'no checkpoint'} converted, the others unchanged: run "
                "convert-checkpoints again to convert them")

    with exclusive_lock(run_dir, "the run directory"), resume_hint(kept):
        for path in files:  # a full disk stops at the file it failed on, which stays as it was
            done.append((path, convert_checkpoint(path)))
    return done


def _command(args: argparse.Namespace) -> int:
    for path, converted in convert_run_checkpoints(run_from_arguments(args)):
        console.result(f"{path}: {'converted to checkpoint format 2' if converted else 'already format 2'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train convert-checkpoints``."""
    p = sub.add_parser("convert-checkpoints",
                       help="re-save a run's old (pickled) checkpoints in the pickle-free format, once",
                       description=__doc__.split("\n\n")[1].replace("\n", " ").replace("``", ""))
    add_run_arguments(p, "a run directory written by `train <family>` or `train classify`")
    p.set_defaults(func=_command)
