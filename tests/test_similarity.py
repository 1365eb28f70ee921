"""``train.similarity`` against values worked out by hand."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import train.similarity as similarity_module
from train.similarity import cosine, order_violation, similarity


def test_order_violation_penalises_caption_components_above_the_image():
    images = torch.tensor([[0.8, 0.6], [0.5, 0.5]])
    captions = torch.tensor([[0.5, 0.5], [0.8, 0.6]])
    # [image 0, caption 0]: caption below the image -> no violation
    # [image 0, caption 1]: equal -> 0
    # [image 1, caption 0]: equal -> 0
    # [image 1, caption 1]: c - i = (0.3, 0.1) -> -(0.09 + 0.01) = -0.1
    expected = torch.tensor([[0.0, 0.0], [0.0, -0.1]])
    torch.testing.assert_close(order_violation(images, captions), expected)


def test_order_violation_hand_values_and_square_root():
    images = torch.tensor([[0.6, 0.8], [1.0, 0.0]])
    captions = torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    # c1 - i0 = (-0.6, 0.2) -> 0.04; c0 - i1 = (-0.4, 0.8) -> 0.64; c1 - i1 = (-1, 1) -> 1
    squared = torch.tensor([[0.0, -0.04], [-0.64, -1.0]])
    torch.testing.assert_close(order_violation(images, captions), squared)
    rooted = torch.tensor([[0.0, -0.2], [-0.8, -1.0]])
    torch.testing.assert_close(order_violation(images, captions, sqrt=True), rooted)
    torch.testing.assert_close(similarity(images, captions, "order", order_sqrt=True), rooted)


def test_order_violation_is_not_symmetric():
    a = torch.tensor([[1.0, 0.0]])
    b = torch.tensor([[0.0, 1.0]])
    big = torch.tensor([[1.0, 1.0]])
    assert order_violation(big, a).item() == 0.0  # caption a lies below image big
    assert order_violation(a, big).item() == pytest.approx(-1.0)  # caption big above image a: (0, 1)
    assert order_violation(a, b).item() == pytest.approx(-1.0)


def test_cosine_is_the_inner_product():
    images = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    captions = torch.tensor([[0.0, 1.0], [0.6, 0.8], [1.0, 0.0]])
    expected = torch.tensor([[0.0, 0.6, 1.0], [0.8, 1.0, 0.6]])
    torch.testing.assert_close(cosine(images, captions), expected)
    torch.testing.assert_close(similarity(images, captions, "cosine"), expected)


def test_unknown_measure_is_an_error():
    with pytest.raises(ValueError, match="unknown similarity"):
        similarity(torch.zeros(1, 2), torch.zeros(1, 2), "euclid")


def test_chunked_order_violation_equals_one_block(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(5, 3, generator=gen)
    captions = torch.rand(7, 3, generator=gen)
    whole = order_violation(images, captions)
    monkeypatch.setattr(similarity_module, "_ORDER_CHUNK_ELEMS", 5 * 3 * 2)  # two captions a chunk
    torch.testing.assert_close(order_violation(images, captions), whole)
    # the reference, written out pair by pair
    ref = torch.tensor([[-float(((c - i).clamp_min(0) ** 2).sum()) for c in captions] for i in images])
    torch.testing.assert_close(whole, ref)


def test_evaluation_path_leaves_inputs_untouched():
    images = torch.tensor([[0.2, 0.1]])
    captions = torch.tensor([[0.5, 0.0]])
    with torch.no_grad():
        out = order_violation(images, captions)
    torch.testing.assert_close(out, torch.tensor([[-0.09]]))
    torch.testing.assert_close(captions, torch.tensor([[0.5, 0.0]]))
    torch.testing.assert_close(images, torch.tensor([[0.2, 0.1]]))


def test_square_root_gradient_is_finite_without_violation():
    images = torch.tensor([[1.0, 1.0]], requires_grad=True)
    captions = torch.tensor([[0.5, 0.5]], requires_grad=True)
    order_violation(images, captions, sqrt=True).sum().backward()
    assert torch.isfinite(images.grad).all() and torch.isfinite(captions.grad).all()


# --------------------------------------------------------------------------- fused CPU kernels
# The fused kernels differ from the eager one only in the order of the float32 summation over d;
# relative differences measured about 1e-7..4e-6 (d = 1024..8192), so rtol 1e-5 is the tolerance.
FUSED_RTOL, FUSED_ATOL = 1e-5, 1e-5

#: the compiled kernel's first call compiles C++ (about 12 s on 2 loaded cores with a cold
#: inductor cache, a few seconds with a warm one); VSE_TEST_COMPILE=0 skips it (e.g. no compiler)
needs_compile = pytest.mark.skipif(
    os.environ.get("VSE_TEST_COMPILE", "1") == "0", reason="VSE_TEST_COMPILE=0")


def order_inputs(n: int, m: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=gen), torch.rand(m, d, generator=gen)


@pytest.fixture
def fresh_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fused kernel chosen yet, whatever earlier tests did; restored afterwards."""
    monkeypatch.setattr(similarity_module, "_fused_backend", None)
    monkeypatch.setattr(similarity_module, "_compiled_kernel", None)
    monkeypatch.setattr(similarity_module, "_compiled_ready", set())
    monkeypatch.delenv("VSE_NO_COMPILE", raising=False)


