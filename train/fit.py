"""``train <family>``: the training subcommands, one per model family, and :func:`run_training`.

Every family shares the trainer (:mod:`train.trainer`), the data pipeline (:mod:`train.data`)
and the run directory (:mod:`train.runs`); a family only adds its own options, and its defaults
(``register_family_defaults``: SEAM's step schedule, the FNE paper's presets), which are resolved
before the run starts and recorded in its ``config.json``. ``chain``, ``oecc``, ``seam`` and ``vse``
train today; the other families of ``prep.pipelines.FAMILIES`` join through :data:`FAMILY_OPTIONS`
once their encoders exist.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prep.dataset import PreparedDataset
from prep.pipelines import TrainSection, add_pipeline_arguments, stage_settings
from train.checkpoint import (
    remove_stale_temporaries,
)
from train.data import (
    CaptionSet,
    PairSet,
    codec_for,
    feature_spec,
    load_caption_set,
    load_pair_set,
    read_features,
    read_region_counts,
)
from train.evaluate import protocol_folds
from train.models.registry import ModelSpec, model_spec, with_family_defaults
from train.models.uvs import vse_preset
from train.rundir import RunDir
from train.runs import (
    absolute_settings,
    check_same_config,
    dataset_fingerprint,
    default_run_dir,
    embed_split,
    features_fingerprint,
    file_stats,
    is_model_folder,
    load_run,
    prepare_run_dir,
    read_config,
    settings_from_config,
    store_path,
    write_config,
)
from train.trainer import Trainer, retrieval_metrics, write_evaluation
from vsecore import console
from vsecore.device import DEVICE_HELP, resolve_device
from vsecore.errors import UserError, resume_hint
from vsecore.io import exclusive_lock

#: defaults of --alphabet-size / --image-dim for a --dry-run without data (COCO's lowercased
#: alphabet is about 70 symbols; VGG fc7 features have 4096 dimensions)
DRY_RUN_ALPHABET = 72
DRY_RUN_IMAGE_DIM = 4096
#: default --vocab-size of a word model's --dry-run without data: the SEAM paper's COCO vocabulary
DRY_RUN_VOCABULARY = 11360


def _chain_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", choices=("v1", "v2"), default=None,
                   help="CHAIN-VSE v1 (inception of character convolutions) or v2 (depthwise separable "
                        "convolutions) (default v1)")
    p.add_argument("--p", type=float, default=None,
                   help="width multiplier of the text encoder: p=1 has 256 filters per stream, p=0.5 has "
                        "128 (default 1.0)")


def _oecc_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", choices=("A", "B", "C", "D"), default=None,
                   help="OECC text encoder architecture A-D (paper, Table 1) (default D)")


# --- clmr / liwe (LIWE paper) ----------------------------------------------------------------------
#: region rows of a --dry-run without --features: the paper's 36 BUTD regions of 2,048 dimensions
DRY_RUN_REGIONS = (36, 2048)


def _comma_list(kind: type) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            return [kind(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None

    return parse


def _region_family_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eta", type=float, default=None,
                   help="hard-negative schedule: J = lambda J_max + (1 - lambda) J_sum with lambda = "
                        "1 - eta^iteration (default 0.991; 1: sum of hinges only, 0: max of hinges only)")
    p.add_argument("--langs", type=_comma_list(str), default=None, metavar="LANG[,LANG]",
                   help="languages of the image-text training captions (default: --lang only, as the "
                        "paper's Eq. 8 and LAVSE: other languages enter through --cross-lang); the test "
                        "evaluation is done per language")
    p.add_argument("--cross-lang", dest="cross_lang", type=_comma_list(str), default=None,
                   metavar="LANG[,LANG]",
                   help="add the cross-language loss over the dataset's pairs aligning --lang with each of "
                        "these languages (default: none)")


def _clmr_options(p: argparse.ArgumentParser) -> None:
    _region_family_options(p)


def _liwe_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=_comma_list(int), default=None, metavar="F1,F2",
                   help="fully connected layers of the character-built word embedder: LIWE(f1,f2) (default "
                        "128,256)")
    p.add_argument("--word-length", dest="word_length", type=int, default=None, metavar="C_W",
                   help="characters per word (longer words are cut) (default: the length covering 99.9%% of "
                        "the train split's distinct words; 26 for a --dry-run without --data)")
    _region_family_options(p)


REGION_FAMILIES = {
    "clmr": ("CLMR: word embeddings + BiGRU, non-local region image encoder, cosine, eta schedule, "
             "cross-language loss", _clmr_options),
    "liwe": ("LIWE: character-built word embeddings + BiGRU, non-local region image encoder, cosine, eta "
             "schedule, cross-language loss", _liwe_options),
}
# -------------------------------------------------------------------------------------------------------

def _word_options(p: argparse.ArgumentParser) -> None:
    """Options of the word-level families (seam, vse): how captions become word indices."""
    p.add_argument("--max-words", dest="max_words", type=int, default=None,
                   help="captions are cut to this many words (default 100)")
    p.add_argument("--min-word-count", dest="min_word_count", type=int, default=None,
                   help="words seen fewer times in the train split map to <unk> (default 1: every "
                        "train word)")


def _seam_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant", choices=("E", "C", "G"), default=None,
                   help="SEAM-E (attention over the word embeddings), SEAM-C (+ convolutions of width 2 "
                        "and 3) or SEAM-G (attention over a GRU's states) (default E)")
    p.add_argument("--hops", type=int, default=None,
                   help="attention hops h of each attention module (default: E 30, C 5, G 30)")
    p.add_argument("--penalty", type=float, default=None,
                   help="lambda, coefficient of the attention penalty ||AA^T - I||_F^2 (default 0)")
    p.add_argument("--gru-units", dest="gru_units", type=int, default=None,
                   help="GRU units of SEAM-G (default 512)")
    _word_options(p)


def _vse_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=("SH", "SH-bl", "MH", "MH-bl", "SOE", "SOE-bl", "MOE", "MOE-bl", "PH",
                                      "POE"), default=None,
                   help="the FNE paper's pipeline, with its table 1 settings as defaults: sum (S) or max (M) "
                        "of hinges, cosine (H) or order (OE); PH/POE train with the sum until validation "
                        "stops improving, then go on from the best checkpoint with the max; -bl: the "
                        "baselines' settings (default SH)")
    p.add_argument("--word-dim", dest="word_dim", type=int, default=None,
                   help="size of the word embedding (default: the --kind preset)")
    p.add_argument("--absolute", action=argparse.BooleanOptionalAction, default=None,
                   help="|.| on both sides before the L2 normalisation (default: the --kind preset)")
    p.add_argument("--finetune-lr", dest="finetune_lr", type=float, default=None,
                   help="learning rate of the second (max of hinges) phase of PH/POE (default: the preset; "
                        "POE 1e-4, PH --lr)")
    _word_options(p)


#: the families that train today, with the options only they take
FAMILY_OPTIONS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "chain": ("CHAIN-VSE: character inception text encoder, order embeddings", _chain_options),
    "oecc": ("OECC: order embeddings with character convolutions through time", _oecc_options),
    "seam": ("SEAM: self-attentive word-embedding text encoders (E, C, G), order embeddings", _seam_options),
    "vse": ("VSE pipelines of the FNE paper: word embedding + GRU on FNE or one-layer features "
            "(SH, MH, SOE, MOE, PH, POE)", _vse_options),
    **REGION_FAMILIES,
}


def _common_options(p: argparse.ArgumentParser) -> None:
    data = p.add_argument_group("data")
    data.add_argument("--data", metavar="PREPARED", default=None,
                      help="prepared dataset folder written by `prep` (required unless --pipeline gives it)")
    data.add_argument("--features", metavar="STORE[:global|:fne|:regions]", default=None,
                      help="feature store written by `features`, with the key of the features to use: "
                           "global or fne for chain/oecc/seam/vse (default: global if present, else fne), "
                           "regions for clmr/liwe")
    data.add_argument("--lang", default=None, help="language of the captions to train on (default en)")
    data.add_argument("--max-chars", dest="max_chars", type=int, default=None,
                      help="captions are cut to this many characters (default 256)")
    data.add_argument("--captions-per-epoch", dest="captions_per_epoch", choices=("all", "one"), default=None,
                      help="'all': every caption once per epoch (CHAIN-VSE, OECC, SEAM); 'one': one random "
                           "caption per image per epoch (FNE paper) (default all; vse one)")
    model = p.add_argument_group("model and loss")
    model.add_argument("--d", type=int, default=None, help="dimension of the joint embedding (default 1024)")
    model.add_argument("--measure", choices=("order", "cosine"), default=None,
                       help="similarity: order violation or cosine (default order)")
    model.add_argument("--order-sqrt", dest="order_sqrt", action=argparse.BooleanOptionalAction, default=None,
                       help="take the square root of the order violation, as the released code does "
                            "(default: the papers' squared form)")
    model.add_argument("--loss", choices=("sum", "max"), default=None,
                       help="sum of hinges over the contrastive examples, or the hardest only (default sum)")
    model.add_argument("--margin", type=float, default=None, help="contrastive margin alpha (default 0.05)")
    opt = p.add_argument_group("optimisation")
    opt.add_argument("--batch-size", dest="batch_size", type=int, default=None,
                     help="image-caption pairs per batch; the others are the contrastive examples "
                          "(default 128)")
    opt.add_argument("--lr", type=float, default=None, help="Adam learning rate (default 1e-3)")
    opt.add_argument("--lr-decay-patience", dest="lr_decay_patience", type=int, default=None,
                     help="divide the learning rate by 10 after this many epochs without a better "
                          "validation rsum (default 3)")
    opt.add_argument("--lr-schedule", dest="lr_schedule", choices=("plateau", "step", "constant"),
                     default=None,
                     help="plateau: /10 after --lr-decay-patience epochs without improvement; step: /10 "
                          "every --lr-step epochs; constant (default: plateau; seam step, vse constant)")
    opt.add_argument("--lr-step", dest="lr_step", type=int, default=None,
                     help="epochs between two /10 steps of --lr-schedule step (default 15)")
    opt.add_argument("--early-stop", dest="early_stop", type=int, default=None,
                     help="stop after this many epochs without a better validation rsum (default 10)")
    opt.add_argument("--epochs", type=int, default=None, help="maximum number of epochs (default 30)")
    opt.add_argument("--grad-clip", dest="grad_clip", type=float, default=None,
                     help="clip the gradient norm to this value; 0 disables (default 2.0)")
    opt.add_argument("--seed", type=int, default=None,
                     help="seed of initialisation and shuffling; on CPU a run is reproducible (default 0)")
    val = p.add_argument_group("validation")
    val.add_argument("--val-protocol", dest="val_protocol", choices=("1k", "5cv", "5k", "all"), default=None,
                     help="protocol of the per-epoch validation rsum (default all: every val image)")
    val.add_argument("--val-images", dest="val_images", type=int, default=None,
                     help="validate on the first N val images only (default: all)")
    run = p.add_argument_group("run")
    run.add_argument("--out", metavar="RUN_DIR", default=None,
                     help="run directory (default runs/<family>-<timestamp>)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in --out from its newest checkpoint, also one written mid-epoch")
    run.add_argument("--overwrite", action="store_true",
                     help="start over in an --out that already holds a run: the files the run wrote are "
                          "deleted; a folder holding anything else is refused")
    run.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, default=None,
                     help="also write checkpoints/last.pt every this many steps within an epoch "
                          "(default 200)")
    run.add_argument("--device", default=None, help=DEVICE_HELP)
    run.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                     help="bf16 autocast on CUDA (ignored on CPU) (default off)")
    run.add_argument("--workers", type=int, default=None,
                     help="worker processes that collate the batches (a DataLoader's; 0: in this "
                          "process)")
    run.add_argument("--dry-run", dest="dry_run", action="store_true",
                     help="build the model, print its parameter counts per part and exit")
    run.add_argument("--alphabet-size", dest="alphabet_size", type=int, default=None,
                     help=f"character alphabet size for --dry-run without --data (default "
                          f"{DRY_RUN_ALPHABET})")
    run.add_argument("--vocab-size", dest="vocab_size", type=int, default=None,
                     help=f"word vocabulary size for --dry-run of a word model without --data (default "
                          f"{DRY_RUN_VOCABULARY})")
    run.add_argument("--image-dim", dest="image_dim", type=int, default=None,
                     help=f"image feature dimension for --dry-run without --features (default "
                          f"{DRY_RUN_IMAGE_DIM})")
    add_pipeline_arguments(p)


#: a help text's own "(default ...)" note at its end, replaced by the resolved value
_DEFAULT_NOTE = re.compile(r"\s*\(default[^()]*(?:\([^()]*\)[^()]*)*\)\s*$")
#: options whose value is not a setting a run records (or has no single default)
_NOT_SETTINGS = ("out", "family", "data", "features", "pipeline", "pipelines")


def _shown(value: Any) -> str:
    """A setting as ``--help`` shows it: on/off, numbers as Python prints them, lists comma-separated."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def resolved_defaults(family: str) -> TrainSection:
    """The settings a run of ``family`` records for every option not given (schema defaults, then the
    family's own defaults, without a dataset: the vse ``--kind`` preset shows COCO's column)."""
    return with_family_defaults(TrainSection(family=family, out="RUN_DIR"), None)


