"""The text classifier (CHAIN-VSE section 5): a registered text encoder, dropout, one linear layer to the
classes; its objective, its batches and how it reads texts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from prep.textcls import TextClsDataset
from train.classification.metrics import classification_metrics
from train.engine.codecs import TextCodec, codec_for
from train.engine.inference import embed_codes
from train.engine.noise import caption_alphabet, training_noise
from train.engine.settings import ClassifySection
from train.models.classifier import encoder_spec
from train.models.registry import count_parameters, create_text_encoder

TASK = "classify"


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


@dataclass
class NoisyTexts(LabelledTexts):
    """Training texts read with ``ratio`` of their characters replaced (``--train-noise``), drawn afresh each
    epoch (:func:`train.engine.noise.training_noise`, seeded by ``seed``, the epoch and the text), from the
    training texts' alphabet, then encoded as new texts are (:meth:`TextCodec.encode_texts`), as the
    ``--noise`` evaluation encodes its noisy texts. ``epoch`` is set by the trainer before each epoch."""

    ratio: float = 0.0
    seed: int = 0
    epoch: int = 0
    alphabet: list[str] = field(default_factory=list)

    def batch(self, indices: Sequence[int] | np.ndarray) -> TextBatch:
        """The texts ``indices`` with this epoch's noise, collated: :class:`TextBatch`."""
        idx = [int(k) for k in indices]
        noisy = training_noise(self.texts, idx, self.ratio, self.alphabet, self.seed, self.epoch)
        tokens, lengths = self.codec.collate(self.codec.encode_texts(noisy))
        return TextBatch(tokens, lengths, torch.from_numpy(self.labels[idx]))


def with_training_noise(texts: LabelledTexts, ratio: float, seed: int) -> LabelledTexts:
    """``texts`` as :class:`NoisyTexts` at ``ratio`` (``texts`` itself when ``ratio`` is 0)."""
    if ratio <= 0:
        return texts
    return NoisyTexts(texts.codes, texts.labels, texts.codec, texts.texts, ratio=ratio, seed=seed,
                      alphabet=caption_alphabet(texts.texts))


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

    #: the trainer's text helpers (:func:`train.engine.inference.embed_codes`) read a model through this name
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


def evaluate_texts(model: TextClassifier, texts: LabelledTexts, labels: Sequence[str], device: torch.device,
                   amp: bool = False) -> dict[str, Any]:
    """:func:`train.classification.metrics.classification_metrics` of the classes ``model`` predicts for
    ``texts`` (the most probable of its logits (M, K)) against their labels (M,): the one measurement of a
    classifier, what its validation during training (:class:`train.classification.fit.ClassificationTrainer`)
    and every evaluation of a run (:meth:`train.classification.run.ClassificationRun.evaluate`, through
    :func:`train.classification.evaluate.evaluate_run`) compute."""
    logits = predict_logits(model, texts, device, amp)
    return classification_metrics(texts.labels, logits.argmax(1).numpy(), labels)


def classifier_codec(settings: ClassifySection, dataset: TextClsDataset) -> TextCodec:
    return codec_for(settings, dataset, encoder_spec(settings).text_input)


def labelled_texts(dataset: TextClsDataset, split: str, codec: TextCodec) -> LabelledTexts:
    """The texts of ``split`` encoded with ``codec`` (the prepared tokens for word encoders)."""
    rows = dataset.rows(split)
    codes = [codec.encode(dataset.texts[k], dataset.tokens[k]) for k in rows]
    return LabelledTexts(codes, dataset.targets[rows], codec, [dataset.texts[k] for k in rows])