def test_blocked_kernel_equals_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    images, captions = order_inputs(37, 301, 520)
    eager = order_violation(images, captions, fused=False)
    blocked = -similarity_module._squared_violation_blocked(images, captions)
    torch.testing.assert_close(blocked, eager, rtol=FUSED_RTOL, atol=FUSED_ATOL)
    # sub-tiles that do not divide the block, on both axes
    monkeypatch.setattr(similarity_module, "_BLOCK_IMAGES", 8)
    monkeypatch.setattr(similarity_module, "_BLOCK_CAPTIONS", 50)
    small = -similarity_module._squared_violation_blocked(images, captions)
    torch.testing.assert_close(small, eager, rtol=FUSED_RTOL, atol=FUSED_ATOL)


def test_fused_path_is_taken_only_for_large_gradient_free_cpu_blocks(monkeypatch, fresh_backend):
    calls = []

    def spy(images, captions, compile=None):
        calls.append(tuple(images.shape) + (captions.shape[0],))
        return similarity_module._squared_violation_blocked(images, captions)

    monkeypatch.setattr(similarity_module, "_fused_squared_violation", spy)
    images, captions = order_inputs(5, 7, 3)
    order_violation(images, captions)
    assert calls == []  # small: eager
    monkeypatch.setattr(similarity_module, "FUSED_MIN_WORK", 5 * 7 * 3)
    out = order_violation(images, captions)
    assert calls == [(5, 3, 7)]
    torch.testing.assert_close(out, order_violation(images, captions, fused=False))
    images.requires_grad_(True)
    order_violation(images, captions).sum().backward()  # training: eager, with gradients
    assert len(calls) == 1 and images.grad is not None
    with torch.no_grad():
        order_violation(images, captions, sqrt=True)
    assert len(calls) == 2
    order_violation(images.detach().double(), captions.double())
    assert len(calls) == 2  # float64: eager


