"""``train classify`` (train a text classifier) and ``train predict`` (label new texts with one).

``train evaluate --run R`` of a classification run comes here too (:func:`evaluate_command`): the
test metrics of a checkpoint and, with ``--noise``, the accuracy per character-noise ratio and its PNG.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipelines.schema import add_pipeline_arguments, stage_settings
from train.classification.evaluate import evaluate_run
from train.classification.fit import PAPER_WORD_VOCABULARY, run_classification
from train.classification.run import is_classification_run, load_classification_run
from train.cli.options import (
    add_checkpoint_argument,
    add_run_arguments,
    run_from_arguments,
    take_resumed_settings,
)
from train.engine.settings import CLASSIFY_ENCODERS, DRY_RUN_ALPHABET, ClassifySection
from train.run.config import default_run_dir, read_config
from train.run.layout import RunDir
from vsecore.device import add_device_argument
from vsecore.errors import HelpFormatter, UserError


def _classify_command(args: argparse.Namespace) -> int:
    if args.out is None and not args.pipeline:
        if args.resume:
            raise UserError("--resume needs --out RUN_DIR (the run to continue)")
        args.out = default_run_dir("classify")
    if args.resume and not args.pipeline and RunDir(args.out).config.is_file():
        stored = read_config(args.out)
        if stored.get("task") != "classify":
            raise UserError(f"{args.out}: cannot resume: not a classification run")
        take_resumed_settings(args, stored["settings"])
        for key, encoders in ClassifySection.encoder_keys.items():
            if args.encoder not in encoders and getattr(args, key, None) == stored["settings"].get(key):
                setattr(args, key, None)
    settings = stage_settings("classify", args)
    run_classification(settings, resume=args.resume, overwrite=args.overwrite, dry_run=args.dry_run,
                       vocab_size=args.vocab_size, num_classes=args.classes)
    return 0


def _read_lines(file: str) -> list[str]:
    """The lines of ``file`` (``-``: stdin), split on new lines only (a form feed or U+2028 inside a line
    is part of it, as an editor numbers lines), a final new line ending the last line."""
    path = Path(file)
    try:
        body = sys.stdin.read() if file == "-" else path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason})") from None
    lines = [line.removesuffix("\r") for line in body.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


def _predict_command(args: argparse.Namespace) -> int:
    run_dir = run_from_arguments(args)
    if (args.text is None) == (args.file is None):
        raise UserError("give --text TEXT... or --file texts.txt (one text per line)")
    texts = _read_lines(args.file) if args.file is not None else list(args.text)
    if not texts:
        raise UserError("no texts to classify")
    if not is_classification_run(run_dir):
        raise UserError(f"{run_dir}: a retrieval run; `train predict` needs a `train classify` run (see "
                        "`train query` for retrieval)")
    run = load_classification_run(run_dir, args.checkpoint, args.device)
    # a text with nothing left for the encoder (a blank line) gets an empty answer in its place
    answered = [k for k, blank in enumerate(run.blank(texts)) if not blank]
    found = run.probabilities([texts[k] for k in answered]) if answered else []
    probs = dict(zip(answered, found, strict=True))
    for k, text in enumerate(texts):
        row = probs.get(k)
        best = int(row.argmax()) if row is not None else None
        if args.json:
            record = {"text": text, "label": None, "probability": None, "probabilities": None}
            if row is not None:
                every = {n: round(float(p), 6) for n, p in zip(run.labels, row, strict=True)}
                record.update(label=run.labels[best], probability=round(float(row[best]), 6),
                              probabilities=every)
            print(json.dumps(record, ensure_ascii=False))
        else:
            print(f"{run.labels[best]}\t{float(row[best]):.4f}\t{text}" if row is not None else f"\t\t{text}")
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


def _encoder_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("text encoder (a registered encoder of the retrieval families)")
    g.add_argument("--encoder", choices=CLASSIFY_ENCODERS, default=None,
                   help="chain: CHAIN-VSE (characters); oecc: convolutions through time (characters); seam: "
                        "self-attention over words; gru: word embedding + GRU (default chain)")
    g.add_argument("--version", choices=("v1", "v2"), default=None, help="chain: v1 or v2 (default v1)")
    g.add_argument("--p", type=float, default=None,
                   help="chain: width multiplier, 256p filters per stream (default 1.0)")
    g.add_argument("--arch", choices=("A", "B", "C", "D"), default=None,
                   help="oecc: architecture (default D)")
    g.add_argument("--variant", choices=("E", "C", "G"), default=None, help="seam: variant (default E)")
    g.add_argument("--hops", type=int, default=None, help="seam: attention hops (default: the variant's)")
    g.add_argument("--penalty", type=float, default=None, help="seam: attention penalty lambda (default 0)")
    g.add_argument("--gru-units", dest="gru_units", type=int, default=None,
                   help="GRU units of gru and seam G (default 512)")
    g.add_argument("--word-dim", dest="word_dim", type=int, default=None,
                   help="gru: word embedding size (default 300)")
    g.add_argument("--dropout", type=float, default=None,
                   help="dropout before the softmax layer (default 0.5)")
    g.add_argument("--max-chars", dest="max_chars", type=int, default=None,
                   help="character encoders read at most this many characters (default 1014)")
    g.add_argument("--max-words", dest="max_words", type=int, default=None,
                   help="word encoders read at most this many words (default 200)")
    g.add_argument("--min-word-count", dest="min_word_count", type=int, default=None,
                   help="word encoders: train words seen fewer times map to <unk> (default 1)")
    g.add_argument("--lang", default=None, help="language of new texts for word encoders (default en)")


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
    p.add_argument("--data", metavar="PREPARED", default=None, help="folder written by `prep textcls`")
    _encoder_options(p)
    _optimisation_options(p.add_argument_group("optimisation"))
    r = p.add_argument_group("run")
    r.add_argument("--out", metavar="RUN_DIR", default=None, help="run directory (default "
                   "runs/classify-<timestamp>)")
    r.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest checkpoint")
    r.add_argument("--overwrite", action="store_true", help="start over in an --out that holds a run")
    r.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, default=None,
                   help="also write checkpoints/last.pt every this many steps (default 200)")
    add_device_argument(r, None)
    r.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast on CUDA (default off)")
    r.add_argument("--workers", type=int, default=None, help="batch-collating worker processes (default 0)")
    r.add_argument("--dry-run", dest="dry_run", action="store_true",
                   help="build the model, print its parameter counts (encoder + head; the paper's ~1.5M and "
                        "a 200,000-word embedding model beside them) and exit")
    r.add_argument("--vocab-size", dest="vocab_size", type=int, default=None,
                   help=f"--dry-run without --data: alphabet or word vocabulary size (default "
                        f"{DRY_RUN_ALPHABET} / {PAPER_WORD_VOCABULARY:,})")
    r.add_argument("--classes", type=int, default=None, help="--dry-run without --data: classes (default 4)")
    add_pipeline_arguments(p)
    p.set_defaults(func=_classify_command)

    q = sub.add_parser(
        "predict", help="label new texts with a classification run (label and probability)",
        description="Classify texts with a `train classify` run: one line per text, 'LABEL<TAB>PROBABILITY"
        "<TAB>TEXT', or with --json one JSON object per text with every class's probability. Output line k "
        "answers input line k: a blank text (nothing left once read as the training texts were) gets an "
        "empty answer, '<TAB><TAB>TEXT' (JSON: label, probability and probabilities null). A text is read "
        "exactly as `prep textcls` read the training texts (AG News: escapes decoded, tabs and runs of "
        "spaces one space); a title and a description join as 'TITLE \u00b6 DESCRIPTION', as in training.",
        formatter_class=HelpFormatter)
    add_run_arguments(q)
    q.add_argument("--text", nargs="+", default=None, metavar="TEXT", help="texts to classify")
    q.add_argument("--file", default=None, metavar="texts.txt",
                   help="one text per line ('-': stdin); every line answered in order, a blank one with an "
                        "empty answer")
    q.add_argument("--json", action="store_true", help="JSON lines with all probabilities")
    add_checkpoint_argument(q, "checkpoint of the run")
    add_device_argument(q)
    q.set_defaults(func=_predict_command)


def _optimisation_options(o: argparse._ArgumentGroup) -> None:
    o.add_argument("--batch-size", dest="batch_size", type=int, default=None, help="texts per batch "
                   "(default 128)")
    o.add_argument("--lr", type=float, default=None, help="Adam learning rate (default 1e-3)")
    o.add_argument("--lr-schedule", dest="lr_schedule", choices=("plateau", "step", "constant"), default=None,
                   help="plateau: /10 after --lr-decay-patience epochs without a better val accuracy; "
                        "step: /10 every --lr-step epochs; constant (default plateau)")
    o.add_argument("--lr-decay-patience", dest="lr_decay_patience", type=int, default=None,
                   help="epochs without improvement before the /10 (default 2)")
    o.add_argument("--lr-step", dest="lr_step", type=int, default=None,
                   help="epochs per /10 step (default 15)")
    o.add_argument("--early-stop", dest="early_stop", type=int, default=None,
                   help="stop after this many epochs without a better val accuracy (default 4)")
    o.add_argument("--epochs", type=int, default=None, help="maximum number of epochs (default 20)")
    o.add_argument("--grad-clip", dest="grad_clip", type=float, default=None,
                   help="clip the gradient norm; 0 disables (default 5.0)")
    o.add_argument("--seed", type=int, default=None, help="seed of initialisation and shuffling (default 0)")
    o.add_argument("--train-noise", dest="train_noise", type=float, default=None, metavar="P",
                   help="replace this ratio of each training text's characters, as `train evaluate --noise` "
                        "does, drawn afresh every epoch (seeded by --seed, the epoch and the text; exact on "
                        "--resume); 0: none (default 0)")
