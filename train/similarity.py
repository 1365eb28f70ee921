"""Image-caption similarities shared by the losses and the evaluation.

Both functions take a block of images and a block of captions and return the (N, M) matrix of
similarities; larger is more similar. The evaluation calls them on bounded blocks, the losses on
a training batch.

Order violation (Vendrov et al., 2016): images sit *below* captions in the partial order (a
caption is an abstraction of its image), so a pair is penalised for every caption component that
exceeds the image's:

    S_OE(i, c) = -|| max(0, c - i) ||^2

This is the direction of Vendrov et al., of the FNE paper's Eq. (3) and of the released
CHAIN-VSE/SEAM code, although the CHAIN-VSE and SEAM papers write ``s(x, y) = -|max(0, y - x)|^2``
with the arguments the other way round. The released code also takes the square root of the sum
(``sqrt=True``): rankings are the same, the loss is not. The default is the squared form of the
papers' equations.
"""

from __future__ import annotations

import torch

#: caption-dimension chunk for the order-violation broadcast, bounding memory at N x chunk x d
_ORDER_CHUNK_ELEMS = 1 << 24


def cosine(images: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of L2-normalised embeddings: ``images (N, d) @ captions (M, d).T -> (N, M)``."""
    return images @ captions.t()


def order_violation(images: torch.Tensor, captions: torch.Tensor, sqrt: bool = False) -> torch.Tensor:
    """Negative order violation ``-||max(0, c - i)||^2`` of every pair.

    Args:
        images: (N, d) image embeddings (non-negative in the order-embedding models).
        captions: (M, d) caption embeddings.
        sqrt: take the square root of the summed squared violation (the released code's form).

    Returns:
        (N, M) similarities, ``<= 0``; 0 where the caption lies entirely below the image.
        Memory is bounded by processing captions in chunks of about 16M broadcast elements.
    """
    n, d = images.shape
    m = captions.shape[0]
    step = max(1, _ORDER_CHUNK_ELEMS // max(1, n * d))
    parts = []
    for start in range(0, m, step):
        c = captions[start:start + step]
        diff = c.unsqueeze(0) - images.unsqueeze(1)  # (N, m_chunk, d)
        if torch.is_grad_enabled() and (images.requires_grad or captions.requires_grad):
            v = diff.clamp_min(0).pow(2).sum(dim=2)
        else:  # evaluation: reuse the buffer
            v = diff.clamp_min_(0).pow_(2).sum(dim=2)
        parts.append(v)
    out = torch.cat(parts, dim=1) if len(parts) != 1 else parts[0]
    if sqrt:
        # the epsilon keeps the gradient finite where there is no violation at all
        out = out.clamp_min(1e-12).sqrt() if out.requires_grad else out.sqrt()
    return -out


def similarity(images: torch.Tensor, captions: torch.Tensor, measure: str, order_sqrt: bool = False
               ) -> torch.Tensor:
    """Dispatch on ``measure`` (``"order"`` or ``"cosine"``); returns (N, M)."""
    if measure == "cosine":
        return cosine(images, captions)
    if measure == "order":
        return order_violation(images, captions, sqrt=order_sqrt)
    raise ValueError(f"unknown similarity measure {measure!r} (expected 'order' or 'cosine')")