def _show_resolved_defaults(parser: argparse.ArgumentParser, family: str) -> None:
    """Rewrite each setting's "(default ...)" in ``--help`` from :func:`resolved_defaults`, so the help
    and a run's ``config.json`` read one source (a family default shows as that family's value)."""
    resolved = resolved_defaults(family)
    preset_keys = set(vse_preset("SH", None)) if family == "vse" else set()
    for action in parser._actions:
        key = action.dest
        if key not in TrainSection.model_fields or key in _NOT_SETTINGS:
            continue
        value = getattr(resolved, key)
        text = _DEFAULT_NOTE.sub("", action.help or "")
        if value is None:
            action.help = text
            continue
        note = "; the --kind preset of the prepared dataset's column, COCO's without one" \
            if key in preset_keys else ""
        action.help = f"{text} (default {_shown(value)}{note})"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add one ``train <family>`` subcommand per family that trains today; ``--help`` shows each option's
    default as the family resolves it (:func:`resolved_defaults`)."""
    for family, (summary, own_options) in FAMILY_OPTIONS.items():
        p = subparsers.add_parser(
            family, help=summary, description=f"{summary}. Adam, learning rate /10 on a validation-rsum "
            "plateau or on a fixed step (--lr-schedule), early stopping; writes a run directory "
            "(config.json, checkpoints/best.pt and last.pt, metrics.jsonl, eval/test.json) that --resume "
            "continues exactly.")
        own_options(p.add_argument_group(f"{family} text encoder"))
        _common_options(p)
        _show_resolved_defaults(p, family)
        p.set_defaults(func=functools.partial(_command, family))


def _command(family: str, args: argparse.Namespace) -> int:
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
        # options not given again are those the run was started with
        stored = settings_from_config(read_config(args.out)["settings"])
        if stored.family != family:
            raise UserError(f"{args.out}: cannot resume: it is a '{stored.family}' run, not '{family}'")
        for key in stored.model_fields_set:
            if getattr(args, key, None) is None and hasattr(args, key) and key not in ("out", "family"):
                setattr(args, key, getattr(stored, key))
    settings = stage_settings("train", args, family=family)
    run_training(settings, resume=args.resume, overwrite=args.overwrite, dry_run=args.dry_run,
                 alphabet_size=args.alphabet_size, image_dim=args.image_dim, vocab_size=args.vocab_size)
    return 0


def _format_parameters(report: dict[str, int]) -> str:
    parts = [f"{k.replace('_', ' ')} {v:,}" for k, v in report.items() if k != "total"]
    return f"parameters: {', '.join(parts)}; total {report['total']:,}"


def _feature_shape(features: str) -> tuple[int, ...]:
    """Shape of one row of the features a spec names, from the store's metadata (no rows read)."""
    from features.store import FeatureStore, parse_spec

    path, key = parse_spec(feature_spec(features))
    store = FeatureStore(path)
    if key is None:
        key = "global" if store.has("global") else "fne"
    name = {"global": "global", "fne": "fne/ternary", "fne_raw": "fne/raw", "regions": "regions"}[key]
    if not store.has(name):
        raise UserError(f"{path}: no '{key}' features in this store")
    return tuple(int(v) for v in store.array(name).shape[1:])


