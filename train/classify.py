"""Text classification with the registered text encoders (CHAIN-VSE section 5, table 5).

"We adapt CHAIN-VSE by replacing the multimodal embedding layer with a fully-connected softmax
layer": a registered text encoder (the one a retrieval family builds: ``chain`` v1/v2, ``oecc`` A-D,
``seam`` E/C/G, ``gru`` = word embedding + GRU) reads the text, dropout, then one linear layer to the
classes; cross-entropy; Adam. The loop, checkpoints, exact resume, ``metrics.jsonl``, curves and
early stopping are the retrieval trainer's (:class:`train.trainer.Trainer`), scored by the
validation accuracy instead of the rsum. The run directory has the same layout (``config.json``
with ``"task": "classify"``, ``checkpoints/best.pt`` and ``last.pt``, ``metrics.jsonl``,
``train.log``, ``curves.png``, ``eval/test.json``) and the same lock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from prep.dataset import CHARS_FILE, DATASET_FILE, WORDS_FILE
from prep.textcls import TextClsDataset
from train.checkpoint import load_checkpoint, remove_stale_temporaries
from train.data import TextCodec, codec_for
from train.inference import embed_codes
from train.models.family import model_spec
from train.models.registry import ModelSpec, count_parameters, create_text_encoder
from train.rundir import RunDir
from train.runs import (
    RESUMABLE_CHANGES,
    classify_settings_from_config,
    prepare_run_dir,
    read_config,
    write_config,
)
from train.settings import ClassifySection
from train.textcls_metrics import classification_metrics, format_metrics
from train.trainer import Trainer, write_evaluation
from vsecore import console
from vsecore.device import resolve_device
from vsecore.errors import UserError
from vsecore.io import exclusive_lock, sha256_file

TASK = "classify"
#: the paper's size of its classifiers ("about 1.5M parameters", section 5)
PAPER_PARAMETERS = 1_500_000
#: the vocabulary the paper gives its word-level peers on DBPedia and Tweets (section 5)
PAPER_WORD_VOCABULARY = 200_000
#: ``--encoder`` -> the retrieval family whose registered text encoder it is
ENCODER_FAMILY = {"chain": "chain", "oecc": "oecc", "seam": "seam", "gru": "vse"}


class TextBatch(NamedTuple):
    """A batch of labelled texts (what :class:`ClassificationObjective` reads)."""

    text: torch.Tensor  # (B, T) int64 (chars or words), padded with 0
    lengths: torch.Tensor  # (B,) int64, >= 1
    labels: torch.Tensor  # (B,) int64, 0-based class


@dataclass
class LabelledTexts:
    """The texts of one split, encoded by the run's codec, with their labels."""

    codes: list[np.ndarray]
    labels: np.ndarray  # (M,) int64
    codec: TextCodec
    texts: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.codes)

    def batch(self, indices: Sequence[int] | np.ndarray) -> TextBatch:
        """The texts ``indices`` collated: :class:`TextBatch`."""
        idx = [int(k) for k in indices]
        tokens, lengths = self.codec.collate([self.codes[k] for k in idx])
        return TextBatch(tokens, lengths, torch.from_numpy(self.labels[idx]))


def encoder_spec(settings: ClassifySection) -> ModelSpec:
    """The :class:`ModelSpec` the encoder's retrieval family builds (its registered encoder and kwargs)."""
    s = settings
    view = SimpleNamespace(family=ENCODER_FAMILY[s.encoder], version=s.version, p=s.p, arch=s.arch,
                           variant=s.variant, hops=s.hops, penalty=s.penalty, gru_units=s.gru_units,
                           d=s.gru_units, word_dim=s.word_dim, absolute=False)
    return model_spec(view)


