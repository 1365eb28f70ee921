"""``train compare``: parses, then :func:`train.retrieval.compare.run_compare` (the plan of a
:class:`train.engine.settings.CompareSection`, as the pipeline stage) or
:func:`train.retrieval.compare.collect_runs`, imported (with torch) when the command runs. The defaults
``--help`` shows are the settings' (:class:`CompareSection`)."""

from __future__ import annotations

import argparse

from train.engine.settings import CompareSection
from vsecore.device import add_device_argument
from vsecore.errors import UserError
from vsecore.options import (
    add_out_option,
    add_overwrite_option,
    add_pipelines_file_argument,
    field_defaults,
    show_defaults,
)

#: where a comparison goes without ``--out``
COMPARE_OUT = "runs/compare"


def _command(args: argparse.Namespace) -> int:
    # start-up: the comparison (training, evaluation, figures: torch) only when the command runs
    from train.retrieval.compare import collect_runs, plan_from_section, run_compare

    if args.runs:
        collect_runs(args.runs, args.out, args.noise, args.device, overwrite=args.overwrite)
        return 0
    if not args.data:
        raise UserError("--data is required (or --runs RUN... to compare finished runs)")
    if args.seeds is not None and args.seeds < 1:
        raise UserError(f"--seeds {args.seeds}: must be at least 1")
    if args.epochs is not None and args.epochs < 1:
        raise UserError(f"--epochs {args.epochs}: must be at least 1")
    given = {key: getattr(args, key) for key in ("data", "features", "regions", "seeds", "seed", "epochs",
                                                  "device", "noise") if getattr(args, key) is not None}
    if args.families is not None:  # parse_entries checks the names
        given["families"] = args.families.split(",")
    section = CompareSection(out=args.out or COMPARE_OUT, **given)
    run_compare(plan_from_section(section, args.pipelines), overwrite=args.overwrite)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train compare``."""
    p = sub.add_parser(
        "compare", help="train several families on one dataset and store; one table, two figures",
        description="Several families trained on one prepared dataset and one store, side by side, on "
        "--device. Writes compare.json, compare.md, rsum_vs_parameters.png and noise_r1.png into --out, "
        "the runs under --out/runs/. Re-running the same command resumes a killed comparison.")
    p.add_argument("--data", help="prepared dataset (prep's --out)")
    p.add_argument("--features", help="STORE:global or STORE:fne for the families with a linear image side")
    p.add_argument("--regions", help="STORE:regions for the region families (clmr, liwe)")
    p.add_argument("--families", default=None,
                   help="comma list of families (their defaults) or pipeline names (their train settings); "
                   "default: every family (chain,oecc,seam,vse,clmr,liwe)")
    add_pipelines_file_argument(p)
    p.add_argument("--epochs", type=int, default=None, help="epochs of every run (default: each family's)")
    p.add_argument("--seed", type=int, default=None, help="seed of the first run of each entry")
    p.add_argument("--seeds", type=int, default=None, help="runs per entry, seeds SEED..SEED+K-1; the table "
                   "shows mean ± std")
    p.add_argument("--noise", default=None, metavar="START:STOP:STEP",
                   help="character-noise ratios of the robustness figure")
    add_out_option(p, f"the comparison's folder (default {COMPARE_OUT})")
    p.add_argument("--runs", nargs="+", metavar="RUN_DIR", default=None,
                   help="compare these finished runs instead of training (their noise analysis is computed "
                   "when --noise is given and it is missing)")
    add_overwrite_option(p, "replace compare.json, compare.md and the figures in --out even if train compare "
                            "did not write them")
    add_device_argument(p, metavar="DEVICE")
    show_defaults(p, field_defaults(CompareSection), skip=("families", "out", "device"))
    p.set_defaults(func=_command)
