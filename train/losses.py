"""Contrastive pairwise ranking losses over a batch of matching image-caption pairs.

CHAIN-VSE Eq. 3 / OECC Eq. 6 / FNE Eq. 1 (the sum of hinges):

    L = sum_m sum_k max{0, alpha - s(m, v) + s(m, v_k)} + sum_v sum_k max{0, alpha - s(v, m) + s(v, m_k)}

where row ``i`` of ``images`` and of ``captions`` is a matching pair ``(v, m)`` and every other
row of the batch is a contrastive example ``v_k`` / ``m_k`` (B - 1 of them per anchor, both
directions). ``s`` is ``train.similarity.similarity`` of an (image, caption) pair, whichever argument
the anchor is: the order violation is asymmetric but always measured with images below captions.

The max-of-hinges variant (VSE++, FNE Eq. 4) keeps only the hardest contrastive example of each
anchor. Both losses are summed over the batch, as the papers write them (not averaged), so the
learning rate of the papers (Adam 1e-3 with batch 128 / 100) applies unchanged. The papers' margin
is ``alpha = 0.05``.
"""

from __future__ import annotations

import torch

from train.similarity import similarity


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
        order_sqrt: use the square root of the order violation (see ``train.similarity``).
        image_index: optional (B,) ids of the images; pairs whose rows share an image (two captions of
            one image in a batch) are then not used as contrastive examples. ``None`` (the papers):
            every off-diagonal pair is contrastive.

    Returns:
        A scalar tensor: caption-retrieval hinges (image anchors) plus image-retrieval hinges
        (caption anchors).
    """
    if reduction not in ("sum", "max"):
        raise ValueError(f"unknown reduction {reduction!r} (expected 'sum' or 'max')")
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
    cost_captions = cost_captions.masked_fill(not_contrastive, 0)
    cost_images = cost_images.masked_fill(not_contrastive, 0)
    if reduction == "max":
        # hinges are >= 0, so an anchor without any contrastive example contributes 0
        return cost_captions.amax(dim=1).sum() + cost_images.amax(dim=0).sum()
    return cost_captions.sum() + cost_images.sum()