def _seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_training(settings: TrainSection, resume: bool = False, overwrite: bool = False, dry_run: bool = False,
                 alphabet_size: int | None = None, image_dim: int | None = None,
                 vocab_size: int | None = None, log: Callable[[str], None] = console.info) -> Path:
    """Train (or with ``dry_run`` only build) the model ``settings`` describes; returns the run dir.

    ``resume`` continues ``settings.out`` from its newest checkpoint (a :class:`UserError` names
    the first setting that differs from the run's ``config.json``); ``overwrite`` starts over in
    an ``out`` that already holds a run. After training, the best checkpoint is evaluated on the
    test split (``eval/test.json``) and the table is printed.
    """
    if settings.family not in FAMILY_OPTIONS:
        raise UserError(f"family '{settings.family}' cannot be trained yet (available: "
                        f"{', '.join(FAMILY_OPTIONS)})")
    _check_numbers(settings, {"--alphabet-size": alphabet_size, "--image-dim": image_dim,
                              "--vocab-size": vocab_size})
    settings = _resolve_word_length(absolute_settings(with_family_defaults(settings,
                                                                           _dataset_name(settings.data))))
    run_dir = Path(settings.out)
    if dry_run:
        _dry_run(settings, alphabet_size, image_dim, vocab_size)
        return run_dir
    if not settings.data:
        raise UserError("--data is required (give it or use --pipeline)")
    if not settings.features:
        raise UserError("--features is required (give it or use --pipeline)")
    spec = model_spec(settings)
    feature_spec(settings.features, regions=spec.image_encoder != "linear")
    resolve_device(settings.device)  # a bad --device is an error before the run directory is made
    inputs = (settings.data, store_path(settings.features))
    run = RunDir(run_dir)
    run.check(resume, overwrite, inputs)  # before the lock: its file is a sibling of --out
    with exclusive_lock(run_dir, "the run directory"):
        prepare_run_dir(run_dir, resume=resume, overwrite=overwrite, inputs=inputs)
        with console.log_file(run.log), resume_hint(run.kept):
            _train(settings, spec, run_dir, resume, log)
    return run_dir


