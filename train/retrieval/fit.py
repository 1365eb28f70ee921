"""Training one run of any family: :func:`run_training` (``train <family>``'s library; the command itself is
:mod:`train.cli.fit`, and the pipeline runner, ``train compare`` and the tests call this directly).

Every family shares the trainer (:mod:`train.engine.trainer`), the data pipeline (:mod:`train.engine.data`)
and the run directory (:mod:`train.config.run`); a family (its :class:`train.models.family.Family`) only adds
its own settings, whose options are generated (:func:`train.cli.fit_options.family_options`), and its
defaults (SEAM's step schedule, the FNE paper's presets), which are resolved before the run starts and
recorded in its ``config.json``. Every registered family gets a subcommand.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from features.store.core import FeatureStore
from features.store.read import layout_digest
from features.store.spec import SPEC_ARRAYS, FeatureSpec
from prep.dataset import WORDS_FILE, PreparedDataset
from train.config.run import (
    DATASET_FILES,
    absolute_settings,
    check_same_config,
    dataset_fingerprint,
    features_fingerprint,
    file_stats,
    prepare_run_dir,
    read_config,
    run_log,
    store_path,
    write_config,
)
from train.engine.codecs import codec_for
from train.engine.data import (
    CaptionSet,
    PairSet,
    feature_spec,
    load_caption_set,
    load_pair_set,
    read_features,
    read_region_counts,
)
from train.engine.settings import (
    DRY_RUN_ALPHABET,
    DRY_RUN_IMAGE_DIM,
    DRY_RUN_REGIONS,
    DRY_RUN_VOCABULARY,
    TrainSection,
    first_non_finite,
)
from train.engine.trainer import EpochHook, Trainer, write_evaluation
from train.models.family import (
    build_objective,
    family_names,
    model_spec,
    with_data_defaults,
    with_family_defaults,
)
from train.models.joint import build_model
from train.models.liwe import format_word_embedding_report, word_embedding_report
from train.models.registry import ModelSpec
from train.retrieval.evaluate import protocol_folds
from train.retrieval.evaluate.entry import Embedded, evaluate_retrieval
from train.retrieval.evaluate.tables import format_results, results_json
from train.retrieval.loaded import embed_split
from train.retrieval.open import load_run
from train.retrieval.validation import retrieval_scorer
from train.run.checkpoint import (
    remove_stale_temporaries,
)
from train.run.layout import RunDir
from vsecore import console
from vsecore.device import resolve_device
from vsecore.errors import UserError, resume_hint
from vsecore.io import exclusive_lock, sha256_file
from vsecore.version import code_version


def _format_parameters(report: dict[str, int]) -> str:
    parts = [f"{k.replace('_', ' ')} {v:,}" for k, v in report.items() if k != "total"]
    return f"parameters: {', '.join(parts)}; total {report['total']:,}"


def _feature_shape(features: str) -> tuple[int, ...]:
    """Shape of one row of the features a spec names, from the store's metadata (no rows read)."""
    spec = FeatureSpec.parse(feature_spec(features))
    store = FeatureStore(spec.store)
    key = spec.key_in(store.has)  # the one default-key rule
    if not store.has(SPEC_ARRAYS[key]):
        raise UserError(f"{spec.store}: no '{key}' features in this store")
    return tuple(int(v) for v in store.array(SPEC_ARRAYS[key]).shape[1:])


def _seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_training(settings: TrainSection, resume: bool = False, overwrite: bool = False, dry_run: bool = False,
                 alphabet_size: int | None = None, image_dim: int | None = None,
                 vocab_size: int | None = None, log: Callable[[str], None] = console.info,
                 on_epoch: EpochHook | None = None, test_table: bool = True) -> Path:
    """Train (or with ``dry_run`` only build) the model ``settings`` describes; returns the run dir.

    ``resume`` continues ``settings.out`` from its newest checkpoint (a :class:`UserError` names
    the first setting that differs from the run's ``config.json``); ``overwrite`` starts over in
    an ``out`` that already holds a run. After training, the best checkpoint is evaluated on the
    test split (``eval/test.json``) and the table is printed (``test_table``; else only logged with ``-v``
    and in train.log: a pipeline that evaluates next prints its own). ``on_epoch``: called after each epoch
    with its ``metrics.jsonl`` record (the Python API's ``vse.train``).
    """
    if settings.family not in family_names():
        raise UserError(f"family '{settings.family}' cannot be trained (available: "
                        f"{', '.join(family_names())})")
    _check_numbers(settings, {"--alphabet-size": alphabet_size, "--image-dim": image_dim,
                              "--vocab-size": vocab_size})
    dataset = load_dataset_or_none(settings.data)  # read once: the defaults and the run both need it
    settings = absolute_settings(with_family_defaults(settings, dataset.name if dataset else None))
    if dataset is not None:
        settings = with_data_defaults(settings, dataset)
    run_dir = Path(settings.out)
    if dry_run:
        _dry_run(settings, alphabet_size, image_dim, vocab_size, dataset)
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
        with run_log(run_dir) as started, resume_hint(run.kept):
            _train(settings, spec, run_dir, resume, log, dataset, started, on_epoch, test_table)
    return run_dir