class TextClassifier(nn.Module):
    """Text encoder -> dropout -> linear softmax layer: ``tokens, lengths (B,) -> logits (B, K)``."""

    def __init__(self, encoder: nn.Module, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.output_dim, num_classes)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``tokens (B, T) long, lengths (B,) long -> logits (B, num_classes)`` (padding masked by the
        encoder)."""
        return self.head(self.dropout(self.encoder(tokens, lengths)))

    #: the trainer's text helpers (:func:`train.inference.embed_codes`) read a model through this name
    encode_captions = forward

    def penalty(self) -> torch.Tensor | None:
        """The encoder's regulariser of the last forward (SEAM's attention penalty), or None."""
        return getattr(self.encoder, "penalty", None)

    def parameter_report(self) -> dict[str, int]:
        """Trainable parameters: ``{text_encoder, head, total}``."""
        enc, head = count_parameters(self.encoder), count_parameters(self.head)
        return {"text_encoder": enc, "head": head, "total": enc + head}


def build_classifier(settings: ClassifySection, vocab_size: int, num_classes: int) -> TextClassifier:
    """The classifier ``settings`` describe over an alphabet / vocabulary of ``vocab_size`` symbols."""
    spec = encoder_spec(settings)
    encoder = create_text_encoder(spec.text_encoder, vocab_size, **spec.text_kwargs)
    return TextClassifier(encoder, num_classes, settings.dropout)


class ClassificationObjective:
    """Cross-entropy of the logits (plus the encoder's penalty, SEAM's, when it has one)."""

    def __call__(self, model: TextClassifier, batch: TextBatch, step: int, autocast: Callable[[], Any]
                 ) -> torch.Tensor:
        """Mean cross-entropy over the batch: a scalar tensor."""
        with autocast():
            logits = model(batch.text, batch.lengths)
        loss = F.cross_entropy(logits.float(), batch.labels)
        penalty = model.penalty()
        return loss + penalty if penalty is not None else loss

    def state_dict(self) -> dict[str, Any]:
        """Nothing to checkpoint."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""


@torch.no_grad()
def predict_logits(model: TextClassifier, texts: LabelledTexts, device: torch.device, amp: bool = False
                   ) -> torch.Tensor:
    """Logits (M, K) float32 on the CPU of every text of ``texts``, in order (eval mode)."""
    return embed_codes(model, texts.codes, texts.codec, device, amp=amp)