#: the largest seed numpy, torch and Python all take
_MAX_SEED = 2**32 - 1


def _check_numbers(settings: TrainSection, sizes: dict[str, int | None]) -> None:
    """One-line errors for numbers the schema lets through but the run cannot use: a non-finite float,
    a seed outside 0..2^32-1, a size or layer of 0 or less."""
    for key, value in settings.model_dump().items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, float) and not math.isfinite(v):
                raise UserError(f"--{key.replace('_', '-')} {v}: must be a finite number")
    if not 0 <= settings.seed <= _MAX_SEED:
        raise UserError(f"--seed {settings.seed}: must be between 0 and {_MAX_SEED}")
    if any(v < 1 for v in settings.layers or []):
        raise UserError(f"--layers {','.join(map(str, settings.layers))}: every layer needs at least 1 unit")
    if settings.word_length is not None and settings.word_length < 1:
        raise UserError(f"--word-length {settings.word_length}: must be at least 1")
    for option, value in sizes.items():
        if value is not None and value < 1:
            raise UserError(f"{option} {value}: must be at least 1")


def _resolve_word_length(settings: TrainSection) -> TrainSection:
    """A family that spells words in characters without ``word_length``: C_w from the train split's word
    lengths (:func:`train.models.liwe.word_length_from_statistics`), recorded in the run's settings."""
    if settings.word_length is not None or not settings.data:
        return settings
    if model_spec(settings).text_input != "word_chars":
        return settings
    from train.models.liwe import word_length_from_statistics

    counts = PreparedDataset.load(settings.data).words.counts
    resolved = settings.model_copy(update={"word_length": word_length_from_statistics(counts)})
    resolved.model_fields_set.add("word_length")
    return resolved
