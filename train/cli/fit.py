"""``train <family>``: one subcommand per registered family; it parses the options (generated from the
family's settings, :mod:`train.cli.fit_options`) and calls :func:`train.retrieval.fit.run_training`, which
(with torch) is imported only when the command runs."""

from __future__ import annotations

import argparse
import functools

from train.cli.fit_options import common_options, family_options, show_resolved_defaults
from train.cli.options import take_resumed_settings
from train.config.run import default_run_dir, read_config, settings_from_config
from train.config.sections import train_section
from train.models.family import family_names, get_family, settings_class
from train.run.layout import RunDir
from vsecore.errors import UserError
from vsecore.pipelines_file import explain_origins, pipeline_settings, settings_from


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add one ``train <family>`` subcommand per family that trains today; ``--help`` shows each option's
    default as the family resolves it (:func:`train.cli.fit_options.resolved_defaults`)."""
    for family in family_names():
        summary = get_family(family).summary
        p = subparsers.add_parser(
            family, help=summary, description=f"{summary}. Adam, learning rate /10 on a validation-rsum "
            "plateau or on a fixed step (--lr-schedule), early stopping; writes a run directory "
            "(config.json, checkpoints/best.pt and last.pt, metrics.jsonl, eval/test.json) that --resume "
            "continues exactly.")
        family_options(p.add_argument_group(f"{family} text encoder"), family)
        common_options(p)
        show_resolved_defaults(p, family)
        p.set_defaults(func=functools.partial(_command, family))


def _command(family: str, args: argparse.Namespace) -> int:
    # start-up: the training library (and torch) only when a run starts, not for --help or a bad option
    from train.retrieval.fit import run_training
    from train.retrieval.model_folder import is_model_folder  # start-up: (as above)

    if args.out is None and not args.pipeline:
        if args.resume:
            raise UserError("--resume needs --out RUN_DIR (the run to continue)")
        args.out = default_run_dir(family)
    if args.resume and args.out and is_model_folder(args.out):
        raise UserError(f"{args.out}: a model folder made for sharing (export-model) has no optimiser or "
                        "random states: it can be evaluated and queried, not resumed")
    if args.resume and not args.pipeline:
        if not RunDir(args.out).is_run():
            raise UserError(f"no run at {args.out} to resume; drop --resume to start one")
        stored = settings_from_config(read_config(args.out)["settings"])
        if stored.family != family:
            raise UserError(f"{args.out}: cannot resume: it is a '{stored.family}' run, not '{family}'")
        take_resumed_settings(args, {key: getattr(stored, key) for key in stored.model_fields_set})
    pipeline = pipeline_settings(args, "train", train_section)
    settings = settings_from(settings_class(family), "train", args, {"family": family}, pipeline)
    with explain_origins(pipeline):
        run_training(settings, resume=args.resume, overwrite=args.overwrite, dry_run=args.dry_run,
                     alphabet_size=args.alphabet_size, image_dim=args.image_dim, vocab_size=args.vocab_size)
    return 0
