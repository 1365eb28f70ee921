"""``train pipeline NAME``: parses, then :func:`pipelines.runner.run_pipeline` (or lists the pipelines); and
the ``train`` console command, which is ``train``'s own parser (:func:`train.cli.build_parser`) with this
subcommand added, so the orchestrator imports the stages and no stage imports it. ``python -m train`` runs
:func:`main` too (``train/__main__.py``, an entry point above every package)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from pipelines.runner import STAGES, list_pipelines, run_pipeline
from pipelines.runner import __doc__ as runner_doc
from train.cli import build_parser as train_parser
from train.cli import run
from vsecore.errors import UserError, run_cli
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


def build_parser() -> argparse.ArgumentParser:
    """The ``train`` argument parser: every ``train`` command and ``train pipeline``."""
    return train_parser(more=(register,))


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``train`` (and ``python -m train``)."""
    return run_cli(lambda args: run(build_parser(), args), argv, "train")
