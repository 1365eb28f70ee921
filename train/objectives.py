"""Training objectives: what the trainer minimises on one batch.

An objective embeds a batch with the model and returns the scalar loss. The trainer knows nothing
else about a family: it moves the batch to the device, calls the objective inside its autocast
context factory, and steps the optimiser. Objectives with a schedule or phases keep their state in
``state_dict()``, which goes into every checkpoint so ``--resume`` continues them exactly.

* :class:`ContrastiveObjective` (every family by default): the contrastive pairwise ranking loss of
  :func:`train.losses.contrastive_loss` (sum or max of hinges) plus the text encoder's penalty when it
  has one (SEAM's attention penalty).

Families register their own with :func:`register_objective` (e.g. LIWE's growing hard-negative weight
and cross-language loss).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from train.losses import contrastive_loss

#: a zero-argument factory of the autocast context (``nullcontext`` on CPU)
AutocastFactory = Callable[[], AbstractContextManager[Any]]


class Objective(Protocol):
    """The loss of one batch; stateful objectives save and restore their state with the checkpoint."""

    def __call__(self, model: torch.nn.Module, batch: Any, step: int,
                 autocast: AutocastFactory) -> torch.Tensor:
        """Scalar loss of ``batch`` (already on the model's device) at global ``step`` (0-based)."""

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint (empty for stateless objectives)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


@dataclass
class ContrastiveObjective:
    """Contrastive ranking loss of image-caption pairs (+ the text encoder's penalty, if any).

    Embeddings are computed under ``autocast`` (bf16 on CUDA when asked) and the loss in float32.
    """

    measure: str = "order"
    margin: float = 0.05
    reduction: str = "sum"
    order_sqrt: bool = False

    def embed(self, model: torch.nn.Module, batch: Any, autocast: AutocastFactory
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images (B, d), captions (B, d))`` float32 embeddings of ``batch``."""
        with autocast():
            im = model.encode_images(batch.image_features)
            cap = model.encode_captions(batch.text, batch.lengths)
        return im.float(), cap.float()

    def pair_loss(self, images: torch.Tensor, captions: torch.Tensor, step: int) -> torch.Tensor:
        """The ranking loss of matching rows ``images (B, d)``, ``captions (B, d)``."""
        return contrastive_loss(images, captions, self.measure, self.margin, self.reduction, self.order_sqrt)

    def __call__(self, model: torch.nn.Module, batch: Any, step: int,
                 autocast: AutocastFactory) -> torch.Tensor:
        """Ranking loss of the batch plus the model's penalty."""
        im, cap = self.embed(model, batch, autocast)
        loss = self.pair_loss(im, cap, step)
        penalty = model.penalty() if hasattr(model, "penalty") else None
        return loss if penalty is None else loss + penalty.float()

    def state_dict(self) -> dict[str, Any]:
        """Stateless: ``{}``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""


#: family -> factory ``(settings) -> Objective``
_OBJECTIVES: dict[str, Callable[[Any], Objective]] = {}


def register_objective(family: str):
    """Decorator registering the objective factory ``(settings) -> Objective`` of a family."""

    def add(factory: Callable[[Any], Objective]) -> Callable[[Any], Objective]:
        _OBJECTIVES[family] = factory
        return factory

    return add


def build_objective(settings: Any) -> Objective:
    """The family's registered objective, else :class:`ContrastiveObjective` from the settings."""
    from train.models.registry import model_spec

    model_spec(settings)  # imports the model files, which register their families' objectives
    factory = _OBJECTIVES.get(settings.family)
    if factory is not None:
        return factory(settings)
    return ContrastiveObjective(settings.measure, settings.margin, settings.loss, settings.order_sqrt)
