"""``train.engine.losses.contrastive_loss`` against values worked out by hand."""

from __future__ import annotations

import pytest
import torch

from train.engine.losses import contrastive_loss

# three unit vectors; S[i, j] = image i . caption j:
#   i0 = (1, 0):     1.0, 0.6, 0.0
#   i1 = (0, 1):     0.0, 0.8, 1.0
#   i2 = (0.6, 0.8): 0.6, 1.0, 0.8      positives on the diagonal: 1.0, 0.8, 0.8
COS_IMAGES = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
COS_CAPTIONS = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])


def test_cosine_sum_of_hinges():
    # margin 0.5; image anchors (rows, without the diagonal):
    #   i0: 0.5 - 1 + 0.6 = 0.1, 0.5 - 1 + 0 -> 0            = 0.1
    #   i1: 0.5 - 0.8 + 0 -> 0,  0.5 - 0.8 + 1 = 0.7          = 0.7
    #   i2: 0.5 - 0.8 + 0.6 = 0.3, 0.5 - 0.8 + 1.0 = 0.7      = 1.0
    # caption anchors (columns):
    #   c0: 0.5 - 1 + 0 -> 0,  0.5 - 1 + 0.6 = 0.1            = 0.1
    #   c1: 0.5 - 0.8 + 0.6 = 0.3, 0.5 - 0.8 + 1.0 = 0.7      = 1.0
    #   c2: 0.5 - 0.8 + 0 -> 0, 0.5 - 0.8 + 1 = 0.7           = 0.7
    loss = contrastive_loss(COS_IMAGES, COS_CAPTIONS, "cosine", margin=0.5)
    assert loss.item() == pytest.approx(3.6, abs=1e-6)


def test_cosine_max_of_hinges_keeps_the_hardest_negative():
    # the largest hinge of each anchor above: 0.1 + 0.7 + 0.7 + 0.1 + 0.7 + 0.7
    loss = contrastive_loss(COS_IMAGES, COS_CAPTIONS, "cosine", margin=0.5, reduction="max")
    assert loss.item() == pytest.approx(3.0, abs=1e-6)


def test_pairs_of_the_same_image_are_not_contrastive():
    # rows 1 and 2 share an image: the hinges (i1, c2), (i2, c1) and their column twins drop out
    # i0 0.1, i1 0, i2 0.3, c0 0.1, c1 0.3, c2 0
    loss = contrastive_loss(COS_IMAGES, COS_CAPTIONS, "cosine", margin=0.5,
                            image_index=torch.tensor([7, 3, 3]))
    assert loss.item() == pytest.approx(0.8, abs=1e-6)


def test_order_sum_of_hinges_default_margin():
    images = torch.tensor([[0.6, 0.8], [1.0, 0.0]])
    captions = torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    # S = [[0, -0.04], [-0.64, -1]] (see test_similarity); margin 0.05
    # i0: 0.05 - 0 - 0.04 = 0.01; i1: 0.05 + 1 - 0.64 = 0.41
    # c0: 0.05 - 0 - 0.64 -> 0;   c1: 0.05 + 1 - 0.04 = 1.01
    loss = contrastive_loss(images, captions, "order")
    assert loss.item() == pytest.approx(1.43, abs=1e-6)
    # two items: one contrastive example per anchor, so max = sum
    hardest = contrastive_loss(images, captions, "order", reduction="max")
    assert hardest.item() == pytest.approx(1.43, abs=1e-6)


def test_order_square_root_variant():
    images = torch.tensor([[0.6, 0.8], [1.0, 0.0]])
    captions = torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    # S = [[0, -0.2], [-0.8, -1]]: i0 0.05 - 0.2 -> 0; i1 0.05 + 1 - 0.8 = 0.25;
    # c0 0.05 - 0.8 -> 0; c1 0.05 + 1 - 0.2 = 0.85
    loss = contrastive_loss(images, captions, "order", order_sqrt=True)
    assert loss.item() == pytest.approx(1.1, abs=1e-6)


def test_a_perfectly_ordered_batch_costs_nothing_and_gradients_flow():
    # each caption equals its image; the other images lie far below every caption
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    captions = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    loss = contrastive_loss(images, captions, "order", margin=0.05)
    assert loss.item() == 0.0
    loss = contrastive_loss(images, captions, "order", margin=2.0)  # 2 - 0 - 1 = 1 per hinge, 4 hinges
    assert loss.item() == pytest.approx(4.0)
    loss.backward()
    assert torch.isfinite(images.grad).all() and images.grad.abs().sum() > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="reduction"):
        contrastive_loss(COS_IMAGES, COS_CAPTIONS, "cosine", reduction="mean")
    with pytest.raises(ValueError, match="pair up"):
        contrastive_loss(COS_IMAGES, COS_CAPTIONS[:2], "cosine")
