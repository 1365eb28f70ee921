"""A trained classifier read back from its run directory: :class:`ClassificationRun` (``predict``,
``probabilities``, ``evaluate``) and :func:`load_classification_run`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prep.textcls import TextClsDataset, encoder_text, is_blank
from train.classification.model import (
    TASK,
    LabelledTexts,
    TextClassifier,
    build_classifier,
    classifier_codec,
    evaluate_texts,
    labelled_texts,
    predict_logits,
)
from train.config.run import (
    changed_dataset_files,
    classify_settings_from_config,
    read_config,
    rebuild_model,
)
from train.engine.codecs import TextCodec
from train.engine.settings import ClassifySection
from train.run.layout import CONFIG, RunDir
from vsecore.device import resolve_device
from vsecore.errors import UserError


@dataclass
class ClassificationRun:
    """A trained classifier read back from its run directory (:func:`train.retrieval.open.load_run`)."""

    run_dir: Path
    settings: ClassifySection
    config: dict[str, Any]
    model: TextClassifier
    device: torch.device
    checkpoint: str
    epoch: int
    _dataset: TextClsDataset | None = field(default=None, repr=False)
    _codec: TextCodec | None = field(default=None, repr=False)

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
            changed = changed_dataset_files(self.config, self.settings.data)
            if changed:  # re-prepared since: other texts, alphabet or vocabulary under the same codes
                raise UserError(f"{self.run_dir}: the run's prepared dataset changed since it was trained: "
                                f"{', '.join(changed)} in {self.settings.data} differ from the fingerprints "
                                f"in {CONFIG}; train again on it (or prepare it again as it was)")
            self._dataset = TextClsDataset.load(self.settings.data)
        return self._dataset

    @property
    def codec(self) -> TextCodec:
        """How the run's encoder reads texts (over the training data's vocabulary; built once)."""
        if self._codec is None:
            self._codec = classifier_codec(self.settings, self.dataset)
        return self._codec

    @property
    def text_repairs(self) -> str | None:
        """The repairs ``prep textcls`` made to the run's texts (its ``prep.json``'s ``text_repairs``)."""
        return self.dataset.record.get("text_repairs")

    def encoder_texts(self, texts: Sequence[str]) -> list[str]:
        """New texts as the encoder sees them: :func:`prep.textcls.encoder_text` with the dataset's repairs,
        the very function ``prep textcls`` applied to the training texts."""
        repairs = self.text_repairs
        return [encoder_text(t, repairs)[0] for t in texts]

    def blank(self, texts: Sequence[str]) -> list[bool]:
        """Whether each new text holds nothing to classify once read (:func:`prep.textcls.is_blank`: the
        texts ``prep textcls`` drops)."""
        return [is_blank(t) for t in self.encoder_texts(texts)]

    def probabilities(self, texts: Sequence[str]) -> torch.Tensor:
        """Class probabilities (M, K) of new texts, read as :meth:`encoder_texts` (then tokenized as
        ``prep`` does for word encoders)."""
        return self._scores(self.encoder_texts(texts))

    def _scores(self, seen: Sequence[str]) -> torch.Tensor:
        """Class probabilities (M, K) of texts already read as :meth:`encoder_texts`."""
        codec = self.codec
        items = LabelledTexts(codec.encode_texts(list(seen)), np.zeros(len(seen), dtype=np.int64), codec)
        return torch.softmax(predict_logits(self.model, items, self.device, self.settings.amp), dim=1)

    def answer(self, texts: Sequence[str], where: Sequence[str] | None = None) -> list[torch.Tensor | None]:
        """What ``train predict`` answers to each text, in order: its class probabilities (K,), or None for
        a blank text (:meth:`blank`: nothing to classify once read as the training texts were). ``where``
        names each text in the one-line error of a text that is not Unicode (a lone surrogate)."""
        seen, repairs = [], self.text_repairs
        for k, text in enumerate(texts):
            try:
                seen.append(encoder_text(text, repairs)[0])
            except UserError as exc:
                raise UserError(f"{where[k] if where else f'text {k + 1}'}: {exc}") from None
        answered = [k for k, text in enumerate(seen) if not is_blank(text)]
        rows: list[torch.Tensor | None] = [None] * len(seen)
        if answered:
            for k, row in zip(answered, self._scores([seen[k] for k in answered]), strict=True):
                rows[k] = row
        return rows

    def predict(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """``(label, probability)`` of the most probable class of each text."""
        probs = self.probabilities(texts)
        best = probs.argmax(1)
        return [(self.labels[int(k)], float(probs[i, k])) for i, k in enumerate(best)]

    def split_texts(self, split: str) -> LabelledTexts:
        """The texts of ``split`` of the run's dataset, encoded for the run's encoder."""
        return labelled_texts(self.dataset, split, self.codec)

    def evaluate(self, split: str = "test", texts: Sequence[str] | None = None) -> dict[str, Any]:
        """The metrics of ``split`` (:func:`train.classification.model.evaluate_texts`); ``texts`` replace the
        split's texts one for one (the noise analysis)."""
        items = self.split_texts(split)
        if texts is not None:
            if len(texts) != len(items):
                raise UserError(f"{len(texts)} texts given for split '{split}', which has {len(items)}")
            codes = self.codec.encode_texts(list(texts))
            items = LabelledTexts(codes, items.labels, items.codec, list(texts))
        return evaluate_texts(self.model, items, self.labels, self.device, self.settings.amp)


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
    model, epoch = rebuild_model(lambda: build_classifier(settings, int(config["vocab_size"]),
                                                          len(config["labels"])), path, config, dev)
    return ClassificationRun(run_dir=run_dir, settings=settings, config=config, model=model, device=dev,
                             checkpoint=checkpoint, epoch=epoch)
