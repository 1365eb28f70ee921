"""OECC: convolutions-through-time (CTT) text encoders, architectures A-D.

Wehrmann, Mattjie and Barros, "Order embeddings and character-level convolutions for multimodal
alignment", Pattern Recognition Letters 2018, section 2 and table 1.

A caption is a one-hot sequence ``T in {0,1}^(n x a)`` over the alphabet; a stack of "same"
maxout convolutions (Eq. 4) keeps the length ``t`` and a max-pooling over time gives a 512-d vector.
The VSE model's ``W_t`` (d x 512) projects it into the joint space.

| arch | MaxConv layers (filters x length)   | #params with a = 72 |
| ---- | ----------------------------------- | ------------------- |
| A    | 512x7                               | 517,120             |
| B    | 256x7, 512x5                        | 1,570,304           |
| C    | 128x7, 256x5, 512x3                 | 1,244,928           |
| D    | 512x7, 512x5, 512x3                 | 4,713,472           |

Counts are those of the rows of table 1 (text encoder only, no ``W_t``). The table prints 2.10M as
B's total, which disagrees with its own rows (258,560 + 1,311,744 = 1,570,304); the rows are taken
as the truth. OECC uses an alphabet of 72 symbols; here ``a`` is the size of the train-split
alphabet written by ``prep`` (including ``<pad>`` and ``<unk>``).
"""

from __future__ import annotations

import torch
from torch import nn

from train.models.maxout import CharMaxoutConv, MaxoutConv1d, length_mask, max_over_time
from train.models.registry import TextEncoder, register_text_encoder

#: table 1: (filters, filter length) of each MaxConv layer
ARCHITECTURES: dict[str, tuple[tuple[int, int], ...]] = {
    "A": ((512, 7),),
    "B": ((256, 7), (512, 5)),
    "C": ((128, 7), (256, 5), (512, 3)),
    "D": ((512, 7), (512, 5), (512, 3)),
}


class ConvolutionsThroughTime(TextEncoder):
    """CTT encoder: ``chars (B, T) long, lengths (B,) long -> (B, filters of the last layer)``.

    Args:
        alphabet_size: ``a``, symbols of the one-hot input.
        layers: ``(filters, filter length)`` of each maxout convolution, first applied to the characters.
    """

    def __init__(self, alphabet_size: int, layers: tuple[tuple[int, int], ...]) -> None:
        super().__init__()
        (filters, length), *rest = layers
        self.char_conv = CharMaxoutConv(alphabet_size, filters, length)
        convs = []
        for next_filters, next_length in rest:
            convs.append(MaxoutConv1d(filters, next_filters, next_length))
            filters = next_filters
        self.convs = nn.ModuleList(convs)
        self.output_dim = filters

    def forward(self, chars: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Maxout convolutions through time, then max pooling over the real positions."""
        # an empty caption keeps one (padding) position so that the max pooling has something to pool
        mask = length_mask(lengths.clamp_min(1), chars.shape[1])
        x = self.char_conv(chars, mask)
        for conv in self.convs:
            x = conv(x, mask)
        return max_over_time(x, mask)


def _ctt(arch: str, alphabet_size: int) -> ConvolutionsThroughTime:
    return ConvolutionsThroughTime(alphabet_size, ARCHITECTURES[arch])


@register_text_encoder("oecc_a")
def oecc_a(alphabet_size: int) -> ConvolutionsThroughTime:
    """OECC architecture A: one maxout convolution, 512 filters of length 7."""
    return _ctt("A", alphabet_size)


@register_text_encoder("oecc_b")
def oecc_b(alphabet_size: int) -> ConvolutionsThroughTime:
    """OECC architecture B: maxout convolutions 256x7, 512x5."""
    return _ctt("B", alphabet_size)


@register_text_encoder("oecc_c")
def oecc_c(alphabet_size: int) -> ConvolutionsThroughTime:
    """OECC architecture C: maxout convolutions 128x7, 256x5, 512x3."""
    return _ctt("C", alphabet_size)


@register_text_encoder("oecc_d")
def oecc_d(alphabet_size: int) -> ConvolutionsThroughTime:
    """OECC architecture D: maxout convolutions 512x7, 512x5, 512x3."""
    return _ctt("D", alphabet_size)
