"""``--cuda-graphs``: each training step (forward, backward, clipping, Adam) replayed as a CUDA graph.

A step of batch 128 launches 350 to 450 kernels at 15 to 25 us of host time each, so on a GPU the host,
not the device, sets its pace (issue 44). A CUDA graph records the kernels of one step once and replays
them with one launch. A graph is fixed to its tensors' shapes and addresses: there is one graph per shape
(batches of ``batch_size`` captions, padded to the lengths of :func:`train.engine.compiled.padded_length`),
each with its own input tensors, into which every batch of that shape is copied before the replay; a batch
of another size (an epoch's last) steps eagerly. A shape's first :data:`WARMUP` steps run eagerly on a side
stream (cuBLAS and cuDNN pick their kernels, ``--compile`` compiles, Adam allocates its moments); the next
is captured, then replayed, and so is every later one.

A graph may hold no host synchronisation and no host decision that depends on the batch. So it is refused
(:func:`graph_problem`) for a model with a recurrent layer (the GRUs of vse, clmr, liwe and seam G pack their
captions in an order sorted on the host at every batch) and for an objective other than the contrastive one
(clmr and liwe's weight ``lambda`` changes on the host at every step). Adam is fused and capturable with a
device tensor as its learning rate, which the schedule fills (:func:`train.engine.step.make_optimizer`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from train.engine.compiled import shape_key
from train.engine.objectives import ContrastiveObjective

#: eager steps of a shape (on a side stream) before its graph is captured: the count PyTorch's
#: documentation uses for whole-network capture
WARMUP = 3


def graph_problem(model: torch.nn.Module, objective: Any, device: torch.device) -> str | None:
    """Why ``--cuda-graphs`` cannot replay this run's steps (one line), or None when it can."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device (this run is on {device})"
    recurrent = next((type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.RNNBase)), None)
    if recurrent is not None:
        return (f"the text encoder runs a {recurrent} over packed captions, ordered on the host at every "
                "batch, which a graph cannot replay (use --compile)")
    if not isinstance(objective, ContrastiveObjective):
        return (f"the {type(objective).__name__} changes on the host at every step, which a graph cannot "
                "replay (use --compile)")
    return None


@dataclass
class _Graph:
    """One shape's graph: its eager steps so far, then the graph, its input batch and its loss."""

    eager_steps: int = 0
    graph: Any = None
    inputs: Any = None
    loss: torch.Tensor | None = None


def _copy_into(static: Any, batch: Any) -> None:
    """Copy every tensor of ``batch`` into the same field of ``static`` (a batch of the same shapes)."""
    for mine, new in zip(static, batch, strict=True):
        if isinstance(mine, torch.Tensor):
            mine.copy_(new, non_blocking=True)
        elif isinstance(mine, (tuple, list)):  # the pair batches (a DataLoader hands a tuple on as a list)
            _copy_into(mine, new)


def _cloned(batch: Any) -> Any:
    """A batch of the same shapes with tensors of its own (a graph's inputs)."""
    values = [v.clone() if isinstance(v, torch.Tensor) else _cloned(v) if isinstance(v, (tuple, list)) else v
              for v in batch]
    return type(batch)(*values) if hasattr(batch, "_fields") else tuple(values)


class StepGraphs:
    """The steps of ``batch_size`` batches as CUDA graphs, one per shape.

    Args:
        step: one whole training step of a batch already on the device, gradients set to None before it:
            forward, backward, clipping and ``optimizer.step()``; returns the loss (0-dim, detached). It
            must hold no host synchronisation (:func:`graph_problem`).
        zero_grad: sets every gradient to None (before an eager step and before a capture, so the
            gradients a graph writes are its own).
        batch_size: the batches that take a graph.
    """

    def __init__(self, step: Callable[[Any], torch.Tensor], zero_grad: Callable[[], None],
                 batch_size: int) -> None:
        self.step = step
        self.zero_grad = zero_grad
        self.batch_size = batch_size
        self._graphs: dict[tuple[Any, ...], _Graph] = {}
        self._side = torch.cuda.Stream()

    def takes(self, batch: Any) -> bool:
        """Whether ``batch`` is stepped through a graph (its size is ``batch_size``)."""
        return int(batch.lengths.shape[0]) == self.batch_size

    @property
    def captured(self) -> int:
        """Graphs captured so far."""
        return sum(g.graph is not None for g in self._graphs.values())

    def __call__(self, batch: Any) -> torch.Tensor:
        """One step on ``batch`` (on the device): eager on the side stream while its shape warms up, then
        through its graph; the loss (a tensor of its own, 0-dim)."""
        entry = self._graphs.setdefault(shape_key(batch), _Graph())
        if entry.graph is None and entry.eager_steps < WARMUP:
            entry.eager_steps += 1
            return self._eager_on_side_stream(batch)
        if entry.graph is None:
            self._capture(entry, batch)
        else:
            _copy_into(entry.inputs, batch)
        entry.graph.replay()
        return entry.loss.clone()  # the next replay overwrites the graph's own

    def _eager_on_side_stream(self, batch: Any) -> torch.Tensor:
        main = torch.cuda.current_stream()
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            self.zero_grad()
            loss = self.step(batch)
        main.wait_stream(self._side)
        return loss

    def _capture(self, entry: _Graph, batch: Any) -> None:
        """Record one step on a copy of ``batch`` (recording runs nothing: the replay takes the step)."""
        entry.inputs = _cloned(batch)
        self.zero_grad()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            entry.loss = self.step(entry.inputs)
        entry.graph = graph
