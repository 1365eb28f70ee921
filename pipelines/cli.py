"""``train pipeline NAME``: parses, then :func:`pipelines.runner.run_pipeline` (or lists the pipelines).
:func:`register` is installed as an entry point of ``train.cli.COMMAND_PLUGINS`` (``pyproject.toml``), so
the ``train`` command offers it and no stage imports the orchestrator."""

from __future__ import annotations

import argparse

from pipelines.runner import STAGES, list_pipelines, run_pipeline
from pipelines.runner import __doc__ as runner_doc
from vsecore.errors import UserError
from vsecore.options import add_overwrite_option, add_pipelines_file_argument


def _command(args: argparse.Namespace) -> int:
    if args.list or not args.name:
        list_pipelines(args.pipelines)
        return 0
    if args.until and args.until not in STAGES:
        raise UserError(f"--until must be one of {', '.join(STAGES)}")
    run_pipeline(args.name, args.pipelines, force=args.force, until=args.until, overwrite=args.overwrite)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``pipeline`` subcommand to the ``train`` parser."""
    p = sub.add_parser(
        "pipeline",
        help="run a named pipeline (prep -> features -> train -> evaluate), skipping up-to-date stages",
        description=runner_doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", nargs="?", help="pipeline name in pipelines.yaml (omit to list them)")
    add_pipelines_file_argument(p)
    p.add_argument("--list", action="store_true", help="list the pipelines and their stages, then exit")
    p.add_argument("--force", action="store_true",
                   help="re-run every stage even if up to date (nothing expensive is replaced without "
                        "--overwrite)")
    add_overwrite_option(p, "let a stage replace a finished training run or a feature store made with other "
                            "settings (without it, those are an error)")
    p.add_argument("--until", metavar="STAGE", default=None,
                   help=f"stop after this stage ({', '.join(STAGES)})")
    p.set_defaults(func=_command)
