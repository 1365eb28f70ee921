"""The CLMR/LIWE image encoder over region features: a non-local block, a per-region projection, pooling.

Wehrmann, Souza, Lopes and Barros, "Language-Agnostic Visual-Semantic Embeddings", ICCV 2019, section 2.3
("Self-Attentive Image Encoder"), with the released code (LAVSE: ``HierarchicalEncoder`` with
``SelfAttention``, image pooling ``mean``) where the paper is silent:

1. **non-local module** (Eq. 1) over the ``k`` regions of ``D`` features, regions as the "time" axis of
   1-D convolutions of length 1: ``q(x)``, ``k(x)`` reduce ``D`` 8-fold (``D / 8`` channels), ``v(x)`` keeps
   ``D`` (the paper says all three reduce; the code's ``v`` cannot, since its output is added back to ``x``);
   ``A = softmax_j(q(x_i) . k(x_j))``, ``y_i = gamma * sum_j A_ij v(x_j) + x_i`` with a learned scalar
   ``gamma`` initialised at 0, so the block starts as the identity (as in LAVSE and SAGAN, whose block it is);
2. a **1-D convolution of length 1** (one linear map shared by all regions, with bias) from ``D`` to the joint
   space ``d``, then **LeakyReLU(0.1)**: the paper's ``sigma(x) = max(0, x) + 0.1 min(0, x)``. The paper
   writes sigma inside Eq. 1; LAVSE's ``SelfAttention`` stores that activation but never applies it, and the
   LeakyReLU sits after the projection. The code's placement is kept;
3. **per-region L2 normalisation**, then the **mean over the real regions** (LAVSE ``l2norm`` then
   ``mean_pooling``). The final L2 normalisation of the image vector is the joint model's, not this module's.

Padding regions (an image with ``counts[b] < k`` regions, from adaptive 10..100 box files) are masked
explicitly: they are never attended to and never enter the mean, so an image's embedding does not depend on
how far it was padded. Initialisation follows LAVSE's ``default_initializer``: Xavier-uniform convolution
weights, zero biases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from train.models.registry import count_parameters, register_image_encoder

#: name under which phase B registers :class:`NonLocalRegionEncoder` as an image encoder
IMAGE_ENCODER_NAME = "nonlocal_regions"


def region_mask(counts: torch.Tensor | None, batch: int, k: int, device: torch.device) -> torch.Tensor:
    """Real regions: ``counts (B,) -> (B, k)`` bool, ``True`` for ``j < counts[b]`` (all when ``None``).
    Counts are clamped to ``1..k`` so every image has at least one region to attend to."""
    if counts is None:
        return torch.ones(batch, k, dtype=torch.bool, device=device)
    counts = counts.to(device).clamp(1, k)
    return torch.arange(k, device=device).unsqueeze(0) < counts.unsqueeze(1)


class NonLocalBlock(nn.Module):
    """Non-local (self-attention) block over regions: ``x (B, D, k), mask (B, k) -> (B, D, k)``.

    Args:
        dim: ``D``, channels of a region.
        reduction: ``q`` and ``k`` map ``D`` to ``D // reduction`` channels (8 in the paper; 1 is its
            "NLM WR" ablation).
    """

    def __init__(self, dim: int, reduction: int = 8) -> None:
        super().__init__()
        if reduction < 1 or dim // reduction < 1:
            raise ValueError(f"cannot reduce {dim} channels {reduction}-fold")
        inner = dim // reduction
        self.query = nn.Conv1d(dim, inner, 1)
        self.key = nn.Conv1d(dim, inner, 1)
        self.value = nn.Conv1d(dim, dim, 1)
        self.gamma = nn.Parameter(torch.zeros(1))

    def attention(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention weights ``(B, k, k)``: row ``i`` is region ``i``'s softmax over the real regions."""
        energy = torch.bmm(self.query(x).transpose(1, 2), self.key(x))  # (B, k_query, k_key)
        if mask is not None:
            energy = energy.masked_fill(~mask.unsqueeze(1), float("-inf"))
        return F.softmax(energy, dim=-1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``gamma * (v(x) A^T) + x``: each region gains the attention-weighted values of all regions."""
        attended = torch.bmm(self.value(x), self.attention(x, mask).transpose(1, 2))
        return self.gamma * attended + x


class NonLocalRegionEncoder(nn.Module):
    """CLMR/LIWE image encoder: ``features (B, k, D) float, counts (B,) long | None -> (B, d)``.

    The output is the mean of the real regions' unit-norm embeddings (not itself unit-norm: the joint model
    normalises). See the module docstring for the architecture and its sources.

    Args:
        feature_shape: ``(k, D)``, one image's region array (36 x 2048 for BUTD, 49 x 1280 for the
            EfficientNet-Lite0 grid).
        d: size of the joint space (1,024 in the paper).
        reduction: channel reduction of the non-local ``q`` and ``k``.
        nonlocal_block: ``False`` drops the block (the paper's "Without NLM" ablation).
        negative_slope: of the LeakyReLU after the projection.
    """

    def __init__(self, feature_shape: tuple[int, ...], d: int, reduction: int = 8,
                 nonlocal_block: bool = True, negative_slope: float = 0.1) -> None:
        super().__init__()
        if len(feature_shape) != 2:
            raise ValueError(f"region features have shape (k, D) per image, got {tuple(feature_shape)}")
        self.feature_shape = (int(feature_shape[0]), int(feature_shape[1]))
        dim = self.feature_shape[1]
        self.nonlocal_block = NonLocalBlock(dim, reduction) if nonlocal_block else None
        self.projection = nn.Conv1d(dim, d, 1)
        self.negative_slope = negative_slope
        self.output_dim = d
        for module in self.modules():
            if isinstance(module, nn.Conv1d):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def region_embeddings(self, features: torch.Tensor, counts: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, k, D) -> ((B, k, d) unit-norm region embeddings, (B, k) bool mask of real regions)``."""
        b, k, _ = features.shape
        mask = region_mask(counts, b, k, features.device)
        x = features.transpose(1, 2)  # (B, D, k): regions are the convolutions' time axis
        if self.nonlocal_block is not None:
            x = self.nonlocal_block(x, mask if counts is not None else None)
        z = F.leaky_relu(self.projection(x), self.negative_slope)
        return F.normalize(z, dim=1).transpose(1, 2), mask

    def forward(self, features: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """Mean over the real regions of the per-region unit-norm embeddings: ``(B, d)``."""
        z, mask = self.region_embeddings(features, counts)
        weights = mask.to(z.dtype).unsqueeze(2)
        return (z * weights).sum(dim=1) / weights.sum(dim=1)

    def num_parameters(self) -> int:
        """Number of trainable parameters."""
        return count_parameters(self)


@register_image_encoder("nonlocal_regions")
def create_region_encoder(feature_shape: tuple[int, ...], d: int, **kwargs) -> NonLocalRegionEncoder:
    """``create_image_encoder("nonlocal_regions", (k, D), d, **kw)``: the LIWE/CLMR region encoder."""
    return NonLocalRegionEncoder(feature_shape, d, **kwargs)
