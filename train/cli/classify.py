"""``train classify`` (train a text classifier) and ``train predict`` (label new texts with one): what they
do once parsed (their options: :mod:`train.cli.classify_options`, which imports this module, and torch,
only when one of them runs).

``train evaluate --run R`` of a classification run comes here too (:func:`evaluate_command`): the
test metrics of a checkpoint and, with ``--noise``, the accuracy per character-noise ratio and its PNG.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from train.classification.evaluate import evaluate_run
from train.classification.fit import run_classification
from train.classification.run import ClassificationRun, is_classification_run, load_classification_run
from train.cli.options import run_from_arguments, take_resumed_settings
from train.config.run import default_run_dir, read_config
from train.config.sections import classify_section
from train.models.classifier import classify_settings_class, encoder_keys
from train.run.layout import RunDir
from vsecore import console
from vsecore.errors import UserError
from vsecore.lines import bounded_lines, open_lines, printable
from vsecore.pipelines_file import explain_origins, pipeline_settings, settings_from


def classify_command(args: argparse.Namespace) -> int:
    """``train classify``: the settings (options > ``--pipeline`` > defaults; ``--resume`` takes the run's),
    then :func:`train.classification.fit.run_classification`."""
    if args.out is None and not args.pipeline:
        if args.resume:
            raise UserError("--resume needs --out RUN_DIR (the run to continue)")
        args.out = default_run_dir("classify")
    if args.resume and not args.pipeline and RunDir(args.out).config.is_file():
        stored = read_config(args.out)
        if stored.get("task") != "classify":
            raise UserError(f"{args.out}: cannot resume: not a classification run")
        take_resumed_settings(args, stored["settings"])
        for key, encoders in encoder_keys().items():
            if args.encoder not in encoders and getattr(args, key, None) == stored["settings"].get(key):
                setattr(args, key, None)
    pipeline = pipeline_settings(args, "classify", classify_section)
    settings = settings_from(classify_settings_class(), "classify", args, None, pipeline)
    with explain_origins(pipeline):
        run_classification(settings, resume=args.resume, overwrite=args.overwrite, dry_run=args.dry_run,
                           vocab_size=args.vocab_size, num_classes=args.classes)
    return 0


#: texts read, classified and printed at a time by ``train predict`` (its memory: this many texts, whatever
#: the length of ``--file``)
PREDICT_BATCH = 1024
#: what ``train predict --file`` reads, in the one-line errors of the line reader
TEXTS_FILE = "a file of texts (one per line)"
#: blank texts named by number in ``train predict``'s closing warning
BLANKS_NAMED = 10


@contextlib.contextmanager
def _texts(args: argparse.Namespace) -> Iterator[Iterator[str]]:
    """The texts to classify: ``--text``, or the lines of ``--file`` (``-``: standard input) streamed by the
    bounded line reader (:mod:`vsecore.lines`: a regular file, lines of at most 1 MiB, one-line errors
    naming the line); a final new line ends the last line."""
    if args.file is None:
        yield iter(args.text)
    elif args.file == "-":
        yield bounded_lines(sys.stdin.buffer, "<stdin>", TEXTS_FILE)
    else:
        with open_lines(args.file, TEXTS_FILE) as lines:
            yield lines


def _batches(texts: Iterator[str]) -> Iterator[list[str]]:
    while batch := list(itertools.islice(texts, PREDICT_BATCH)):
        yield batch


def _json_line(record: dict[str, Any]) -> str:
    """``record`` as one JSON line for the terminal: the characters :func:`vsecore.lines.printable` escapes
    are written as JSON ``\\u`` escapes, the same strings once parsed (JSON escapes only C0 controls)."""
    line = json.dumps(record, ensure_ascii=False)
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in line)


def _answer_line(text: str, row: torch.Tensor | None, labels: list[str], as_json: bool) -> str:
    """The answer to one text: ``LABEL<TAB>PROBABILITY<TAB>TEXT`` (a blank text: ``<TAB><TAB>TEXT``), or a
    JSON line; the text and labels escaped for the terminal as ``train query`` escapes them."""
    best = int(row.argmax()) if row is not None else None
    if as_json:
        record = {"text": text, "label": None, "probability": None, "probabilities": None}
        if row is not None:
            every = {n: round(float(p), 6) for n, p in zip(labels, row, strict=True)}
            record.update(label=labels[best], probability=round(float(row[best]), 6), probabilities=every)
        return _json_line(record)
    head = f"{printable(labels[best])}\t{float(row[best]):.4f}" if row is not None else "\t"
    return f"{head}\t{printable(text)}"


def _answer_all(run: ClassificationRun, batches: Iterable[list[str]], args: argparse.Namespace
                ) -> tuple[int, list[int]]:
    """Print the answer to every text, in order, a batch at a time: the count of blank texts and the
    numbers (1-based) of the first :data:`BLANKS_NAMED` of them."""
    source = "--text" if args.file is None else ("<stdin>" if args.file == "-" else args.file)
    unit = "text" if args.file is None else "line"
    done = blanks = 0
    named: list[int] = []
    for batch in batches:
        rows = run.answer(batch, [f"{source}: {unit} {done + k}" for k in range(1, len(batch) + 1)])
        for k, row in enumerate(rows, start=done + 1):
            if row is None:
                blanks += 1
                if len(named) < BLANKS_NAMED:
                    named.append(k)
        console.result("\n".join(_answer_line(t, r, run.labels, args.json) for t, r in zip(batch, rows,
                                                                                             strict=True)))
        done += len(batch)
    return blanks, named


def predict_command(args: argparse.Namespace) -> int:
    """``train predict``: the texts read and checked before the model loads, then one answer per text."""
    run_dir = run_from_arguments(args)
    if (args.text is None) == (args.file is None):
        raise UserError("give --text TEXT... or --file texts.txt (one text per line)")
    with _texts(args) as texts:
        batches = _batches(texts)
        first = next(batches, None)  # the file is opened, checked and read from before the model loads
        if first is None:
            raise UserError(f"{'<stdin>' if args.file == '-' else args.file}: no texts to classify (an empty "
                            "file)")
        if not is_classification_run(run_dir):
            raise UserError(f"{run_dir}: a retrieval run; `train predict` needs a `train classify` run (see "
                            "`train query` for retrieval)")
        run = load_classification_run(run_dir, args.checkpoint, args.device)
        blanks, named = _answer_all(run, itertools.chain([first], batches), args)
    if blanks:  # answered in place, so output line k stays the answer to input line k; said, not silent
        unit = "text" if args.file is None else "line"
        more = f" and {blanks - len(named):,} more" if blanks > len(named) else ""
        console.warning(f"train predict: {blanks:,} blank {unit}{'s' if blanks > 1 else ''} (nothing to "
                        "classify once read as the training texts were) answered with an empty label: "
                        f"{unit} {', '.join(map(str, named))}{more}")
    return 0


def evaluate_command(args: argparse.Namespace, run_dir: Path) -> int:
    """``train evaluate --run R`` of a classification run: metrics of ``--split``, ``--noise`` accuracy."""
    for option, value in (("--img-emb/--cap-emb", args.img_emb or args.cap_emb), ("--sims", args.sims),
                          ("--measure", args.measure), ("--length-analysis", args.length_analysis),
                          ("--ranks", args.ranks), ("--gallery", args.gallery)):
        if value:
            raise UserError(f"{option} does not apply to a classification run")
    evaluate_run(run_dir, args.split or "test", args.checkpoint, args.device, args.noise, args.noise_seed,
                 Path(args.json) if args.json else None, Path(args.out) if args.out else None)
    return 0
