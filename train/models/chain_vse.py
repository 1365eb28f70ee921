"""CHAIN-VSE: character-level inception text encoders, v1 and v2.

Wehrmann and Barros, "Bidirectional Retrieval Made Simple", CVPR 2018, sections 2.1-2.2, 3.2 and
table 1.

Architecture (v1, figure 1):

* first inception module: three maxout convolutions over the one-hot characters, filter lengths
  7, 5 and 3, 32 filters each, concatenated into 96 "word-embedding-like" channels;
* second inception module: four independent streams of ``256 * p`` filters per layer, each ending in
  a global max pooling over time, concatenated into ``l = 4 * 256 * p`` (1024 for p = 1):

  1. three convolutions, filter lengths 7, 5, 3 ("trigram-like" relations among a few words);
  2. one convolution of length 3 (fine-grained, "bigram-like");
  3. an average pooling of length 5 and stride 2 that halves time (figure 2), then two convolutions
     of lengths 7 and 5 (mid-term dependencies; figure 3 names 5 as the length of the streams'
     second layers);
  4. one convolution of length 2 (fine-grained, "unigram-like": one or two word-like positions).

  The paper names the layers of stream 1 and the pooling of stream 3 only; the lengths of streams
  2-4 are the reading that best fits table 1 (parameters and FLOPs, see below).

v2 (section 2.2) replaces the convolutions of the second module by depthwise separable ones
(a depthwise convolution of the same length, then a 1x1 pointwise convolution), both with maxout
activations (the paper reports that maxout "lead to far better performance" than the usual linear
separable layers).
Each stream's first layer, which reads the 96 first-module channels, stays a full maxout
convolution; its later ``256p -> 256p`` layers are separable. Making every second-module layer
separable would leave v2 at about 70% of its table-1 counts (the constant 96-channel layers are
what the counts need), so this is the reading kept.

Every convolution is a "same" maxout convolution (two weight tensors and two biases per filter,
``train.models.maxout``), padding is masked, and the stream-3 average pooling keeps the real length
``ceil(t / 2)``.

Parameter counts (table 1: v1 1.47M, 2.52M, 3.79M, 5.27M, 6.96M and v2 1.16M, 1.80M, 2.50M,
3.26M, 4.06M for p = 0.5 ... 1.5). Their growth (6.96 / 1.47 = 4.7 for 3x the width) needs a
quadratic part in p (the ``256p -> 256p`` layers) and a large linear one; fitting all ten numbers
says the counts are the text encoder **plus** ``W_t`` (``d x l`` with d = 1024, l = 1024p), without
the image projection (VGG-19's ``W_i`` alone has 4.2M), with maxout doubling every convolution and
the depthwise ones of v2. With the 72-symbol alphabet of OECC this reading gives 1.49M, 2.52M,
3.76M, 5.21M, 6.88M (v1) and 1.16M, 1.79M, 2.46M, 3.18M, 3.95M (v2), within 3% of every entry;
the FLOPs column is matched within 1% by one common scale (stream 3 at half length). The alphabet
size changes the counts by ``960`` per symbol only. ``ChainVSE.num_parameters()`` is the text
encoder alone; ``VisualSemanticEmbedding.parameter_report()`` gives the table's sum as
``text_encoder + text_projection``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from train.models.maxout import CharMaxoutConv, MaxoutConv1d, length_mask, max_over_time
from train.models.registry import TextEncoder, register_text_encoder

#: first inception module: (filter length, filters) of the maxout convolutions on the characters
FIRST_MODULE: tuple[tuple[int, int], ...] = ((7, 32), (5, 32), (3, 32))
#: filters of every second-module layer at p = 1
BASE_FILTERS = 256
#: second inception module: (average pooling first?, filter lengths of the stream's convolutions)
STREAMS: tuple[tuple[bool, tuple[int, ...]], ...] = (
    (False, (7, 5, 3)),  # stream 1: trigram-like relations among a few words
    (False, (3,)),       # stream 2: fine-grained, bigram-like
    (True, (7, 5)),      # stream 3: average pooling (5, stride 2) halves time, then mid-term convolutions
    (False, (2,)),       # stream 4: fine-grained, unigram-like
)
#: average pooling of stream 3 (figure 2: filter size 5, stride 2)
POOL_SIZE, POOL_STRIDE = 5, 2


class SeparableMaxoutConv1d(nn.Module):
    """Depthwise separable maxout convolution: ``x (B, C_in, T), mask -> (B, C_out, T)``.

    A depthwise maxout convolution (one filter pair per input channel, length ``l``) followed by a
    pointwise (length 1) maxout convolution that mixes the channels.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.depthwise = MaxoutConv1d(in_channels, in_channels, kernel_size, groups=in_channels)
        self.pointwise = MaxoutConv1d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Depthwise then pointwise, padding masked after each."""
        return self.pointwise(self.depthwise(x, mask), mask)


class Stream(nn.Module):
    """One stream of the second inception module: ``(B, C_in, T), lengths (B,) -> (B, filters)``."""

    def __init__(self, in_channels: int, filters: int, kernels: tuple[int, ...], pool: bool,
                 separable: bool) -> None:
        super().__init__()
        self.pool = pool
        layers = []
        for i, k in enumerate(kernels):
            # v2: the first layer of a stream stays a full convolution (see the module docstring)
            if separable and i > 0:
                layers.append(SeparableMaxoutConv1d(in_channels, filters, k))
            else:
                layers.append(MaxoutConv1d(in_channels, filters, k))
            in_channels = filters
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Optional halving average pooling, the convolutions, then max pooling over time."""
        if self.pool:
            # x is zero beyond each length, so a window's average does not depend on the batch padding;
            # positions whose window centre lies beyond the length are padding of the pooled sequence
            x = F.avg_pool1d(x, POOL_SIZE, POOL_STRIDE, padding=POOL_SIZE // 2)
            lengths = (lengths + POOL_STRIDE - 1) // POOL_STRIDE
        mask = length_mask(lengths, x.shape[2])
        if self.pool:
            x = x * mask
        for layer in self.layers:
            x = layer(x, mask)
        return max_over_time(x, mask)


class ChainVSE(TextEncoder):
    """CHAIN-VSE text encoder: ``chars (B, T) long, lengths (B,) long -> (B, 4 * 256 * p)``.

    Args:
        alphabet_size: ``eta``, symbols of the one-hot input (train-split alphabet with pad and unk).
        p: width multiplier of the second module (filters per layer ``round(256 * p)``).
        separable: v2 (depthwise separable second module) instead of v1.
    """

    def __init__(self, alphabet_size: int, p: float = 1.0, separable: bool = False) -> None:
        super().__init__()
        if p <= 0:
            raise ValueError(f"width p must be positive, got {p}")
        self.first_module = nn.ModuleList(
            CharMaxoutConv(alphabet_size, filters, k) for k, filters in FIRST_MODULE)
        channels = sum(filters for _, filters in FIRST_MODULE)
        filters = max(1, round(BASE_FILTERS * p))
        self.streams = nn.ModuleList(
            Stream(channels, filters, kernels, pool, separable) for pool, kernels in STREAMS)
        self.output_dim = filters * len(STREAMS)

    def forward(self, chars: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """First module on the characters, the four streams, concatenated global max pools."""
        lengths = lengths.clamp_min(1)
        mask = length_mask(lengths, chars.shape[1])
        x = torch.cat([conv(chars, mask) for conv in self.first_module], dim=1)  # (B, 96, T)
        return torch.cat([stream(x, lengths) for stream in self.streams], dim=1)


@register_text_encoder("chain_v1")
def chain_v1(alphabet_size: int, p: float = 1.0) -> ChainVSE:
    """CHAIN-VSE-v1: maxout inception modules of width ``p``."""
    return ChainVSE(alphabet_size, p, separable=False)


@register_text_encoder("chain_v2")
def chain_v2(alphabet_size: int, p: float = 1.0) -> ChainVSE:
    """CHAIN-VSE-v2: second module of depthwise separable maxout convolutions, width ``p``."""
    return ChainVSE(alphabet_size, p, separable=True)
