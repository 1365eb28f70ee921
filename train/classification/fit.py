"""Text classification with the registered text encoders (CHAIN-VSE section 5, table 5).

"We adapt CHAIN-VSE by replacing the multimodal embedding layer with a fully-connected softmax
layer": a registered text encoder (the one a retrieval family builds: ``chain`` v1/v2, ``oecc`` A-D,
``seam`` E/C/G, ``gru`` = word embedding + GRU) reads the text, dropout, then one linear layer to the
classes; cross-entropy; Adam. The loop, checkpoints, exact resume, ``metrics.jsonl``, curves and
early stopping are the retrieval trainer's (:class:`train.engine.trainer.Trainer`), scored by the
validation accuracy instead of the rsum. The run directory has the same layout (``config.json``
with ``"task": "classify"``, ``checkpoints/best.pt`` and ``last.pt``, ``metrics.jsonl``,
``train.log``, ``curves.png``, ``eval/test.json``) and the same lock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prep.dataset import CHARS_FILE, DATASET_FILE, WORDS_FILE
from prep.textcls import TextClsDataset
from train.classification.evaluate import evaluate_run
from train.classification.model import (
    TASK,
    ClassificationObjective,
    LabelledTexts,
    NoisyTexts,
    build_classifier,
    classifier_codec,
    evaluate_texts,
    labelled_texts,
    with_training_noise,
)
from train.config.run import (
    check_same_config,
    prepare_run_dir,
    run_log,
    write_config,
)
from train.engine.codecs import TextCodec
from train.engine.settings import DRY_RUN_ALPHABET, ClassifySection
from train.engine.trainer import Trainer
from train.models.classifier import encoder_spec
from train.run.checkpoint import remove_stale_temporaries
from train.run.layout import RunDir
from vsecore import console
from vsecore.device import resolve_device
from vsecore.errors import UserError, resume_hint
from vsecore.io import exclusive_lock, sha256_file
from vsecore.version import code_version

#: the paper's size of its classifiers ("about 1.5M parameters", section 5)
PAPER_PARAMETERS = 1_500_000
#: the vocabulary the paper gives its word-level peers on DBPedia and Tweets (section 5)
PAPER_WORD_VOCABULARY = 200_000


class ClassificationTrainer(Trainer):
    """The retrieval trainer, validated by accuracy (%): ``rsum`` in its records holds the accuracy,
    written to ``metrics.jsonl`` as ``val_accuracy`` / ``best_val_accuracy``."""

    score_label = "val accuracy"
    items = "texts"

    def __init__(self, *args: Any, labels: Sequence[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.labels = list(labels)

    def _train_epoch(self) -> None:
        # --train-noise: the epoch about to run (also after a resume) decides each text's noise
        if isinstance(self.train_set, NoisyTexts):
            self.train_set.epoch = self.epoch
        super()._train_epoch()

    def validate(self) -> tuple[float, dict[str, Any]]:
        """Accuracy (%) on the validation texts and ``{"accuracy", "macro_f1"}``."""
        m = evaluate_texts(self.model, self.val_set, self.labels, self.device, self.settings.amp)
        return m["accuracy"], {"accuracy": m["accuracy"], "macro_f1": m["macro_f1"]}

    def metrics_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """An epoch's line of ``metrics.jsonl`` with the score under its name (accuracy, texts)."""
        rename = {"rsum": "val_accuracy", "best_rsum": "best_val_accuracy", "captions": "texts",
                  "captions_per_s": "texts_per_s"}
        return {rename.get(k, k): v for k, v in record.items()}


def _config(settings: ClassifySection, dataset: TextClsDataset, codec: TextCodec,
            sets: dict[str, LabelledTexts]) -> dict[str, Any]:
    root = Path(settings.data)
    return {
        "task": TASK, "settings": settings.model_dump(), "text_input": codec.kind,
        "vocab_size": codec.vocab_size, "labels": dataset.labels,
        "fingerprints": {"dataset_json": sha256_file(root / DATASET_FILE),
                         "chars_json": sha256_file(root / CHARS_FILE),
                         "words_json": sha256_file(root / WORDS_FILE)},
        "data": {split: {"texts": len(ts)} for split, ts in sets.items()},
        "code_version": code_version(),
    }


def absolute(settings: ClassifySection) -> ClassifySection:
    """A copy with ``data`` and ``out`` absolute."""
    update = {"out": os.path.abspath(settings.out)}
    if settings.data:
        update["data"] = os.path.abspath(settings.data)
    return settings.model_copy(update=update)


