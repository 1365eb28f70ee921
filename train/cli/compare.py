"""``train compare``: parses, then :func:`train.retrieval.compare.run_compare` (the plan of a
:class:`train.engine.settings.CompareSection`, as the pipeline stage) or
:func:`train.retrieval.compare.collect_runs`."""

from __future__ import annotations

import argparse

from pipelines.schema import add_pipelines_file_argument
from train.engine.settings import CompareSection
from train.retrieval.compare import COMPARE_OUT, DEFAULT_NOISE, collect_runs, plan_from_section, run_compare
from vsecore.device import add_device_argument
from vsecore.errors import UserError


def _command(args: argparse.Namespace) -> int:
    if args.runs:
        collect_runs(args.runs, args.out, args.noise, args.device, overwrite=args.overwrite)
        return 0
    if not args.data:
        raise UserError("--data is required (or --runs RUN... to compare finished runs)")
    if args.seeds < 1:
        raise UserError(f"--seeds {args.seeds}: must be at least 1")
    if args.epochs is not None and args.epochs < 1:
        raise UserError(f"--epochs {args.epochs}: must be at least 1")
    families = args.families.split(",") if args.families is not None else None  # parse_entries checks them
    section = CompareSection(data=args.data, features=args.features, regions=args.regions, families=families,
                             seeds=args.seeds, seed=args.seed, epochs=args.epochs,
                             out=args.out or COMPARE_OUT,
                             device=args.device, noise=args.noise or DEFAULT_NOISE)
    run_compare(plan_from_section(section, args.pipelines), overwrite=args.overwrite)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train compare``."""
    p = sub.add_parser(
        "compare", help="train several families on one dataset and store; one table, two figures",
        description="Several families trained on one prepared dataset and one store, side by side. Writes "
        "compare.json, compare.md, rsum_vs_parameters.png and noise_r1.png into --out, the runs under "
        "--out/runs/. Re-running the same command resumes a killed comparison.")
    p.add_argument("--data", help="prepared dataset (prep's --out)")
    p.add_argument("--features", help="STORE:global or STORE:fne for the families with a linear image side")
    p.add_argument("--regions", help="STORE:regions for the region families (clmr, liwe)")
    p.add_argument("--families", default=None,
                   help="comma list of families (their defaults) or pipeline names (their train settings); "
                   "default: every family (chain,oecc,seam,vse,clmr,liwe)")
    add_pipelines_file_argument(p)
    p.add_argument("--epochs", type=int, default=None, help="epochs of every run (default: each family's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first run of each entry (default 0)")
    p.add_argument("--seeds", type=int, default=1, help="runs per entry, seeds SEED..SEED+K-1; the table "
                   "shows mean ± std (default 1)")
    p.add_argument("--noise", default=None, metavar="START:STOP:STEP",
                   help=f"character-noise ratios of the robustness figure (default {DEFAULT_NOISE})")
    p.add_argument("--out", default=None, help="the comparison's folder (default runs/compare)")
    p.add_argument("--runs", nargs="+", metavar="RUN_DIR", default=None,
                   help="compare these finished runs instead of training (their noise analysis is computed "
                   "when --noise is given and it is missing)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace compare.json, compare.md and the figures in --out even if train compare "
                   "did not write them")
    add_device_argument(p)
    p.set_defaults(func=_command)
