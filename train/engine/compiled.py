"""``--compile``: the training loss through ``torch.compile``, on captions padded to a few fixed lengths.

A step's shapes are its batch size and its longest caption. The first changes once an epoch (its last,
smaller batch); the second changes every batch, and a compiled graph is specialised to its shapes. So a
compiled (or CUDA-graphed, :mod:`train.engine.graphs`) run pads each batch's captions to the next of a few
lengths (:func:`padded_length`: 8, 12, 16, 24, 32, 48, ... up to the codec's limit, each at most 1.5 times
the one below) in the loader, and every length compiles once; padding never changes what a model
computes (every encoder masks the positions after a caption's length), only the float rounding of sums
over time. A batch of another size than ``batch_size`` runs eagerly.

What is compiled is the objective's pure part, the embeddings and the loss of a batch's tensors
(:meth:`train.engine.objectives.ContrastiveObjective.compiled`): one graph for the forward pass, one for
the backward, per padded length. A GRU over packed captions (vse, clmr, liwe) breaks the graph there
and runs eagerly; the rest around it is compiled.

Compiled kernels are code: they go to the inductor cache folder of the process's kernel set
(:func:`vsecore.inductor_cache.use_kernel_set_cache`) and a step that may compile (a shape not seen yet)
holds that folder under :func:`vsecore.trusted.verified_cache`, as the evaluator's order kernel does
(``docs/safety.md``, "Compiled kernels"). A folder that fails the check, ``VSE_NO_COMPILE=1``, or an
error of the compiler makes the run go on eagerly, with one warning line (the same numbers to float
rounding).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from vsecore import console
from vsecore.inductor_cache import use_kernel_set_cache
from vsecore.trusted import UntrustedFolderError, verified_cache

#: the smallest padded caption length
SHORTEST_PADDED = 8
#: compiled graphs a compiled function keeps (one per padded length, two batch sizes): above dynamo's
#: default of 8, which a long-tailed caption length could reach
RECOMPILE_LIMIT = 32


def padded_length(length: int, limit: int) -> int:
    """The length a caption batch whose longest caption has ``length`` positions is padded to: the smallest
    of 8, 12, 16, 24, 32, 48, 64, ... (2^k and 3 x 2^(k-1)) that holds it, but at most ``limit`` (the
    codec's longest caption) and at least ``length``."""
    padded = SHORTEST_PADDED
    while padded < length:
        padded = padded * 3 // 2 if padded & (padded - 1) == 0 else padded * 4 // 3
    return max(length, min(padded, limit))


def _first_line(exc: BaseException) -> str:
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text[:200]}"


class CompiledLoss:
    """The objective's loss compiled, for the batches of ``batch_size`` captions.

    Args:
        objective: the run's objective; it must offer ``compiled(compile_fn)`` (every objective of
            :mod:`train.engine.objectives` does): a callable with the objective's signature whose pure part
            went through ``compile_fn``, sharing the objective's state.
        batch_size: the batches that take the compiled loss (the others run eagerly).
    """

    def __init__(self, objective: Any, batch_size: int) -> None:
        self.objective = objective
        self.batch_size = batch_size
        self._loss: Any = None
        self._folder: str | None = None
        self._seen: set[tuple[Any, ...]] = set()
        self.fallback: str | None = None  # why the run went on eagerly (the warning), None while compiled
        if os.environ.get("VSE_NO_COMPILE", "") not in ("", "0"):
            self._fall_back("VSE_NO_COMPILE is set")
            return
        try:
            # inductor's disk cache does not tell kernel sets apart: compile into this set's own folder
            self._folder = use_kernel_set_cache()
        except UntrustedFolderError as exc:
            self._fall_back(str(exc))
            return
        dynamo = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):  # the name changed between torch versions
            if hasattr(dynamo, name):
                setattr(dynamo, name, max(getattr(dynamo, name), RECOMPILE_LIMIT))
        self._loss = objective.compiled(lambda fn: torch.compile(fn, dynamic=False))

    def _fall_back(self, why: str) -> None:
        self.fallback = f"--compile: {why}; training on without compiling (the same loss to float rounding)"
        self._loss = None
        console.warning(f"warning: {self.fallback}")

    def takes(self, batch: Any) -> bool:
        """Whether ``batch`` (a :class:`train.engine.data.Batch`) takes the compiled loss."""
        return self._loss is not None and int(batch.lengths.shape[0]) == self.batch_size

    @contextlib.contextmanager
    def compiling(self, batch: Any) -> Iterator[None]:
        """The context of a step on ``batch`` (its forward and backward passes): a shape not seen yet
        compiles, under :func:`vsecore.trusted.verified_cache` of the kernel folder; a seen one touches no
        file."""
        key = shape_key(batch)
        if key in self._seen or self._folder is None:
            yield
            return
        with verified_cache(self._folder, "compiled training steps"):
            yield
        self._seen.add(key)

    def __call__(self, model: torch.nn.Module, batch: Any, step: int,
                 autocast: Callable[[], Any]) -> torch.Tensor:
        """The compiled objective's loss of ``batch`` (call it inside :meth:`compiling`)."""
        return self._loss(model, batch, step, autocast)

    def failed(self, exc: BaseException) -> None:
        """A compilation failed (the step is then taken eagerly): warn once, compile nothing more."""
        self._fall_back(f"torch.compile failed ({_first_line(exc)})")


def shape_key(batch: Any) -> tuple[Any, ...]:
    """The shapes and dtypes of a batch's tensors (and of its pair batches): what a compiled graph or a
    CUDA graph is specialised to."""
    key: list[Any] = []
    for value in batch:
        if isinstance(value, torch.Tensor):
            key.append((tuple(value.shape), value.dtype))
        elif isinstance(value, (tuple, list)):  # the pair batches (a DataLoader hands a tuple on as a list)
            key.append(shape_key(value))
        else:
            key.append(value)
    return tuple(key)
