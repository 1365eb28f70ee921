"""Contrastive pairwise ranking losses over a batch of matching image-caption pairs.

CHAIN-VSE Eq. 3 / OECC Eq. 6 / FNE Eq. 1 (the sum of hinges):

    L = sum_m sum_k max{0, alpha - s(m, v) + s(m, v_k)} + sum_v sum_k max{0, alpha - s(v, m) + s(v, m_k)}

where row ``i`` of ``images`` and of ``captions`` is a matching pair ``(v, m)`` and every other
row of the batch is a contrastive example ``v_k`` / ``m_k`` (B - 1 of them per anchor, both
directions). ``s`` is ``train.engine.similarity.similarity`` of an (image, caption) pair, whichever argument
the anchor is: the order violation is asymmetric but always measured with images below captions.

The max-of-hinges variant (VSE++, FNE Eq. 4) keeps only the hardest contrastive example of each
anchor. Both losses are summed over the batch, as the papers write them (not averaged), so the
learning rate of the papers (Adam 1e-3 with batch 128 / 100) applies unchanged. The papers' margin
is ``alpha = 0.05``.
"""

from __future__ import annotations

import torch

from train.engine.similarity import similarity


def contrastive_loss(images: torch.Tensor, captions: torch.Tensor, measure: str = "order",
                     margin: float = 0.05, reduction: str = "sum", order_sqrt: bool = False,
                     image_index: torch.Tensor | None = None) -> torch.Tensor:
    """Contrastive pairwise ranking loss of a batch of matching pairs.

    Args:
        images: (B, d) image embeddings; row i matches ``captions[i]``.
        captions: (B, d) caption embeddings.
        measure: ``"order"`` (negative order violation) or ``"cosine"``.
        margin: ``alpha``.
        reduction: ``"sum"`` sums the hinges over all contrastive examples; ``"max"`` keeps the largest
            hinge of each anchor (hardest negative).
        order_sqrt: use the square root of the order violation (see ``train.engine.similarity``).
        image_index: optional (B,) ids of the images; pairs whose rows share an image (two captions of
            one image in a batch) are then not used as contrastive examples. ``None`` (the papers):
            every off-diagonal pair is contrastive.

    Returns:
        A scalar tensor: caption-retrieval hinges (image anchors) plus image-retrieval hinges
        (caption anchors).
    """
    if reduction not in ("sum", "max"):
        raise ValueError(f"unknown reduction {reduction!r} (expected 'sum' or 'max')")
    cost_captions, cost_images = hinge_costs(images, captions, measure, margin, order_sqrt, image_index)
    if reduction == "max":
        return _max_of_hinges(cost_captions, cost_images)
    return cost_captions.sum() + cost_images.sum()


def hinge_costs(images: torch.Tensor, captions: torch.Tensor, measure: str = "order", margin: float = 0.05,
                order_sqrt: bool = False, image_index: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The hinges of a batch of matching pairs, ``(cost_captions, cost_images)``, both (B, B) >= 0.

    ``cost_captions[i, j]``: image ``i`` as anchor, caption ``j`` its contrastive example;
    ``cost_images[i, j]``: caption ``j`` as anchor, image ``i`` its contrastive example. Entries that are
    not contrastive (the diagonal, or rows sharing an ``image_index``) are 0. Arguments as
    :func:`contrastive_loss`.
    """
    if images.shape != captions.shape:
        raise ValueError(f"images {tuple(images.shape)} and captions {tuple(captions.shape)} must pair up")
    scores = similarity(images, captions, measure, order_sqrt=order_sqrt)  # (B, B): [image, caption]
    positive = scores.diagonal()
    # image i as anchor, caption j as its contrastive example; caption j as anchor, image i as its
    cost_captions = (margin - positive.unsqueeze(1) + scores).clamp_min(0)
    cost_images = (margin - positive.unsqueeze(0) + scores).clamp_min(0)
    b = scores.shape[0]
    if image_index is None:
        not_contrastive = torch.eye(b, dtype=torch.bool, device=scores.device)
    else:
        not_contrastive = image_index.unsqueeze(0) == image_index.unsqueeze(1)
    return cost_captions.masked_fill(not_contrastive, 0), cost_images.masked_fill(not_contrastive, 0)


def _max_of_hinges(cost_captions: torch.Tensor, cost_images: torch.Tensor) -> torch.Tensor:
    # hinges are >= 0, so an anchor without any contrastive example contributes 0
    return cost_captions.amax(dim=1).sum() + cost_images.amax(dim=0).sum()


def hard_negative_weight(eta: float, iteration: int) -> float:
    """``lambda = 1 - eta^iteration`` (LIWE paper, Eq. 3), growing from 0 (iteration 0) to 1."""
    return 1.0 - float(eta) ** int(iteration)


def scheduled_contrastive_loss(a: torch.Tensor, b: torch.Tensor, max_weight: float | torch.Tensor,
                               measure: str = "cosine", margin: float = 0.2,
                               image_index: torch.Tensor | None = None) -> torch.Tensor:
    """LIWE paper Eq. 2: ``J = lambda * J_max + (1 - lambda) * J_sum`` over one batch of matching rows.

    Args:
        a: (B, d) anchors of one side (images, or the sentences of one language); row i matches ``b[i]``.
        b: (B, d) the other side (captions, or the aligned sentences of another language).
        max_weight: ``lambda`` (:func:`hard_negative_weight`); a 0-dim tensor in a compiled loss (whose
            changing value then compiles nothing), where ``lambda = 1`` is not a special case.
        measure, margin, image_index: as :func:`contrastive_loss`.

    Returns:
        A scalar tensor: ``J_max`` (Eq. 5, hardest contrastive example of each anchor, both directions) and
        ``J_sum`` (Eq. 4, every contrastive example) of the same hinges, both summed over the batch.
    """
    cost_a, cost_b = hinge_costs(a, b, measure, margin, False, image_index)
    hardest = _max_of_hinges(cost_a, cost_b)
    if not isinstance(max_weight, torch.Tensor) and max_weight >= 1.0:
        return hardest
    return max_weight * hardest + (1.0 - max_weight) * (cost_a.sum() + cost_b.sum())
