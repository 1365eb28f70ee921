"""``train report``: parses, then :func:`train.retrieval.report.run_summary` for each run (imported when
the command runs)."""

from __future__ import annotations

import argparse

from train.cli.options import add_json_argument
from vsecore import console
from vsecore.errors import UserError
from vsecore.io import write_json_atomic
from vsecore.options import add_overwrite_option
from vsecore.outputs import check_output_file


def _command(args: argparse.Namespace) -> int:
    # start-up: the runs' reader, the figure and torch only when the command runs
    from train.engine.plots import plot_parameters_vs_rsum
    from train.retrieval.evaluate.run import check_distinct  # start-up: (as above)
    from train.retrieval.report import format_summary, run_summary  # start-up: (as above)

    outputs = {"--json": args.json, "--plot": args.plot}
    check_distinct(outputs)
    for option, path in outputs.items():
        if path:  # never over a run (an input) nor inside one; an existing file only with --overwrite
            check_output_file(path, inputs=args.runs, overwrite=args.overwrite, option=option)
    rows = [run_summary(r, args.protocol) for r in args.runs]
    console.result(format_summary(rows))
    if args.json:
        write_json_atomic(args.json, rows)
        console.info(f"wrote {args.json}")
    if args.plot:
        tested = [{**r, "rsum": r["test"]["rsum"]} for r in rows if r["test"]]
        if not tested:
            raise UserError("no run has a test evaluation (eval/test.json) to plot")
        console.info(f"wrote {plot_parameters_vs_rsum(tested, args.plot)}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train report``."""
    p = sub.add_parser("report", help="compare runs: settings, parameters, epochs, validation and test rsum",
                       description="A table of runs side by side (from their config.json, metrics.jsonl and "
                       "eval/test.json) and, with --plot, parameters against test rsum.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories written by `train <family>`")
    p.add_argument("--protocol", default=None, help="test protocol to report (default: each run's first)")
    p.add_argument("--plot", metavar="PNG", default=None, help="write parameters vs test rsum here")
    add_json_argument(p, "also write the rows as JSON")
    add_overwrite_option(p, "replace an existing --plot or --json file")
    p.set_defaults(func=_command)