def _dataset_name(data: str | None) -> str | None:
    """The ``dataset`` field of a prepared dataset (``coco``, ``f8k``, ...), or None (no or bad data:
    the error comes when the data is read)."""
    if not data:
        return None
    try:
        return PreparedDataset.load(data).name
    except (UserError, OSError, ValueError):
        return None


def _train(settings: TrainSection, spec: ModelSpec, run_dir: Path, resume: bool,
           log: Callable[[str], None]) -> None:
    """:func:`run_training` once the run directory is locked and prepared (messages also in train.log)."""
    from train.models.vse import build_model
    from train.objectives import build_objective

    remove_stale_temporaries(RunDir(run_dir).checkpoints)
    device = resolve_device(settings.device)
    train_set, val_set, config = _load_data(settings, spec)
    pair_sets = _load_pairs(settings, train_set)
    if pair_sets:
        config["data"]["train_pairs"] = {f"{ps.lang}-{ps.other_lang}": len(ps) for ps in pair_sets}
    _seed_everything(settings.seed)
    model = build_model(settings, config["vocab_size"], config["feature_shape"], spec)
    config["parameters"] = model.parameter_report()
    objective = build_objective(settings)
    trainer = Trainer(settings, model, objective, train_set, val_set, run_dir, device, log=log,
                      pair_sets=pair_sets)
    if resume:
        check_same_config(run_dir, config)
        trainer.resume(log)
    write_config(run_dir, config)  # on resume: records the new device / epochs / checkpoint_every
    log(f"{settings.family}: {len(train_set):,} train captions ({train_set.lang}) of "
        f"{train_set.num_images:,} images, {len(val_set):,} val captions of {val_set.num_images:,} images, "
        f"on {device}")
    for ps in pair_sets:
        log(f"cross-language loss: {len(ps):,} train pairs {ps.lang}-{ps.other_lang}")
    skipped = train_set.skipped_images + val_set.skipped_images
    if skipped:
        log(f"skipped {skipped} images with invalid features (train {train_set.skipped_images}, "
            f"val {val_set.skipped_images})")
    log(_format_parameters(config["parameters"]))
    t0 = time.perf_counter()
    trainer.fit()
    log(f"training done in {time.perf_counter() - t0:.0f}s: best val rsum {trainer.best_rsum:.2f} "
        f"after {trainer.epoch} epochs; run directory {run_dir}")
    # the test evaluation reads the run back from disk, features included: drop the training copies
    # first, so a large (int8 FNE) feature array is never held twice
    del trainer, train_set, val_set, model
    evaluate_test(run_dir, settings, device, log)


