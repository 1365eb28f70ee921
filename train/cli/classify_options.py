"""The options of ``train classify`` and ``train predict``: classification's settings generated from their
fields (:func:`vsecore.options.field_option`, as ``train <family>``'s), in :data:`CLASSIFY_GROUPS`. What the
commands do is :mod:`train.cli.classify`, imported (with torch) only when one of them runs."""

from __future__ import annotations

import argparse

from train.cli.fit_options import NOT_SETTINGS
from train.cli.options import add_checkpoint_argument, add_run_arguments
from train.engine.settings import DRY_RUN_ALPHABET
from train.models.classifier import (
    PAPER_WORD_VOCABULARY,
    classify_settings,
    classify_settings_class,
    encoder_keys,
)
from vsecore.device import add_device_argument
from vsecore.errors import HelpFormatter
from vsecore.options import add_overwrite_option, add_pipeline_arguments, field_option, show_defaults

#: the option group of ``--encoder``, where every encoder's options follow it
ENCODER_GROUP = "text encoder (a registered encoder of the retrieval families)"
#: classification's option groups in ``--help`` order: every field of the settings is in one; the encoder
#: group also holds every encoder's options (composed from the families, :mod:`train.models.classifier`)
CLASSIFY_GROUPS: dict[str, tuple[str, ...]] = {
    "data": ("data",),
    ENCODER_GROUP: ("encoder", "dropout", "max_chars", "max_words", "min_word_count", "lang"),
    "optimisation": ("batch_size", "lr", "lr_schedule", "lr_decay_patience", "lr_step", "early_stop",
                     "epochs", "grad_clip", "seed", "train_noise"),
    "run": ("out", "checkpoint_every", "device", "amp", "workers"),
}


def _settings_options(p: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    """One option per field of the classifier's settings (:func:`vsecore.options.field_option`), in
    :data:`CLASSIFY_GROUPS`: the encoders' options after ``encoder``, as their families declare them."""
    model = classify_settings_class()
    placed = [name for names in CLASSIFY_GROUPS.values() for name in names]
    encoder_options = list(encoder_keys())
    unplaced = set(model.model_fields) - set(placed) - set(encoder_options)
    if unplaced:
        raise RuntimeError(f"CLASSIFY_GROUPS is out of date: no group for {sorted(unplaced)}")
    groups = {title: p.add_argument_group(title) for title in CLASSIFY_GROUPS}
    for title, names in CLASSIFY_GROUPS.items():
        for name in names:
            field_option(groups[title], name, model.model_fields[name])
            if name == "encoder":
                for option in encoder_options:
                    field_option(groups[title], option, model.model_fields[option])
    return groups


def _classify(args: argparse.Namespace) -> int:
    from train.cli.classify import classify_command  # start-up: torch only when the command runs

    return classify_command(args)


def _predict(args: argparse.Namespace) -> int:
    from train.cli.classify import predict_command  # start-up: torch only when the command runs

    return predict_command(args)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``classify`` and ``predict`` to the ``train`` subcommands."""
    p = sub.add_parser(
        "classify", help="text classification: a registered text encoder + softmax (CHAIN-VSE section 5)",
        description="Train a text classifier on a dataset written by `prep textcls`: a registered text "
        "encoder (CHAIN-VSE v1/v2, OECC, SEAM, GRU) with dropout and a linear softmax layer, cross-entropy, "
        "Adam, the learning rate /10 on a validation-accuracy plateau, early stopping on the validation "
        "accuracy. Same run directory as retrieval: config.json, checkpoints/best.pt and last.pt, "
        "metrics.jsonl, train.log, curves.png, eval/test.json; --resume continues exactly.",
        formatter_class=HelpFormatter)
    r = _settings_options(p)["run"]
    r.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest checkpoint")
    add_overwrite_option(r, "start over in an --out that holds a run")
    r.add_argument("--dry-run", dest="dry_run", action="store_true",
                   help="build the model, print its parameter counts (encoder + head; the paper's ~1.5M and "
                        "a 200,000-word embedding model beside them) and exit")
    r.add_argument("--vocab-size", dest="vocab_size", type=int, default=None,
                   help=f"--dry-run without --data: alphabet or word vocabulary size (default "
                        f"{DRY_RUN_ALPHABET} / {PAPER_WORD_VOCABULARY:,})")
    r.add_argument("--classes", type=int, default=None, help="--dry-run without --data: classes (default 4)")
    add_pipeline_arguments(p)
    show_defaults(p, classify_settings(out="RUN_DIR"), skip=NOT_SETTINGS)
    p.set_defaults(func=_classify)

    q = sub.add_parser(
        "predict", help="label new texts with a classification run (label and probability)",
        description="Classify texts with a `train classify` run: one line per text, 'LABEL<TAB>PROBABILITY"
        "<TAB>TEXT', or with --json one JSON object per text with every class's probability. Output line k "
        "answers input line k: a blank text (nothing left once read as the training texts were) gets an "
        "empty answer, '<TAB><TAB>TEXT' (JSON: label, probability and probabilities null), and a closing "
        "warning counts the blank texts and names the first ten. Texts are printed as `train query` prints "
        "them, control and invisible characters escaped ('\\x1b', '\\u202e'; in JSON '\\u001b'). A text is "
        "read exactly as `prep textcls` read the training texts (AG News: escapes decoded, tabs and runs of "
        "spaces one space); a title and a description join as 'TITLE \u00b6 DESCRIPTION', as in training.",
        formatter_class=HelpFormatter)
    add_run_arguments(q, "a run directory written by `train classify`")
    q.add_argument("--text", nargs="+", default=None, metavar="TEXT", help="texts to classify")
    q.add_argument("--file", default=None, metavar="texts.txt",
                   help="one text per line ('-': stdin), read a line at a time: a regular file, UTF-8, lines "
                        "of at most 1 MiB; every line answered in order, a blank one with an empty answer")
    q.add_argument("--json", action="store_true", help="JSON lines with all probabilities")
    add_checkpoint_argument(q, "checkpoint of the run")
    add_device_argument(q)
    q.set_defaults(func=_predict)
