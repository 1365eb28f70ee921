"""The evaluator's order-violation kernel (``train.retrieval.evaluate.order_kernel.OrderKernel``): when it
compiles,
what it falls back to, and that the compiled kernel agrees with the eager one. Each test makes its own
kernel object, so no test sees another's compilation state."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from train.engine.similarity import order_violation, squared_violation_expr
from train.retrieval.evaluate.order_kernel import COMPILE_SECONDS_ESTIMATE, OrderKernel

# the fused kernels differ from the eager one in the order of the float32 summation over d only
FUSED_RTOL, FUSED_ATOL = 1e-5, 1e-5
CPU = torch.device("cpu")

#: the compiled kernel's first call compiles C++ (about 12 s on 2 loaded cores with a cold
#: inductor cache, a few seconds with a warm one); VSE_TEST_COMPILE=0 skips it (e.g. no compiler)
needs_compile = pytest.mark.skipif(
    os.environ.get("VSE_TEST_COMPILE", "1") == "0", reason="VSE_TEST_COMPILE=0")


def order_inputs(n: int, m: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=gen), torch.rand(m, d, generator=gen)


@pytest.fixture(autouse=True)
def compiling_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VSE_NO_COMPILE", raising=False)


def compiled(kernel: OrderKernel, images: torch.Tensor, captions: torch.Tensor, sqrt: bool = False
             ) -> torch.Tensor:
    """The order violation through ``kernel``'s compiled path."""
    return order_violation(images, captions, sqrt, fused=True, squared=kernel.squared_violation)


def assert_blocked_fallback_taken_once(kernel: OrderKernel, images, captions, out, sqrt: bool = False
                                       ) -> None:
    """The compiled path fell back to the blocked kernel, agrees with eager and warns no more."""
    assert kernel.backend == "blocked" and kernel.disabled()
    torch.testing.assert_close(out, order_violation(images, captions, fused=False),
                               rtol=FUSED_RTOL, atol=FUSED_ATOL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only once
        compiled(kernel, images, captions, sqrt)


def test_no_compile_uses_the_blocked_kernel_with_one_warning(monkeypatch) -> None:
    monkeypatch.setenv("VSE_NO_COMPILE", "1")
    kernel = OrderKernel()
    images, captions = order_inputs(20, 90, 64)
    with pytest.warns(RuntimeWarning, match="VSE_NO_COMPILE"):
        out = compiled(kernel, images, captions)
    assert_blocked_fallback_taken_once(kernel, images, captions, out, sqrt=True)


def test_compile_failure_falls_back_once_without_crashing(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found\nmore detail")

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: broken)
    kernel = OrderKernel()
    images, captions = order_inputs(20, 90, 64)
    with pytest.warns(RuntimeWarning, match="torch.compile failed .*InvalidCxxCompiler"):
        out = compiled(kernel, images, captions)
    assert_blocked_fallback_taken_once(kernel, images, captions, out)

    def refuses(fn, **kw):
        raise RuntimeError("torch.compile is not supported on this Python")

    monkeypatch.setattr(torch, "compile", refuses)
    with pytest.warns(RuntimeWarning, match="torch.compile unavailable"):
        compiled(OrderKernel(), images, captions)


@needs_compile
def test_compiled_kernel_equals_eager() -> None:
    kernel = OrderKernel()
    images, captions = order_inputs(48, 260, 1024)
    out = compiled(kernel, images, captions)  # compiles
    if kernel.backend != "compiled":
        pytest.skip(f"torch.compile cannot build here: {kernel.fallback_reason}")
    eager = order_violation(images, captions, fused=False)
    torch.testing.assert_close(out, eager, rtol=FUSED_RTOL, atol=FUSED_ATOL)
    # another block shape and d reuse the dynamic-shape kernel; the square root as eager
    images, captions = order_inputs(9, 33, 700, seed=1)
    torch.testing.assert_close(compiled(kernel, images, captions, sqrt=True),
                               order_violation(images, captions, sqrt=True, fused=False),
                               rtol=FUSED_RTOL, atol=FUSED_ATOL)
    # a single image or caption (a size the dynamic kernel would specialise) is computed as two equal
    # rows: the same bits as in a larger block
    whole = compiled(kernel, images, captions)
    assert torch.equal(compiled(kernel, images[3:4], captions), whole[3:4])
    assert torch.equal(compiled(kernel, images, captions[5:6]), whole[:, 5:6])


def test_compilation_only_when_asked_or_worth_it(monkeypatch) -> None:
    """``auto`` compiles only from ``compile_min_work``; once compiled, the kernel is used freely."""
    compilations: list[object] = []

    def fake_compile(fn, **kw):  # the "compiled" kernel is the expression itself: no C++ build
        compilations.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    work = 20 * 90 * 64
    kernel = OrderKernel(compile_min_work=work + 1)
    lines: list[str] = []
    assert kernel.choose("order", False, CPU, 64, work, log=lines.append).kernel == "blocked"
    assert compilations == [] and kernel.backend is None and lines == []  # small: the blocked kernel
    assert not kernel.ready(64)
    kernel.prepare(64, lines.append)
    assert len(compilations) == 1 and kernel.ready(64)
    assert lines == [f"compiling the fused order-violation kernel (once per process, "
                     f"~{COMPILE_SECONDS_ESTIMATE} s; VSE_NO_COMPILE=1 skips it)"]
    kernel.prepare(64, lines.append)
    assert len(lines) == 1  # compiled already: no second line
    assert not kernel.ready(8192)  # long reductions: another kernel
    scorer = kernel.choose("order", False, CPU, 64, work)  # small, but ready: the compiled kernel
    assert scorer.kernel == "compiled"
    images, captions = order_inputs(20, 90, 64)
    torch.testing.assert_close(scorer(images, captions), -squared_violation_expr(images, captions))
    assert kernel.choose("order", False, CPU, 64, work, "blocked").kernel == "blocked"
    assert kernel.choose("order", False, CPU, 64, work, "eager").kernel == "eager"
    assert kernel.choose("cosine", False, CPU, 64, work, "compiled").kernel == ""
    assert kernel.choose("order", False, torch.device("cuda"), 64, work).kernel == "eager"
    fresh = OrderKernel(compile_min_work=work)  # large enough on its own: compiles, once
    assert fresh.choose("order", False, CPU, 64, work, log=lines.append).kernel == "compiled"
    assert len(compilations) == 2 and len(lines) == 2 and fresh.ready(64)
    assert not OrderKernel().ready(64)  # each kernel object has its own state


def test_the_shared_kernel_is_one_object() -> None:
    assert OrderKernel.shared() is OrderKernel.shared()