def _dry_run(settings: TrainSection, alphabet_size: int | None, image_dim: int | None,
             vocab_size: int | None) -> None:
    """Build the model and print its parameter counts per part (results); sizes from the data when given."""
    from train.models.vse import build_model

    spec = model_spec(settings)
    dataset = PreparedDataset.load(settings.data) if settings.data else None
    if dataset is not None:
        vocab = codec_for(settings, dataset, spec.text_input).vocab_size
    elif spec.text_input == "words":
        vocab = vocab_size or DRY_RUN_VOCABULARY
    else:
        vocab = alphabet_size or DRY_RUN_ALPHABET
    if settings.features:
        shape = _feature_shape(settings.features)
    elif spec.image_encoder == "nonlocal_regions":
        shape = (DRY_RUN_REGIONS[0], image_dim or DRY_RUN_REGIONS[1])
    else:
        shape = (image_dim or DRY_RUN_IMAGE_DIM,)
    model = build_model(settings, vocab, shape, spec)
    what = "word vocabulary" if spec.text_input == "words" else "alphabet"
    dims = " x ".join(map(str, shape))
    console.result(f"{settings.family}: {what} {vocab}, image features {dims}, d {settings.d}")
    report = model.parameter_report()
    for part, count in report.items():
        label = part.replace("text_encoder.", "  ").replace("_", " ")
        console.result(f"  {label:<16} {count:>12,}")
    if spec.text_input == "words" and report.get("text_projection"):  # what SEAM's table 2 counts
        console.result(f"  {'text side':<16} {report['text_encoder'] + report['text_projection']:>12,}"
                       "  (text encoder + text projection)")
    if spec.text_input == "word_chars":  # the paper's ~50x: a CLMR word table for the same data
        from train.models.liwe import format_word_embedding_report, word_embedding_report

        words = len(dataset.words) if dataset is not None else (vocab_size or DRY_RUN_VOCABULARY)
        console.result(format_word_embedding_report(word_embedding_report(
            vocab, spec.text_kwargs["word_length"], spec.text_kwargs["layers"], words)))