#: the largest seed numpy, torch and Python all take
_MAX_SEED = 2**32 - 1


def _check_numbers(settings: TrainSection, sizes: dict[str, int | None]) -> None:
    """One-line errors for numbers the schema lets through but the run cannot use: a non-finite float,
    a seed outside 0..2^32-1, a size or layer of 0 or less."""
    if (bad := first_non_finite(settings)) is not None:
        raise UserError(f"--{bad[0].replace('_', '-')} {bad[1]}: must be a finite number")
    if not 0 <= settings.seed <= _MAX_SEED:
        raise UserError(f"--seed {settings.seed}: must be between 0 and {_MAX_SEED}")
    for option, value in sizes.items():
        if value is not None and value < 1:
            raise UserError(f"{option} {value}: must be at least 1")


def load_dataset_or_none(data: str | None) -> PreparedDataset | None:
    """The prepared dataset at ``data``, or None (no or bad data: the error comes when the data is read)."""
    if not data:
        return None
    try:
        return PreparedDataset.load(data)
    except (UserError, OSError, ValueError):
        return None


def dataset_name(data: str | None) -> str | None:
    """The ``dataset`` field of a prepared dataset (``coco``, ``f8k``, ...), or None (no or bad data)."""
    dataset = load_dataset_or_none(data)
    return dataset.name if dataset is not None else None


def _train(settings: TrainSection, spec: ModelSpec, run_dir: Path, resume: bool,
           log: Callable[[str], None], dataset: PreparedDataset | None, started: Callable[[], None],
           on_epoch: EpochHook | None = None, test_table: bool = True) -> None:
    """:func:`run_training` once the run directory is locked and prepared (messages also in train.log, from
    ``started()`` on, called once a new run has started); ``dataset`` is the prepared dataset if already
    read (None: read here, its error raised here)."""
    remove_stale_temporaries(RunDir(run_dir).checkpoints)
    device = resolve_device(settings.device)
    dataset = dataset if dataset is not None else PreparedDataset.load(settings.data)
    train_set, val_set, config = _load_data(settings, spec, dataset)
    pair_sets = _load_pairs(settings, train_set, dataset)
    if pair_sets:
        config["data"]["train_pairs"] = {f"{ps.lang}-{ps.other_lang}": len(ps) for ps in pair_sets}
    _seed_everything(settings.seed)
    model = build_model(settings, config["vocab_size"], config["feature_shape"], spec)
    config["parameters"] = model.parameter_report()
    objective = build_objective(settings)
    trainer = Trainer(settings, model, objective, train_set, val_set, run_dir, device, log=log,
                      pair_sets=pair_sets, scorer=retrieval_scorer(settings, device), on_epoch=on_epoch)
    if resume:
        if "features_layout" not in (read_config(run_dir).get("fingerprints") or {}):
            config["fingerprints"].pop("features_layout")  # a run from before it was recorded resumes
        check_same_config(run_dir, config)
        trainer.resume(log)
    write_config(run_dir, config)  # starts a new run; on resume: records the new device / epochs / ...
    started()
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
        f"after {trainer.epoch} epoch{'' if trainer.epoch == 1 else 's'}; run directory {run_dir}")
    # the test evaluation reads the run back from disk, features included: drop the training copies
    # first, so a large (int8 FNE) feature array is never held twice
    del trainer, train_set, val_set, model
    evaluate_after_training(run_dir, settings, device, log, table=test_table)


def _dry_run(settings: TrainSection, alphabet_size: int | None, image_dim: int | None,
             vocab_size: int | None, dataset: PreparedDataset | None) -> None:
    """Build the model and print its parameter counts per part (results); sizes from the data when given
    (``dataset``: already read, or None: read here)."""
    spec = model_spec(settings)
    if dataset is None and settings.data:
        dataset = PreparedDataset.load(settings.data)
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
        words = len(dataset.words) if dataset is not None else (vocab_size or DRY_RUN_VOCABULARY)
        console.result(format_word_embedding_report(word_embedding_report(
            vocab, spec.text_kwargs["word_length"], spec.text_kwargs["layers"], words)))


