"""``train.engine.similarity`` against values worked out by hand."""

from __future__ import annotations

import pytest
import torch

import train.engine.similarity as similarity_module
from train.engine.similarity import cosine, order_violation, similarity, squared_violation_blocked


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
# The compiled kernel belongs to the evaluator: tests/test_order_kernel.py.
FUSED_RTOL, FUSED_ATOL = 1e-5, 1e-5


def order_inputs(n: int, m: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=gen), torch.rand(m, d, generator=gen)


def test_blocked_kernel_equals_eager() -> None:
    images, captions = order_inputs(37, 301, 520)
    eager = order_violation(images, captions, fused=False)
    blocked = -squared_violation_blocked(images, captions)
    torch.testing.assert_close(blocked, eager, rtol=FUSED_RTOL, atol=FUSED_ATOL)
    # sub-tiles that do not divide the block, on both axes
    small = -squared_violation_blocked(images, captions, block_images=8, block_captions=50)
    torch.testing.assert_close(small, eager, rtol=FUSED_RTOL, atol=FUSED_ATOL)


def test_fused_path_is_taken_only_for_large_gradient_free_cpu_blocks(monkeypatch) -> None:
    calls = []

    def spy(images, captions):
        calls.append(tuple(images.shape) + (captions.shape[0],))
        return squared_violation_blocked(images, captions)

    images, captions = order_inputs(5, 7, 3)
    order_violation(images, captions, squared=spy)
    assert calls == []  # small: eager
    monkeypatch.setattr(similarity_module, "FUSED_MIN_WORK", 5 * 7 * 3)
    out = order_violation(images, captions, squared=spy)
    assert calls == [(5, 3, 7)]
    torch.testing.assert_close(out, order_violation(images, captions, fused=False))
    images.requires_grad_(True)
    order_violation(images, captions, squared=spy).sum().backward()  # training: eager, with gradients
    assert len(calls) == 1 and images.grad is not None
    with torch.no_grad():
        order_violation(images, captions, sqrt=True, squared=spy)
    assert len(calls) == 2
    order_violation(images.detach().double(), captions.double(), squared=spy)
    assert len(calls) == 2  # float64: eager
    torch.testing.assert_close(order_violation(images.detach(), captions),  # default: the blocked kernel
                               order_violation(images.detach(), captions, fused=False))


@pytest.mark.parametrize("sqrt", [False, True])
def test_the_bounded_training_kernel_gives_the_broadcasts_loss_and_gradients(monkeypatch, sqrt) -> None:
    """Issue 44: a large training batch's order violation, chunked over d with its own backward pass (no
    B x B x d tensor kept), gives the eager broadcast's loss and gradients to float rounding."""
    from train.engine.losses import contrastive_loss

    # the kernel is chosen by size: every batch of 128 at d = 1,024 (the README's runs) stays eager
    assert 128 * 128 * 1024 <= similarity_module.BOUNDED_MIN_ELEMS

    def loss_and_grads(bounded: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        monkeypatch.setattr(similarity_module, "BOUNDED_MIN_ELEMS", 0 if bounded else 1 << 62)
        # 7 x 7 x 5 elements a chunk: 5 components, the last chunk of 53 shorter
        monkeypatch.setattr(similarity_module, "BOUNDED_CHUNK_ELEMS", 7 * 7 * 5)
        images, captions = (torch.nn.functional.normalize(x, dim=1).requires_grad_(True)
                            for x in order_inputs(7, 7, 53, seed=3))
        loss = contrastive_loss(images, captions, "order", 0.05, "sum", order_sqrt=sqrt)
        loss.backward()
        return loss.detach(), images.grad, captions.grad

    eager, bounded = loss_and_grads(False), loss_and_grads(True)
    assert eager[0] > 0
    for a, b in zip(bounded, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_bounded_kernel_is_taken_only_with_gradients(monkeypatch) -> None:
    calls = []
    real = similarity_module.bounded_squared_violation
    monkeypatch.setattr(similarity_module, "bounded_squared_violation",
                        lambda i, c: calls.append(i.shape) or real(i, c))
    monkeypatch.setattr(similarity_module, "BOUNDED_MIN_ELEMS", 10)
    images, captions = order_inputs(4, 4, 3)
    order_violation(images, captions)  # no gradient: not it
    assert calls == []
    images.requires_grad_(True)
    order_violation(images, captions).sum().backward()
    assert len(calls) == 1 and images.grad is not None