def _load_data(settings: TrainSection, spec: ModelSpec) -> tuple[CaptionSet, CaptionSet, dict[str, Any]]:
    """The train and val caption sets, and the run's ``config.json`` content describing them."""
    dataset = PreparedDataset.load(settings.data)
    codec = codec_for(settings, dataset, spec.text_input)
    x, valid = read_features(settings.features, dataset)
    counts = read_region_counts(settings.features)
    train_set = load_caption_set(dataset, x, valid, "train", settings.train_langs, settings.max_chars,
                                 codec=codec, counts=counts)
    val_set = load_caption_set(dataset, x, valid, "val", settings.lang, settings.max_chars,
                               max_images=settings.val_images, codec=codec, counts=counts)
    _check_splits(settings, dataset, valid, val_set)
    fingerprints = {**dataset_fingerprint(settings.data), **_words_fingerprint(settings.data, spec),
                    "features": features_fingerprint(x, valid)}
    config: dict[str, Any] = {
        "family": settings.family,
        "settings": settings.model_dump(),
        "text_input": spec.text_input,
        "vocab_size": codec.vocab_size,
        "feature_shape": [int(v) for v in x.shape[1:]],
        "fingerprints": fingerprints,
        # size and mtime of the hashed files: a reader of the run whose files still have them skips the hash
        "fingerprint_stats": file_stats(settings.data, [k for k in fingerprints if k != "features"]),
        "data": {split: {"images": cs.num_images, "captions": len(cs), "skipped_images": cs.skipped_images}
                 for split, cs in (("train", train_set), ("val", val_set))},
        "code_version": _code_version(),
    }
    return train_set, val_set, config