class ClassificationTrainer(Trainer):
    """The retrieval trainer, validated by accuracy (%): ``rsum`` in its records holds the accuracy,
    written to ``metrics.jsonl`` as ``val_accuracy`` / ``best_val_accuracy``."""

    score_label = "val accuracy"

    def __init__(self, *args: Any, labels: Sequence[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.labels = list(labels)

    def validate(self) -> tuple[float, dict[str, Any]]:
        """Accuracy (%) on the validation texts and ``{"accuracy", "macro_f1"}``."""
        logits = predict_logits(self.model, self.val_set, self.device, self.settings.amp)
        m = classification_metrics(self.val_set.labels, logits.argmax(1).numpy(), self.labels)
        return m["accuracy"], {"accuracy": m["accuracy"], "macro_f1": m["macro_f1"]}

    def metrics_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """An epoch's line of ``metrics.jsonl`` with the score under its name (accuracy, texts)."""
        rename = {"rsum": "val_accuracy", "best_rsum": "best_val_accuracy", "captions": "texts",
                  "captions_per_s": "texts_per_s"}
        return {rename.get(k, k): v for k, v in record.items()}


def _codec(settings: ClassifySection, dataset: TextClsDataset) -> TextCodec:
    return codec_for(settings, dataset, encoder_spec(settings).text_input)


def labelled_texts(dataset: TextClsDataset, split: str, codec: TextCodec) -> LabelledTexts:
    """The texts of ``split`` encoded with ``codec`` (the prepared tokens for word encoders)."""
    rows = dataset.rows(split)
    codes = [codec.encode(dataset.texts[k], dataset.tokens[k]) for k in rows]
    return LabelledTexts(codes, dataset.targets[rows], codec, [dataset.texts[k] for k in rows])


def _config(settings: ClassifySection, dataset: TextClsDataset, codec: TextCodec,
            sets: dict[str, LabelledTexts]) -> dict[str, Any]:
    from vsecore.version import code_version

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


def _check_resumable(run_dir: Path, new: dict[str, Any]) -> None:
    """A :class:`UserError` naming the first setting or fingerprint that differs from the run's."""
    old = read_config(run_dir)
    if old.get("task") != TASK:
        raise UserError(f"{run_dir}: cannot resume: not a classification run")

    def flat(c: dict[str, Any]) -> dict[str, Any]:
        out = {f"settings.{k}": v for k, v in c["settings"].items() if k not in RESUMABLE_CHANGES}
        out.update({f"fingerprints.{k}": v for k, v in c["fingerprints"].items()})
        out.update({"vocab_size": c["vocab_size"], "labels": c["labels"]})
        return out

    a, b = flat(old), flat(json.loads(json.dumps(new)))
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            raise UserError(f"{run_dir}: cannot resume: {key} was {a.get(key)!r}, now {b.get(key)!r} "
                            "(resume with the run's settings, or start a new run with another --out)")


def absolute(settings: ClassifySection) -> ClassifySection:
    """A copy with ``data`` and ``out`` absolute."""
    import os

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
    if not settings.data:
        raise UserError("--data is required (give it or use --pipeline)")
    resolve_device(settings.device)
    with exclusive_lock(run_dir, "the run directory"):
        prepare_run_dir(run_dir, resume=resume, overwrite=overwrite)
        with console.log_file(RunDir(run_dir).log):
            _train(settings, run_dir, resume, log)
    return run_dir


def _train(settings: ClassifySection, run_dir: Path, resume: bool, log: Callable[[str], None]) -> None:
    import random

    remove_stale_temporaries(RunDir(run_dir).checkpoints)
    device = resolve_device(settings.device)
    dataset = TextClsDataset.load(settings.data)
    codec = _codec(settings, dataset)
    sets = {split: labelled_texts(dataset, split, codec) for split in ("train", "val")}
    if not len(sets["val"]):
        raise UserError(f"{settings.data}: the val split is empty (prep textcls --val-fraction)")
    config = _config(settings, dataset, codec, sets)
    random.seed(settings.seed)
    np.random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    model = build_classifier(settings, codec.vocab_size, len(dataset.labels))
    config["parameters"] = model.parameter_report()
    trainer = ClassificationTrainer(settings, model, ClassificationObjective(), sets["train"], sets["val"],
                                    run_dir, device, log=log, labels=dataset.labels)
    if resume:
        _check_resumable(run_dir, config)
        trainer.resume(log)
    write_config(run_dir, config)
    p = config["parameters"]
    log(f"classify {settings.encoder}: {len(sets['train']):,} train / {len(sets['val']):,} val texts of "
        f"{dataset.name}, {len(dataset.labels)} classes, {codec.kind} input ({codec.vocab_size:,} symbols), "
        f"on {device}; parameters: text encoder {p['text_encoder']:,}, head {p['head']:,}, total "
        f"{p['total']:,}")
    t0 = time.perf_counter()
    trainer.fit()
    log(f"training done in {time.perf_counter() - t0:.0f}s: best val accuracy {trainer.best_rsum:.2f}% "
        f"after {trainer.epoch} epochs; run directory {run_dir}")
    del trainer
    evaluate_test(run_dir, device)


def dry_run_report(settings: ClassifySection, vocab_size: int | None = None,
                   num_classes: int | None = None) -> dict[str, int]:
    """Build the classifier and print its parameter counts beside the paper's and a word model's."""
    spec = encoder_spec(settings)
    labels = None
    if settings.data:
        dataset = TextClsDataset.load(settings.data)
        vocab = _codec(settings, dataset).vocab_size
        labels = len(dataset.labels)
    else:
        vocab = vocab_size or (72 if spec.text_input == "chars" else PAPER_WORD_VOCABULARY)
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


@dataclass
class ClassificationRun:
    """A trained classifier read back from its run directory (:func:`train.runs.load_run`)."""

    run_dir: Path
    settings: ClassifySection
    config: dict[str, Any]
    model: TextClassifier
    device: torch.device
    checkpoint: str
    epoch: int
    _dataset: TextClsDataset | None = field(default=None, repr=False)

    def __getattr__(self, name: str) -> Any:
        # what the retrieval commands (query, export-embeddings) ask of a LoadedRun: one line, not a traceback
        if name.startswith("_"):
            raise AttributeError(name)
        raise UserError(f"{self.run_dir}: a text classification run has no '{name}' (retrieval commands "
                        "need a retrieval run; use `train predict` or `train evaluate --run`)")

    @property
    def labels(self) -> list[str]:
        """Class names, in the order of the logits."""
        return list(self.config["labels"])

    @property
    def dataset(self) -> TextClsDataset:
        """The prepared dataset the run was trained on (loaded on first use)."""
        if self._dataset is None:
            self._dataset = TextClsDataset.load(self.settings.data)
        return self._dataset

    @property
    def codec(self) -> TextCodec:
        """How the run's encoder reads texts (over the training data's vocabulary)."""
        return _codec(self.settings, self.dataset)

    def probabilities(self, texts: Sequence[str]) -> torch.Tensor:
        """Class probabilities (M, K) of new texts (tokenized as ``prep`` does for word encoders)."""
        codec = self.codec
        items = LabelledTexts(codec.encode_texts(list(texts)), np.zeros(len(texts), dtype=np.int64), codec)
        return torch.softmax(predict_logits(self.model, items, self.device, self.settings.amp), dim=1)

    def predict(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """``(label, probability)`` of the most probable class of each text."""
        probs = self.probabilities(texts)
        best = probs.argmax(1)
        return [(self.labels[int(k)], float(probs[i, k])) for i, k in enumerate(best)]

    def split_texts(self, split: str) -> LabelledTexts:
        """The texts of ``split`` of the run's dataset, encoded for the run's encoder."""
        return labelled_texts(self.dataset, split, self.codec)

    def evaluate(self, split: str = "test", texts: Sequence[str] | None = None) -> dict[str, Any]:
        """:func:`train.textcls_metrics.classification_metrics` of ``split``; ``texts`` replace the
        split's texts one for one (the noise analysis)."""
        items = self.split_texts(split)
        if texts is not None:
            if len(texts) != len(items):
                raise UserError(f"{len(texts)} texts given for split '{split}', which has {len(items)}")
            codes = self.codec.encode_texts(list(texts))
            items = LabelledTexts(codes, items.labels, items.codec, list(texts))
        logits = predict_logits(self.model, items, self.device, self.settings.amp)
        return classification_metrics(items.labels, logits.argmax(1).numpy(), self.labels)


def is_classification_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir``'s ``config.json`` is that of a ``train classify`` run."""
    try:
        return read_config(run_dir).get("task") == TASK
    except UserError:
        return False


def load_classification_run(run_dir: str | Path, checkpoint: str = "best", device: str = "auto"
                            ) -> ClassificationRun:
    """Rebuild the classifier of ``run_dir`` from ``checkpoints/<checkpoint>.pt``."""
    run_dir = Path(run_dir)
    path = RunDir(run_dir).checkpoint(checkpoint)
    config = read_config(run_dir)
    settings = classify_settings_from_config(config["settings"])
    dev = resolve_device(device)
    state = load_checkpoint(path, map_location="cpu")
    model = build_classifier(settings, int(config["vocab_size"]), len(config["labels"]))
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise UserError(f"{path} does not fit the model this code builds: "
                        f"{str(exc).splitlines()[0]}") from None
    model.to(dev).eval()
    return ClassificationRun(run_dir=run_dir, settings=settings, config=config, model=model, device=dev,
                             checkpoint=checkpoint, epoch=int(state["epoch"]))


def evaluate_test(run_dir: Path, device: torch.device | str = "auto") -> dict[str, Any] | None:
    """Evaluate the best checkpoint on the test split: ``eval/test.json`` and the printed table."""
    if not RunDir(run_dir).best.is_file():
        console.info("no best checkpoint (no epoch finished); test evaluation skipped")
        return None
    run = load_classification_run(run_dir, "best", str(device))
    metrics = run.evaluate("test")
    title = f"{run_dir.name}: test split, best checkpoint (epoch {run.epoch})"
    console.result(format_metrics(metrics, title))
    write_evaluation(RunDir(run_dir).test_eval, {"split": "test", "checkpoint": "best",
                                                      "epoch": run.epoch, **metrics})
    return metrics


def noise_accuracy(run: ClassificationRun, ratios: Sequence[float], split: str = "test", seed: int = 0
                   ) -> dict[str, Any]:
    """Accuracy of ``split`` with ``ratio`` of each text's characters replaced (the retrieval analysis's
    :func:`train.evaluate.analysis.add_character_noise`, same seeding per ratio), for each ratio.

    Returns ``{"split", "seed", "clean": {accuracy, macro_f1}, "ratios": [{"ratio", "accuracy",
    "macro_f1"}]}``.
    """
    from train.evaluate.analysis import add_character_noise, caption_alphabet

    texts = run.split_texts(split).texts
    alphabet = caption_alphabet(texts)
    clean = run.evaluate(split)
    rows = []
    for ratio in ratios:
        rng = np.random.default_rng([seed, int(round(ratio * 1_000_000))])
        m = run.evaluate(split, add_character_noise(texts, ratio, alphabet, rng))
        rows.append({"ratio": ratio, "accuracy": m["accuracy"], "macro_f1": m["macro_f1"]})
        console.info(f"noise {100 * ratio:.0f}%: accuracy {m['accuracy']:.2f}%")
    return {"split": split, "seed": seed, "texts": len(texts),
            "clean": {"accuracy": clean["accuracy"], "macro_f1": clean["macro_f1"]}, "ratios": rows}


def plot_noise_accuracy(result: dict[str, Any], path: str | Path, title: str) -> Path:
    """PNG of the accuracy against the noise ratio (clean at 0%)."""
    from train.plots import new_figure, save_figure

    fig, ax = new_figure(1, width=6.0, height=4.0)
    x = [0.0] + [100 * r["ratio"] for r in result["ratios"]]
    y = [result["clean"]["accuracy"]] + [r["accuracy"] for r in result["ratios"]]
    ax.plot(x, y, marker="o", markersize=3)
    ax.set_xlabel("noise ratio (% of characters replaced)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return save_figure(fig, path)