def _load_data(settings: TrainSection, spec: ModelSpec, dataset: PreparedDataset
               ) -> tuple[CaptionSet, CaptionSet, dict[str, Any]]:
    """The train and val caption sets of ``dataset`` (``settings.data``), and the run's ``config.json``
    content describing them."""
    codec = codec_for(settings, dataset, spec.text_input)
    x, valid = read_features(settings.features, dataset)
    counts = read_region_counts(settings.features)
    train_set = load_caption_set(dataset, x, valid, "train", settings.train_langs, settings.max_chars,
                                 codec=codec, counts=counts)
    val_set = load_caption_set(dataset, x, valid, "val", settings.lang, settings.max_chars,
                               max_images=settings.val_images, codec=codec, counts=counts)
    _check_splits(settings, dataset, valid, val_set)
    fingerprints = {**dataset_fingerprint(settings.data), **_words_fingerprint(settings.data, spec),
                    "features": features_fingerprint(x, valid),
                    "features_layout": layout_digest(settings.features)}
    config: dict[str, Any] = {
        "family": settings.family,
        "settings": settings.model_dump(),
        "text_input": spec.text_input,
        "vocab_size": codec.vocab_size,
        "feature_shape": [int(v) for v in x.shape[1:]],
        "fingerprints": fingerprints,
        # size and mtime of the hashed files: a reader of the run whose files still have them skips the hash
        "fingerprint_stats": file_stats(settings.data, [k for k in fingerprints if k in DATASET_FILES]),
        "data": {split: {"images": cs.num_images, "captions": len(cs), "skipped_images": cs.skipped_images}
                 for split, cs in (("train", train_set), ("val", val_set))},
        "code_version": code_version(),
    }
    return train_set, val_set, config


def _check_splits(settings: TrainSection, dataset: PreparedDataset, valid: np.ndarray, val_set: CaptionSet
                  ) -> None:
    """Before the first step: the val split and the test split (in every language the test evaluation
    uses) have images with valid features and captions, enough for ``val_protocol``; an empty or
    all-invalid split would otherwise be found only after training."""
    def usable(split: str, lang: str) -> int:  # images with valid features and a caption in ``lang``
        return int(np.asarray(valid, dtype=bool)[dataset.captioned_rows(split, lang)].sum())

    needs = [("val", settings.lang, val_set.num_images)]
    needs += [("test", lang, usable("test", lang))
              for lang in dict.fromkeys([settings.lang, *settings.train_langs, *settings.cross_langs])]
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


def _load_pairs(settings: TrainSection, train_set: CaptionSet, dataset: PreparedDataset) -> list[PairSet]:
    """The train split's aligned pairs of ``lang`` with each ``cross_lang`` (the cross-language loss)."""
    if not settings.cross_langs:
        return []
    return [load_pair_set(dataset, "train", settings.lang, other, train_set.codec)
            for other in settings.cross_langs]


def _words_fingerprint(data: str, spec: ModelSpec) -> dict[str, str]:
    """``{"words_json": sha256}`` for word models (their vocabulary is ``words.json``), else ``{}``."""
    if spec.text_input != "words":
        return {}
    return {"words_json": sha256_file(Path(data) / WORDS_FILE)}


def evaluate_after_training(run_dir: Path, settings: TrainSection, device: torch.device,
                            log: Callable[[str], None] = console.info, table: bool = True) -> None:
    """Evaluate the best checkpoint on the test split under ``val_protocol``, in each language the run
    trained on (``lang`` first, then ``langs`` and ``cross_lang``, as LAVSE validates on every language of a
    run), through the one evaluation entry (:func:`train.retrieval.evaluate.entry.evaluate_retrieval`):
    ``eval/test.json`` and one printed table per language.

    ``table``: print each table (else a ``-v`` detail, always in train.log).
    ``eval/test.json`` keeps ``lang``'s results at the top level (``images``, ``captions``, ``protocols``)
    and every language's under ``languages``.
    """
    if not RunDir(run_dir).best.is_file():
        log("no best checkpoint (no epoch finished); test evaluation skipped")
        return
    run = load_run(run_dir, "best", str(device))
    langs = list(dict.fromkeys([settings.lang, *settings.train_langs, *settings.cross_langs]))
    per_lang: dict[str, dict[str, Any]] = {}
    for lang in langs:
        emb = embed_split(run, "test", lang=lang)
        embedded = Embedded(emb.images, emb.captions, settings.measure, settings.order_sqrt)
        # a pipeline's evaluate stage prints the table and its warnings next: here they go to train.log (-v)
        quiet = {} if table else {"log": console.detail}
        results = evaluate_retrieval(embedded, emb.caption_image, (settings.val_protocol,), device=run.device,
                                     **quiet)
        per_lang[lang] = {"images": int(emb.images.shape[0]), "captions": int(emb.captions.shape[0]),
                          "protocols": results_json(results)}
        which = f", {lang} captions" if len(langs) > 1 else ""
        title = f"{run_dir.name}: test split{which}, best checkpoint (epoch {run.epoch})"
        (console.result if table else console.detail)(format_results(results, title=title))
    write_evaluation(RunDir(run_dir).test_eval, {
        "split": "test", "checkpoint": "best", "epoch": run.epoch, "measure": settings.measure,
        "order_sqrt": settings.order_sqrt, "lang": settings.lang, **per_lang[settings.lang],
        "languages": per_lang})
