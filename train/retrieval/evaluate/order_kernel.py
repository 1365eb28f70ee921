"""The order-violation kernel of an evaluation: which kernel scores its tiles, and the compiled one's state.

Gradient-free float32 CPU tiles take a *fused* kernel of :mod:`train.engine.similarity` (no N x M x d
broadcast): the *blocked* one (plain torch ops, no compiler, no state) or the *compiled* one,
``torch.compile`` (inductor, C++) of :func:`train.engine.similarity.squared_violation_expr`, one loop that
reduces over d in registers, faster on large evaluations but with a first compilation of about 12
to 50 s (a few seconds with a warm inductor cache). :class:`OrderKernel` owns that compilation: whether
it was tried, the compiled function, the ranges of d it has run for. The evaluator holds one and
decides once per evaluation, for all its tiles (:meth:`OrderKernel.choose`), so every tile has the
same rounding and the compilation is paid only when the whole evaluation amortises it
(``compile_min_work``) or was paid already. Without a working compiler, after an inductor error, or
with ``VSE_NO_COMPILE=1``, the compiled path falls back to the blocked kernel with one
``RuntimeWarning`` and never raises. It compiles into an inductor cache folder of the process's kernel set
(:mod:`vsecore.inductor_cache`): a kernel another set compiled is never loaded. A compiled kernel is code,
so that folder must pass :mod:`vsecore.trusted`'s check (else the blocked kernel, with the warning naming
the folder and why) and every compilation verifies its content first (:func:`vsecore.trusted.verified_cache`):
a file changed since the toolkit compiled it is never loaded.

Evaluations given no kernel share :meth:`OrderKernel.shared` (one per process), so ``train evaluate``,
its analyses and the trainer's validations compile at most once; tests and benchmarks make their own.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from train.engine.similarity import (
    SquaredViolation,
    order_violation,
    similarity,
    squared_violation_blocked,
    squared_violation_expr,
)
from vsecore.errors import UserError
from vsecore.inductor_cache import use_kernel_set_cache
from vsecore.trusted import UntrustedFolderError, verified_cache

#: ``order_kernel`` values: ``auto`` (by the evaluation's work), or one kernel for every tile
ORDER_KERNELS = ("auto", "eager", "blocked", "compiled")

#: N x M x d of a whole evaluation (summed over its folds) from which the compiled kernel pays for
#: its compilation. Measured on 2 cores (bench_evaluate.py, docs/evaluation.md): a cold compilation
#: 19 to 27 s (more under load), and compiling saves about 0.4 ns per element operation (1,000 x
#: 5,000 at d = 8192: 57 s blocked, 41 s compiled at load 9), so it pays from about 50 G operations,
#: e.g. 5,000 x 25,000 captions at d >= 400. Below it (a 1k fold at d = 1024: 5 G) it does not pay.
COMPILE_MIN_WORK = 1 << 36

#: what one compilation takes, for the message that announces it (cold inductor cache, 2 cores)
COMPILE_SECONDS_ESTIMATE = 20

#: inductor changes its accumulator for reductions longer than this, so d above it compiles another kernel
_LONG_REDUCTION = 4096


def _untrusted(exc: UntrustedFolderError) -> str:
    return f"order_violation: not compiling: {exc}; using the blocked eager kernel"


@dataclass(frozen=True)
class TileScorer:
    """The similarity of every tile of one evaluation: one measure and one kernel (one rounding).

    ``kernel``: ``"eager"``, ``"blocked"`` or ``"compiled"`` for the order violation, ``""`` for the
    cosine; ``squared``: the fused kernel of ``"compiled"`` (the evaluator's :class:`OrderKernel`).
    """

    measure: str
    order_sqrt: bool = False
    kernel: str = ""
    squared: SquaredViolation | None = None

    def __call__(self, images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
        """Images (B, d) and captions (C, d) -> (B, C) scores, larger = more similar."""
        if self.measure != "order":
            return similarity(images, captions, self.measure, self.order_sqrt)
        return order_violation(images, captions, self.order_sqrt, fused=self.kernel != "eager",
                               squared=self.squared)


class OrderKernel:
    """The compiled order-violation kernel of an evaluator, compiled at most once.

    Args:
        compile_min_work: the evaluation work (``sum of N x M x d``) from which :meth:`choose`
            compiles (default :data:`COMPILE_MIN_WORK`).
    """

    _shared: ClassVar[OrderKernel | None] = None

    def __init__(self, compile_min_work: int = COMPILE_MIN_WORK) -> None:
        self.compile_min_work = compile_min_work
        self._backend: str | None = None  # None (not tried yet), "compiled" or "blocked" (no compiler)
        self._compiled: SquaredViolation | None = None
        self._ready: set[bool] = set()  # d ranges (d > _LONG_REDUCTION) the compiled kernel has run for
        self._fallback: str | None = None  # why the compiled path uses the blocked kernel
        self._folder: str | None = None  # the checked inductor cache folder it compiles into

    @classmethod
    def shared(cls) -> OrderKernel:
        """The kernel of the evaluations given none: one per process, so a compilation is paid once."""
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    @property
    def backend(self) -> str | None:
        """The compiled path's kernel: ``"compiled"``, ``"blocked"`` (no compiler), ``None`` if not tried."""
        return self._backend

    @property
    def fallback_reason(self) -> str | None:
        """Why the compiled path fell back to the blocked kernel (the warning), ``None`` if it did not."""
        return self._fallback

    def _fall_back(self, message: str, stacklevel: int) -> str:
        self._fallback = message
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
        return "blocked"

    def ready(self, dim: int) -> bool:
        """Whether the compiled kernel has already run for embeddings of size ``dim`` (none to compile)."""
        return (dim > _LONG_REDUCTION) in self._ready

    def disabled(self) -> bool:
        """Whether the compiled kernel is off: ``VSE_NO_COMPILE`` is set or compiling failed before."""
        return self._backend == "blocked" or os.environ.get("VSE_NO_COMPILE", "") not in ("", "0")

    def prepare(self, dim: int, log: Callable[[str], None] | None = None) -> float:
        """Compile the kernel for embeddings of size ``dim`` now, if not done yet; returns the seconds.

        ``log`` gets one line before a compilation starts (none when the kernel is ready or disabled).
        Compiling ahead of an evaluation keeps all its tiles on one kernel (a failure falls back before
        the first tile, not in the middle).
        """
        if self.ready(dim) or self.disabled():
            return 0.0
        if log is not None:
            log("compiling the fused order-violation kernel (once per process, "
                f"~{COMPILE_SECONDS_ESTIMATE} s; VSE_NO_COMPILE=1 skips it)")
        t0 = time.perf_counter()
        probe = torch.zeros(2, max(1, dim))
        self.squared_violation(probe, probe)
        return time.perf_counter() - t0

    def squared_violation(self, images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
        """``||max(0, c - i)||^2`` (N, M) of images (N, d) and captions (M, d) with the compiled kernel
        (compiled on the first call), or the blocked one where no compiler works."""
        n, d = images.shape
        m = captions.shape[0]
        if n == 0 or m == 0 or d == 0:
            return squared_violation_blocked(images, captions)
        if self._backend is None:
            self._backend = self._compile()
        if self._backend == "compiled":
            try:
                with torch.no_grad(), self._holding_cache(d):
                    # dynamic shapes specialise size 1, which would compile another kernel: a single
                    # row is computed as two equal rows (the same bits as in any other block)
                    im = images.expand(2, d) if n == 1 else images
                    cap = captions.expand(2, d) if m == 1 else captions
                    out = self._compiled(im.contiguous(), cap.contiguous())
                self._ready.add(d > _LONG_REDUCTION)
                return out[:n, :m]
            except UntrustedFolderError as exc:  # the folder changed since _compile checked it
                self._backend = self._fall_back(_untrusted(exc), 3)
            except Exception as exc:  # any inductor / compiler failure: fall back, once, never crash
                # the first line of an inductor error is often only "backend='inductor' raised:"
                first = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())[:200]
                self._backend = self._fall_back(
                    f"order_violation: torch.compile failed ({type(exc).__name__}: {first}); "
                    "using the blocked eager kernel", 3)
        return squared_violation_blocked(images, captions)

    def _holding_cache(self, dim: int) -> contextlib.AbstractContextManager:
        """A call that may compile (a range of d not run yet) holds the cache folder, verified first (a
        planted or altered file is never loaded) and recorded after; the others touch no file."""
        if self.ready(dim) or self._folder is None:
            return contextlib.nullcontext()
        return verified_cache(self._folder, "compiled order-violation kernels")

    def _compile(self) -> str:
        if os.environ.get("VSE_NO_COMPILE", "") not in ("", "0"):
            return self._fall_back("order_violation: VSE_NO_COMPILE is set; using the blocked eager kernel",
                                   4)
        try:
            # inductor's disk cache does not tell kernel sets apart: compile into this set's own folder
            self._folder = use_kernel_set_cache()
            # one kernel for every block shape (d <= 4096 and d > 4096 compile one each, since
            # inductor changes its accumulator for long reductions); fullgraph: fail here, not silently
            self._compiled = torch.compile(squared_violation_expr, dynamic=True, fullgraph=True)
        except UntrustedFolderError as exc:
            return self._fall_back(_untrusted(exc), 4)
        except Exception as exc:  # e.g. a Python version torch.compile does not support
            return self._fall_back(
                f"order_violation: torch.compile unavailable ({type(exc).__name__}: {exc}); "
                "using the blocked eager kernel", 4)
        return "compiled"

    def choose(self, measure: str, order_sqrt: bool, device: torch.device, dim: int, work: int,
               order_kernel: str = "auto", log: Callable[[str], None] | None = None) -> TileScorer:
        """The scorer of every tile of one evaluation, decided once for all of them.

        ``work``: the sum of N x M x d over its folds. ``auto`` on the CPU takes the compiled kernel
        when ``work >= compile_min_work`` (compiling it now, announced on ``log``) or when it has run
        for this range of d already, else the blocked one; on CUDA the eager broadcast.
        """
        if order_kernel not in ORDER_KERNELS:
            raise UserError(f"unknown order kernel {order_kernel!r} "
                            f"(expected one of {', '.join(ORDER_KERNELS)})")
        if measure != "order":
            return TileScorer(measure, order_sqrt)
        if order_kernel == "eager" or device.type != "cpu":
            return TileScorer(measure, order_sqrt, "eager")
        if order_kernel == "compiled" or (order_kernel == "auto" and work >= self.compile_min_work):
            self.prepare(dim, log)
        elif order_kernel == "blocked" or not self.ready(dim):
            return TileScorer(measure, order_sqrt, "blocked")
        return TileScorer(measure, order_sqrt, "compiled", self.squared_violation)