def _check_splits(settings: TrainSection, dataset: PreparedDataset, valid: np.ndarray, val_set: CaptionSet
                  ) -> None:
    """Before the first step: the val split and the test split (in every language the test evaluation
    uses) have images with valid features and captions, enough for ``val_protocol``; an empty or
    all-invalid split would otherwise be found only after training."""
    def usable(split: str, lang: str) -> int:
        return len({s.imgid for s in dataset.sentences_of(split, lang) if valid[s.imgid]})

    needs = [("val", settings.lang, val_set.num_images)]
    needs += [("test", lang, usable("test", lang))
              for lang in dict.fromkeys([settings.lang, *settings.train_langs, *settings.cross_lang])]
    for split, lang, n in needs:
        if n == 0:
            use = "validate each epoch" if split == "val" else "evaluate after training"
            raise UserError(f"{settings.data}: the {split} split has no image with valid features and a "
                            f"caption in '{lang}' ({_split_counts(dataset, split, valid)}); the run needs "
                            f"one to {use}")
        try:  # too few images for the protocol: say so now, not after the first epoch
            protocol_folds(settings.val_protocol, n)
        except UserError:
            raise UserError(f"--val-protocol {settings.val_protocol} needs more {split} images than the {n} "
                            f"usable ones (use --val-protocol all)") from None


def _split_counts(dataset: PreparedDataset, split: str, valid: np.ndarray) -> str:
    rows = dataset.image_rows(split)
    return f"{len(rows)} images, {sum(bool(valid[r]) for r in rows)} with valid features"


def _load_pairs(settings: TrainSection, train_set: CaptionSet) -> list[PairSet]:
    """The train split's aligned pairs of ``lang`` with each ``cross_lang`` (the cross-language loss)."""
    if not settings.cross_lang:
        return []
    dataset = PreparedDataset.load(settings.data)
    return [load_pair_set(dataset, "train", settings.lang, other, train_set.codec)
            for other in settings.cross_lang]
def _words_fingerprint(data: str, spec: ModelSpec) -> dict[str, str]:
    """``{"words_json": sha256}`` for word models (their vocabulary is ``words.json``), else ``{}``."""
    if spec.text_input != "words":
        return {}
    from prep.dataset import WORDS_FILE
    from vsecore.io import sha256_file

    return {"words_json": sha256_file(Path(data) / WORDS_FILE)}


def evaluate_test(run_dir: Path, settings: TrainSection, device: torch.device,
                  log: Callable[[str], None] = console.info) -> None:
    """Evaluate the best checkpoint on the test split, in each language the run trained on (``lang`` first,
    then ``langs`` and ``cross_lang``, as LAVSE validates on every language of a run): ``eval/test.json`` and
    one printed table per language.

    ``eval/test.json`` keeps ``lang``'s results at the top level (``images``, ``captions``, ``protocols``)
    and every language's under ``languages``.
    """
    if not RunDir(run_dir).best.is_file():
        log("no best checkpoint (no epoch finished); test evaluation skipped")
        return
    from train.report import format_results, results_json

    run = load_run(run_dir, "best", str(device))
    langs = list(dict.fromkeys([settings.lang, *settings.train_langs, *settings.cross_lang]))
    per_lang: dict[str, dict[str, Any]] = {}
    for lang in langs:
        emb = embed_split(run, "test", lang=lang)
        results = retrieval_metrics(emb.images, emb.captions, emb.caption_image, settings, device=run.device)
        per_lang[lang] = {"images": int(emb.images.shape[0]), "captions": int(emb.captions.shape[0]),
                          "protocols": results_json(results)}
        which = f", {lang} captions" if len(langs) > 1 else ""
        title = f"{run_dir.name}: test split{which}, best checkpoint (epoch {run.epoch})"
        console.result(format_results(results, title=title))
    write_evaluation(RunDir(run_dir).test_eval, {
        "split": "test", "checkpoint": "best", "epoch": run.epoch, "measure": settings.measure,
        "order_sqrt": settings.order_sqrt, "lang": settings.lang, **per_lang[settings.lang],
        "languages": per_lang})


def _code_version() -> str:
    try:
        from features.store import code_version
    except ImportError:
        import prep

        return prep.__version__
    return code_version()
