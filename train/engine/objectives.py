"""Training objectives: what the trainer minimises on one batch.

An objective embeds a batch with the model and returns the scalar loss. The trainer knows nothing
else about a family: it moves the batch to the device, calls the objective inside its autocast
context factory, and steps the optimiser. Objectives with a schedule or phases keep their state in
``state_dict()``, which goes into every checkpoint so ``--resume`` continues them exactly.

* :class:`ContrastiveObjective` (every family by default): the contrastive pairwise ranking loss of
  :func:`train.engine.losses.contrastive_loss` (sum or max of hinges) plus the text encoder's penalty when it
  has one (SEAM's attention penalty).

* :class:`ScheduledContrastiveObjective` (``clmr``, ``liwe``): the LIWE paper's loss, the hard-negative
  weight ``lambda = 1 - eta^iteration`` growing from the sum of hinges to the max of hinges (Eq. 2-5),
  plus the cross-language loss of the batch's aligned sentence pairs (Eq. 6-8).
* :class:`CurriculumObjective` (the FNE paper's PH and POE pipelines, section 3.5): the same loss in
  phases, the sum of hinges first, then the max of hinges. The trainer moves to the next phase
  when validation stops improving (see :class:`train.engine.trainer.Trainer`); the phase is part of the
  objective's state, hence of every checkpoint.

A family names its objective in its declaration (:attr:`train.models.family.Family.objective`; the
default is :class:`ContrastiveObjective` of its settings).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from train.engine.losses import contrastive_loss, hard_negative_weight, scheduled_contrastive_loss

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


@runtime_checkable
class PhasedObjective(Objective, Protocol):
    """An objective trained in phases (a curriculum): when the stopping rules end a phase, the trainer
    reloads the best checkpoint, calls :meth:`advance` and starts a fresh Adam at :attr:`later_lr` (the
    run's ``lr`` if None). :class:`CurriculumObjective` is one."""

    #: 0-based index of the current phase (saved with the objective's state)
    phase: int
    #: learning rate of the phases after the first (None: the run's ``lr``)
    later_lr: float | None

    @property
    def phase_name(self) -> str:
        """The current phase's name, recorded per epoch in ``metrics.jsonl``."""

    @property
    def has_next_phase(self) -> bool:
        """Whether a phase follows the current one."""

    def advance(self) -> None:
        """Move to the next phase."""


@dataclass
class ContrastiveObjective:
    """Contrastive ranking loss of image-caption pairs (+ the text encoder's penalty, if any).

    Embeddings are computed under ``autocast`` (bf16 on CUDA when asked) and the loss in float32.
    """

    measure: str = "order"
    margin: float = 0.05
    reduction: str = "sum"
    order_sqrt: bool = False

    def pair_loss(self, images: torch.Tensor, captions: torch.Tensor, step: int) -> torch.Tensor:
        """The ranking loss of matching rows ``images (B, d)``, ``captions (B, d)``."""
        return contrastive_loss(images, captions, self.measure, self.margin, self.reduction, self.order_sqrt)

    def __call__(self, model: torch.nn.Module, batch: Any, step: int,
                 autocast: AutocastFactory) -> torch.Tensor:
        """Ranking loss of the batch plus the model's penalty."""
        return self.batch_loss(model, batch.image_features, batch.text, batch.lengths, autocast)

    def batch_loss(self, model: torch.nn.Module, image_features: torch.Tensor, text: torch.Tensor,
                   lengths: torch.Tensor, autocast: AutocastFactory) -> torch.Tensor:
        """The loss of a batch's tensors (``image_features (B, *feature_shape)``, ``text (B, T[, C])``,
        ``lengths (B,)``): the part of a step ``--compile`` compiles."""
        with autocast():
            im = model.encode_images(image_features)
            cap = model.encode_captions(text, lengths)
        loss = self.pair_loss(im.float(), cap.float(), 0)
        penalty = model.penalty() if hasattr(model, "penalty") else None
        return loss if penalty is None else loss + penalty.float()

    def compiled(self, compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Objective:
        """This objective with :meth:`batch_loss` through ``compile_fn`` (``--compile``): the same call,
        the same (empty) state."""
        loss = compile_fn(self.batch_loss)
        return _Compiled(self, lambda model, batch, step, autocast: loss(
            model, batch.image_features, batch.text, batch.lengths, autocast))

    def state_dict(self) -> dict[str, Any]:
        """Stateless: ``{}``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""


@dataclass
class ScheduledContrastiveObjective:
    """LIWE paper, section 2.4: ``J_M + 1/|L| sum_j J_L(t_l1, t_lj)`` with ``J = lambda J_max + (1 - lambda)
    J_sum`` for both terms and ``lambda = 1 - eta^iteration``.

    * ``J_M``: the image-caption hinges of the batch (cosine similarity, margin ``alpha``; LAVSE: 0.2). With
      ``--langs`` the captions of one image in several languages may share a batch, so rows of the same
      image are not contrastive examples of each other (``image_index``).
    * ``J_L``: for each cross-language (``batch.pairs``, one :class:`train.engine.data.PairBatch` per language
      ``l_j``), the same hinges between the embeddings of aligned sentences ``t_l1`` and ``t_lj``, with the
      same ``lambda``; their mean over the languages is added (Eq. 8's ``1/|L|``, ``|L|`` the languages
      paired with ``l1``).

    ``iteration`` counts the steps taken; step ``n`` (1-based) uses ``lambda = 1 - eta^n``, as LAVSE's
    ``ContrastiveLoss`` (which counts the call before computing ``k``), so training starts almost at the
    sum of hinges (Table 6: the max of hinges alone diverges) and reaches lambda = 0.99 after 510 steps at
    eta = 0.991. It is the objective's checkpointed state, so a resumed run continues the schedule exactly.
    ``last_terms`` gives the last batch's terms (floats) for inspection and tests; the step keeps them as
    device tensors and reads them only when asked (reading waits for the device).
    """

    eta: float = 0.991
    margin: float = 0.2
    measure: str = "cosine"
    iteration: int = 0

    def __post_init__(self) -> None:
        self._terms: dict[str, float | torch.Tensor] = {}

    @property
    def last_terms(self) -> dict[str, float]:
        """The last batch's terms: ``lambda``, ``image_text`` and each ``cross_<lang>``, as floats."""
        return {name: float(value) for name, value in self._terms.items()}

    def __call__(self, model: torch.nn.Module, batch: Any, step: int,
                 autocast: AutocastFactory) -> torch.Tensor:
        """``J_M + mean_j J_L`` of the batch at the current ``lambda``; advances ``iteration``."""
        return self._loss(model, batch, autocast, self.image_text_loss, self.aligned_loss, compiled=False)

    def _loss(self, model: torch.nn.Module, batch: Any, autocast: AutocastFactory,
              image_text: Callable[..., torch.Tensor], aligned: Callable[..., torch.Tensor],
              compiled: bool) -> torch.Tensor:
        """:meth:`__call__` with its two pure parts given (eager or compiled); a compiled part takes
        ``lambda`` as a 0-dim tensor, so that its changing value compiles nothing."""
        weight = hard_negative_weight(self.eta, self.iteration + 1)
        w: float | torch.Tensor = torch.tensor(weight) if compiled else weight
        loss = image_text(model, batch.image_features, batch.image_counts, batch.text, batch.lengths,
                          batch.image_index, w, autocast)
        terms: dict[str, float | torch.Tensor] = {"lambda": weight, "image_text": loss.detach()}
        if batch.pairs:
            cross = []
            for pairs in batch.pairs:
                cross.append(aligned(model, pairs.text, pairs.lengths, pairs.other_text, pairs.other_lengths,
                                     w, autocast))
                terms[f"cross_{pairs.other_lang}"] = cross[-1].detach()
            loss = loss + torch.stack(cross).mean()
        self._terms = terms
        self.iteration += 1
        return loss

    def image_text_loss(self, model: torch.nn.Module, image_features: torch.Tensor,
                        image_counts: torch.Tensor | None, text: torch.Tensor, lengths: torch.Tensor,
                        image_index: torch.Tensor, weight: float | torch.Tensor,
                        autocast: AutocastFactory) -> torch.Tensor:
        """``J_M`` of a batch's tensors (regions ``(B, k, D)`` with their ``counts (B,)``, captions ``(B, T[,
        C])`` and ``lengths (B,)``, ``image_index (B,)``) at hard-negative weight ``weight``."""
        with autocast():
            im = model.encode_images(image_features, image_counts)
            cap = model.encode_captions(text, lengths)
        return scheduled_contrastive_loss(im.float(), cap.float(), weight, self.measure, self.margin,
                                          image_index)

    def aligned_loss(self, model: torch.nn.Module, text: torch.Tensor, lengths: torch.Tensor,
                     other_text: torch.Tensor, other_lengths: torch.Tensor, weight: float | torch.Tensor,
                     autocast: AutocastFactory) -> torch.Tensor:
        """``J_L`` of one batch of aligned sentence pairs (``(P, T[, C])`` and ``lengths (P,)`` each side)."""
        with autocast():
            a = model.encode_captions(text, lengths)
            b = model.encode_captions(other_text, other_lengths)
        return scheduled_contrastive_loss(a.float(), b.float(), weight, self.measure, self.margin)

    def compiled(self, compile_fn: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Objective:
        """This objective with :meth:`image_text_loss` and :meth:`aligned_loss` through ``compile_fn``
        (``--compile``), sharing its schedule (``iteration``) and terms."""
        image_text, aligned = compile_fn(self.image_text_loss), compile_fn(self.aligned_loss)
        return _Compiled(self, lambda model, batch, step, autocast: self._loss(
            model, batch, autocast, image_text, aligned, compiled=True))

    def state_dict(self) -> dict[str, Any]:
        """``{"iteration", "eta"}``."""
        return {"iteration": self.iteration, "eta": self.eta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the schedule at the checkpoint's ``iteration``."""
        if "eta" in state and float(state["eta"]) != self.eta:
            raise ValueError(f"the checkpoint's schedule has eta {state['eta']}, this run {self.eta}")
        self.iteration = int(state.get("iteration", 0))


@dataclass
class CurriculumObjective(ContrastiveObjective):
    """:class:`ContrastiveObjective` whose reduction changes by phase: ``phases[phase]``.

    FNE paper section 3.5: "train using one method until there is no improvement in the validation
    set. Then, take this pre-trained model and train it again using a different method". PH and
    POE use ``("sum", "max")``. The trainer calls :meth:`advance` (after reloading the best
    checkpoint); :attr:`phase` is saved with every checkpoint.
    """

    phases: tuple[str, ...] = ("sum", "max")
    phase: int = 0
    #: learning rate of the phases after the first (the FNE paper's fine-tuning; None: the run's ``lr``)
    later_lr: float | None = None

    def __post_init__(self) -> None:
        if not self.phases or any(p not in ("sum", "max") for p in self.phases):
            raise ValueError(f"curriculum phases must be 'sum' or 'max', got {self.phases}")
        self.reduction = self.phases[self.phase]

    @property
    def phase_name(self) -> str:
        """The reduction of the current phase (``sum`` or ``max``)."""
        return self.phases[self.phase]

    @property
    def has_next_phase(self) -> bool:
        """Whether a phase follows the current one."""
        return self.phase + 1 < len(self.phases)

    def advance(self) -> None:
        """Move to the next phase (its reduction applies from the next batch on)."""
        if not self.has_next_phase:
            raise ValueError("the curriculum is already in its last phase")
        self.phase += 1
        self.reduction = self.phases[self.phase]

    def state_dict(self) -> dict[str, Any]:
        """``{"phase": index}``."""
        return {"phase": self.phase}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the phase (an empty state is phase 0)."""
        self.phase = int(state.get("phase", 0))
        self.reduction = self.phases[self.phase]


class _Compiled:
    """An objective's compiled view (``objective.compiled(...)``): its own call, the objective's state (a
    checkpoint saves and restores the objective itself)."""

    def __init__(self, objective: Any, call: Callable[..., torch.Tensor]) -> None:
        self.objective = objective
        self._call = call

    def __call__(self, model: torch.nn.Module, batch: Any, step: int,
                 autocast: AutocastFactory) -> torch.Tensor:
        return self._call(model, batch, step, autocast)

    def state_dict(self) -> dict[str, Any]:
        return self.objective.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.objective.load_state_dict(state)
