"""Maxout convolutions over padded character sequences (OECC Eq. 4), shared by CHAIN-VSE and OECC.

A maxout convolution convolves its input with two weight tensors ``W_1`` and ``W_2`` (each with its
own bias) and keeps the element-wise maximum:

    F_m = max{ psi(W_1, x), psi(W_2, x) }

It is computed as one convolution with twice the output channels (the first half is ``W_1``, the
second ``W_2``) followed by a max over the two halves; the parameter count is exactly that of the
two convolutions, e.g. OECC table 1, architecture A: ``72 * 7 * 512 * 2 + 512 * 2 = 517,120``.

Padding is masked explicitly so that an encoder's output does not depend on how long the batch
was padded: every convolution sees zeros at and beyond a sequence's length (as if the sequence were
alone and "same"-padded with zeros), padded positions are zeroed again after every layer, and they
can never win the global max pooling over time. Convolutions are "same" convolutions (OECC 2.1:
"to keep t unchanged ... we perform padded convolutions"); an even filter length puts the extra
position on the right.

Layout: features are (B, C, T) (channels first, as ``torch.nn.functional.conv1d``); masks are
(B, 1, T) floats with 1 on real characters and 0 on padding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def length_mask(lengths: torch.Tensor, steps: int) -> torch.Tensor:
    """Mask of real positions: ``lengths (B,) -> (B, 1, steps)`` float, 1 where ``t < length``."""
    positions = torch.arange(steps, device=lengths.device)
    return (positions.unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1).float()


def same_padding(kernel_size: int) -> tuple[int, int]:
    """(left, right) zero padding that keeps the length of a stride-1 convolution."""
    return (kernel_size - 1) // 2, kernel_size // 2


def max_over_time(features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Global max pooling over the real positions: ``(B, C, T), (B, 1, T) -> (B, C)``.

    Padded positions are replaced by the most negative finite value of the dtype (not ``-inf``, so a
    row without any real position gives a finite, if meaningless, result instead of NaN gradients).
    """
    fill = torch.finfo(features.dtype).min
    return features.masked_fill(mask == 0, fill).amax(dim=2)


class _PairMax(torch.autograd.Function):
    """Element-wise max of the two channel halves, with a backward that only stores a bool mask.

    ``torch.maximum`` / ``amax`` backwards materialise several float temporaries; on a CPU this
    custom backward makes the maxout nearly twice as fast.
    """

    @staticmethod
    def forward(ctx, pre: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        first, second = pre.chunk(2, dim=1)
        take_first = first >= second
        ctx.save_for_backward(take_first)
        return torch.where(take_first, first, second)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (take_first,) = ctx.saved_tensors
        zero = grad.new_zeros(())
        return torch.cat([torch.where(take_first, grad, zero), torch.where(take_first, zero, grad)], dim=1)


def maxout(pre: torch.Tensor, pieces: int = 2) -> torch.Tensor:
    """Max over ``pieces`` equal channel groups: ``(B, pieces * C, T) -> (B, C, T)``."""
    if pieces == 1:
        return pre
    if pieces == 2:
        return _PairMax.apply(pre)
    b, c, t = pre.shape
    return pre.view(b, pieces, c // pieces, t).amax(dim=1)


class MaxoutConv1d(nn.Module):
    """Masked "same" maxout convolution: ``x (B, C_in, T), mask (B, 1, T) -> (B, C_out, T)``.

    Args:
        in_channels: input channels ``C_in``.
        out_channels: output feature maps ``C_out`` (after the max).
        kernel_size: filter length ``l``.
        pieces: weight tensors per feature map (2 in the papers; 1 gives a plain linear convolution).
        groups: ``in_channels`` makes it a depthwise convolution (CHAIN-VSE v2).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, pieces: int = 2,
                 groups: int = 1) -> None:
        super().__init__()
        self.pieces = pieces
        left, right = same_padding(kernel_size)
        # odd lengths pad symmetrically inside the convolution, even ones need an explicit pad
        self.explicit_padding = (left, right) if left != right else None
        self.conv = nn.Conv1d(in_channels, out_channels * pieces, kernel_size, groups=groups,
                              padding=0 if self.explicit_padding else left)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Convolve, take the maxout, and zero the padded positions.

        ``x`` must already be zero at padded positions (every layer here leaves its output so).
        """
        if self.explicit_padding is not None:
            x = F.pad(x, self.explicit_padding)
        out = maxout(self.conv(x), self.pieces)
        return out * mask.to(out.dtype)  # keeps a bf16/fp16 autocast output in its dtype


class CharMaxoutConv(nn.Module):
    """Maxout convolution over one-hot characters, as an embedding lookup.

    Equivalent to ``MaxoutConv1d(alphabet_size, out_channels, kernel_size)`` applied to the one-hot
    encoding of ``chars`` (same weights ``alphabet_size x filter_length x 2 * out_channels`` plus
    biases, same parameter count), but a convolution over a one-hot input is a sum of ``l`` looked-up
    weight rows, which is an order of magnitude cheaper than a dense convolution over ``a`` channels.
    Padding (index 0 at or beyond a sequence's length) contributes a zero vector, like an all-zero
    one-hot column.

    Args:
        alphabet_size: ``a``, the number of symbols including ``<pad>`` and ``<unk>``.
        out_channels: feature maps after the max.
        kernel_size: filter length ``l``.
        pieces: weight tensors per feature map (2 = maxout).
    """

    def __init__(self, alphabet_size: int, out_channels: int, kernel_size: int, pieces: int = 2) -> None:
        super().__init__()
        self.alphabet_size = alphabet_size
        self.kernel_size = kernel_size
        self.pieces = pieces
        self.out_channels = out_channels
        width = out_channels * pieces
        # weight[symbol, p, :] is the conv weight W[:, symbol, p] of the equivalent Conv1d
        self.weight = nn.Parameter(torch.empty(alphabet_size, kernel_size, width))
        self.bias = nn.Parameter(torch.empty(width))
        # the same initialisation as nn.Conv1d over alphabet_size input channels
        bound = 1.0 / math.sqrt(alphabet_size * kernel_size)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, chars: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``chars (B, T) long, mask (B, 1, T) -> (B, out_channels, T)``."""
        b, t = chars.shape
        a, k = self.alphabet_size, self.kernel_size
        # an extra all-zero symbol a stands for padding: the all-zero one-hot column
        table = torch.cat([self.weight, self.weight.new_zeros(1, k, self.weight.shape[2])])
        table = table.transpose(0, 1).reshape(k * (a + 1), -1)  # row p * (a + 1) + symbol
        symbols = chars.masked_fill(mask[:, 0] == 0, a)
        left, right = same_padding(k)
        symbols = F.pad(symbols, (left, right), value=a)
        # output t sums, over filter positions p, the row of the symbol at input t + p - left
        windows = symbols.unfold(1, k, 1) + torch.arange(k, device=chars.device) * (a + 1)  # (B, T, k)
        out = F.embedding_bag(windows.reshape(b * t, k), table, mode="sum") + self.bias
        out = out.view(b, t, -1).transpose(1, 2)  # (B, width, T)
        return maxout(out.contiguous(), self.pieces) * mask