def run_classification(settings: ClassifySection, resume: bool = False, overwrite: bool = False,
                       dry_run: bool = False, vocab_size: int | None = None, num_classes: int | None = None,
                       log: Callable[[str], None] = console.info) -> Path:
    """Train (or with ``dry_run`` only build and count) the classifier of ``settings``; the run dir.

    After training, the best checkpoint is evaluated on the test split (``eval/test.json``).
    """
    settings = absolute(settings)
    run_dir = Path(settings.out)
    if dry_run:
        dry_run_report(settings, vocab_size, num_classes)
        return run_dir
    run = RunDir(run_dir)
    if resume:  # --resume where no run started says so, before asking for the data a new one needs
        run.check(resume, overwrite)
    if not settings.data:
        raise UserError("--data is required (give it or use --pipeline)")
    resolve_device(settings.device)
    with exclusive_lock(run_dir, "the run directory"):
        prepare_run_dir(run_dir, resume=resume, overwrite=overwrite)
        # a stop anywhere (data load, training, the final test evaluation) says what the run kept
        with run_log(run_dir) as started, resume_hint(run.kept):
            _train(settings, run_dir, resume, log, started)
    return run_dir


def _train(settings: ClassifySection, run_dir: Path, resume: bool, log: Callable[[str], None],
           started: Callable[[], None]) -> None:
    import random

    remove_stale_temporaries(RunDir(run_dir).checkpoints)
    device = resolve_device(settings.device)
    dataset = TextClsDataset.load(settings.data)
    codec = classifier_codec(settings, dataset)
    sets = {split: labelled_texts(dataset, split, codec) for split in ("train", "val")}
    if not len(sets["val"]):
        raise UserError(f"{settings.data}: the val split is empty (prep textcls --val-fraction)")
    config = _config(settings, dataset, codec, sets)
    random.seed(settings.seed)
    np.random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    model = build_classifier(settings, codec.vocab_size, len(dataset.labels))
    config["parameters"] = model.parameter_report()
    train = with_training_noise(sets["train"], settings.train_noise, settings.seed)
    trainer = ClassificationTrainer(settings, model, ClassificationObjective(), train, sets["val"],
                                    run_dir, device, log=log, labels=dataset.labels)
    if resume:
        check_same_config(run_dir, config)
        trainer.resume(log)
    write_config(run_dir, config)  # starts a new run (its marker and config.json in one step)
    started()
    p = config["parameters"]
    log(f"classify {settings.encoder}: {len(sets['train']):,} train / {len(sets['val']):,} val texts of "
        f"{dataset.name}, {len(dataset.labels)} classes, {codec.kind} input ({codec.vocab_size:,} symbols), "
        f"on {device}; parameters: text encoder {p['text_encoder']:,}, head {p['head']:,}, total "
        f"{p['total']:,}")
    t0 = time.perf_counter()
    trainer.fit()
    log(f"training done in {time.perf_counter() - t0:.0f}s: best val accuracy {trainer.best_rsum:.2f}% "
        f"after {trainer.epoch} epoch{'' if trainer.epoch == 1 else 's'}; run directory {run_dir}")
    del trainer
    if not RunDir(run_dir).best.is_file():
        log("no best checkpoint (no epoch finished); test evaluation skipped")
        return
    # the one evaluation of a run (train evaluate --run's), into eval/test.json
    evaluate_run(run_dir, "test", "best", str(device), json_path=RunDir(run_dir).test_eval)


def dry_run_report(settings: ClassifySection, vocab_size: int | None = None,
                   num_classes: int | None = None) -> dict[str, int]:
    """Build the classifier and print its parameter counts beside the paper's and a word model's."""
    spec = encoder_spec(settings)
    labels = None
    if settings.data:
        dataset = TextClsDataset.load(settings.data)
        vocab = classifier_codec(settings, dataset).vocab_size
        labels = len(dataset.labels)
    else:
        vocab = vocab_size or (DRY_RUN_ALPHABET if spec.text_input == "chars" else PAPER_WORD_VOCABULARY)
    classes = num_classes or labels or 4
    model = build_classifier(settings, vocab, classes)
    report = model.parameter_report()
    what = "alphabet" if spec.text_input == "chars" else "word vocabulary"
    console.result(f"classify {settings.encoder} ({spec.text_encoder}): {what} {vocab:,}, {classes} classes")
    console.result(f"  {'text encoder':<16} {report['text_encoder']:>12,}")
    console.result(f"  {'softmax head':<16} {report['head']:>12,}")
    console.result(f"  {'total':<16} {report['total']:>12,}")
    console.result(f"  paper (CHAIN-VSE section 5): about {PAPER_PARAMETERS:,} parameters")
    words = PAPER_WORD_VOCABULARY * settings.word_dim
    console.result(f"  a {PAPER_WORD_VOCABULARY:,}-word embedding model: {words:,} parameters in its "
                   f"{settings.word_dim}-d embedding table alone ({words / report['total']:.0f}x this model)")
    return report