def assert_blocked_fallback_taken_once(images, captions, out, sqrt: bool = False) -> None:
    """The fused path fell back to the blocked kernel, agrees with eager and warns no more."""
    assert similarity_module.fused_backend() == "blocked"
    torch.testing.assert_close(out, order_violation(images, captions, fused=False),
                               rtol=FUSED_RTOL, atol=FUSED_ATOL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only once
        order_violation(images, captions, sqrt=sqrt, fused=True, compile=True)


def test_no_compile_uses_the_blocked_kernel_with_one_warning(monkeypatch, fresh_backend):
    monkeypatch.setenv("VSE_NO_COMPILE", "1")
    images, captions = order_inputs(20, 90, 64)
    with pytest.warns(RuntimeWarning, match="VSE_NO_COMPILE"):
        out = order_violation(images, captions, fused=True, compile=True)
    assert_blocked_fallback_taken_once(images, captions, out, sqrt=True)


def test_compile_failure_falls_back_once_without_crashing(monkeypatch, fresh_backend):
    def broken(*args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found\nmore detail")

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: broken)
    images, captions = order_inputs(20, 90, 64)
    with pytest.warns(RuntimeWarning, match="torch.compile failed .*InvalidCxxCompiler"):
        out = order_violation(images, captions, fused=True, compile=True)
    assert_blocked_fallback_taken_once(images, captions, out)

    def refuses(fn, **kw):
        raise RuntimeError("torch.compile is not supported on this Python")

    monkeypatch.setattr(similarity_module, "_fused_backend", None)
    monkeypatch.setattr(torch, "compile", refuses)
    with pytest.warns(RuntimeWarning, match="torch.compile unavailable"):
        order_violation(images, captions, fused=True, compile=True)


@needs_compile
def test_compiled_kernel_equals_eager(fresh_backend):
    images, captions = order_inputs(48, 260, 1024)
    out = order_violation(images, captions, fused=True, compile=True)  # compiles
    if similarity_module.fused_backend() != "compiled":
        pytest.fail("torch.compile fell back (see the warning); set VSE_TEST_COMPILE=0 to skip")
    eager = order_violation(images, captions, fused=False)
    torch.testing.assert_close(out, eager, rtol=FUSED_RTOL, atol=FUSED_ATOL)
    # another block shape and d reuse the dynamic-shape kernel; the square root as eager
    images, captions = order_inputs(9, 33, 700, seed=1)
    torch.testing.assert_close(order_violation(images, captions, sqrt=True, fused=True, compile=True),
                               order_violation(images, captions, sqrt=True, fused=False),
                               rtol=FUSED_RTOL, atol=FUSED_ATOL)
    # a single image or caption (a size the dynamic kernel would specialise) is computed as two equal
    # rows: the same bits as in a larger block
    whole = order_violation(images, captions, fused=True, compile=True)
    assert torch.equal(order_violation(images[3:4], captions, fused=True, compile=True), whole[3:4])
    assert torch.equal(order_violation(images, captions[5:6], fused=True, compile=True), whole[:, 5:6])


def test_compilation_only_when_asked_or_worth_it(monkeypatch, fresh_backend):
    """``compile=None`` compiles only above COMPILE_MIN_WORK; once compiled, the kernel is used freely."""
    compiled: list[object] = []

    def fake_compile(fn, **kw):  # the "compiled" kernel is the expression itself: no C++ build
        compiled.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    images, captions = order_inputs(20, 90, 64)
    with torch.no_grad():
        order_violation(images, captions, fused=True)
    assert compiled == [] and similarity_module.fused_backend() is None  # small: the blocked kernel
    lines: list[str] = []
    assert not similarity_module.compiled_kernel_ready(64)
    similarity_module.prepare_compiled_kernel(64, lines.append)
    assert len(compiled) == 1 and similarity_module.compiled_kernel_ready(64)
    assert lines == [f"compiling the fused order-violation kernel (once per process, "
                     f"~{similarity_module.COMPILE_SECONDS_ESTIMATE} s; VSE_NO_COMPILE=1 skips it)"]
    similarity_module.prepare_compiled_kernel(64, lines.append)
    assert len(lines) == 1  # compiled already: no second line
    assert not similarity_module.compiled_kernel_ready(8192)  # long reductions: another kernel
    calls = []
    monkeypatch.setattr(similarity_module, "_compiled_kernel", lambda i, c: calls.append(1) or
                        similarity_module._squared_violation_expr(i, c))
    order_violation(images, captions, fused=True)  # compile=None, but ready: the compiled kernel
    assert calls == [1]
    order_violation(images, captions, fused=True, compile=False)
    assert calls == [1]
    monkeypatch.setattr(similarity_module, "_compiled_ready", set())
    monkeypatch.setattr(similarity_module, "COMPILE_MIN_WORK", 20 * 90 * 64)
    order_violation(images, captions, fused=True)  # large enough on its own
    assert calls == [1, 1]
