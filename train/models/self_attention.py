"""SEAM: self-attentive text encoders over word embeddings, variants E, C and G.

Wehrmann, Lopes, More and Barros, "Fast Self-Attentive Multimodal Retrieval", WACV 2018, section 2;
released code github.com/jwehrmann/seam-retrieval (``text_encoders.py``, ``model.py``).

A caption is a matrix ``H (n x z)`` of features per word. The self-attention module (Lin et al.
2017) computes ``V = tanh(H W1)`` (``W1: z x 300``), the annotation matrix ``A = softmax(V W2)``
(``W2: 300 x h``, the softmax over the words, one distribution per hop) and ``M = H^T A``
(``z x h``), flattened. Neither ``W1`` nor ``W2`` has a bias.

- **SEAM-E**: attention over the 300-d word embeddings; output ``300 h``.
- **SEAM-C**: convolutions of width 2 and 3 (100 filters each, zero-padded to keep the length) over
  the embeddings, one attention module on each convolution and one on the embeddings, concatenated;
  output ``(100 + 100 + 300) h = 500 h``.
- **SEAM-G**: a GRU (512 units in the paper's tables 3 and 4) over the embeddings, attention with
  ``h = 30``; output ``512 h``.

The projection into the joint space is **not** part of these encoders: it is the joint model's
``W_t`` (``d x output_dim``, ``d = 1024``) **with a bias** (``ModelSpec(text_projection=True,
text_projection_bias=True)``). The paper's table 2 counts it as text side: with a vocabulary of
11,360 words the counts are reproduced exactly by ``embedding + encoder + W_t + bias`` (see
:func:`seam_text_parameters`):

| model        | table 2 (#params) | = embedding + attention / convs + (output_dim + 1) x 1024 |
| ------------ | ----------------- | --------------------------------------------------------- |
| SEAM-E h=10  | 6,574,024         | 3,408,000 + 93,000 + 3,073,024                            |
| SEAM-E h=30  | 12,724,024        | 3,408,000 + 99,000 + 9,217,024                            |
| SEAM-C h=5   | 6,273,724         | 3,408,000 + 304,700 + 2,561,024                           |
| SEAM-C h=20  | 13,967,224        | 3,408,000 + 318,200 + 10,241,024                          |

Readings where the paper is silent:

- **convolutions** (released code): ReLU after each convolution; convolutions have biases (the
  counts need them); width 2 is padded with one zero word on the left (position ``t`` sees words
  ``t-1, t``), width 3 with one on each side. The released code adds a batch normalisation after
  the ReLU; it is left out because table 2's counts exclude it (its 400 parameters would break
  them) and because batch statistics would make a caption's embedding depend on the other
  captions and on the padding of the batch.
- **padding**: the ``<pad>`` word has a zero, untrained embedding and every word at or after a
  caption's length is zeroed, so the convolutions see the same zero padding whatever the batch's
  longest caption; padded positions get ``-inf`` before the softmax (exactly zero attention). An
  empty caption (length 0) keeps its first position, a zero vector. For SEAM-G the GRU runs over
  packed sequences.
- **flattening**: ``M`` is flattened hop-major (``M^T`` row by row, the released code's
  ``bmm(A, H).view(B, -1)``); any fixed order is equivalent up to a permutation of ``W_t``'s input.
- **initialisation** (released code's ``global_initializer``): Xavier-uniform weights for ``W1``,
  ``W2`` and the convolutions (PyTorch's default biases), word embeddings uniform in [-0.1, 0.1],
  PyTorch's default GRU initialisation.
- **penalty**: ``P = ||A A^T - I||_F^2`` per caption with ``A`` as ``(h, n)`` (``h x h`` Gram matrix
  of the hops; the paper's Eq. 3 writes ``A A^T`` for ``A (n x h)``, which is meant as the hops'
  Gram matrix as in Lin et al.), summed over the batch like the contrastive loss and multiplied by
  ``lambda``: ``self.penalty = lambda * sum_b P_b``. SEAM-C has three annotation matrices: their
  penalties are **summed**, so each module is pushed exactly as a single module would be by the
  same ``lambda``. The released code averages the unsquared Frobenius norm over the batch instead
  (its SEAM-C keeps the attention output, not ``A``, for it), and as published never adds it to the
  loss (only for encoder names starting with ``attentive``, none of its choices, and ``forward_loss``
  returns the loss without it); we follow the paper's equation.
  With ``lambda = 0`` nothing is computed and ``self.penalty`` is ``None``.
- **defaults**: ``hops`` 30 for E and 5 for C (each variant's best image-to-text R@1 in table 2),
  30 for G (fixed in section 3.2); ``penalty`` 0 (the released code's default ``att_coef``; tables 3
  and 4 show each variant without and with ``lambda = 0.5``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from train.models.maxout import length_mask
from train.models.registry import TextEncoder, register_text_encoder
from train.models.uvs import run_gru, word_embedding

#: size of the word embeddings (the paper's ``d``) and of the attention's hidden layer ``p``
WORD_DIM = 300
ATTENTION_UNITS = 300
#: SEAM-C: filters of each convolution and their widths
CONV_FILTERS = 100
CONV_WIDTHS = (2, 3)
#: SEAM-G: GRU units of the tables 3 and 4 model, and its fixed number of hops
GRU_UNITS = 512
#: size of the joint space, the rows of the text projection ``W_t`` (with bias) counted in table 2
JOINT_DIM = 1024


class SelfAttention(nn.Module):
    """Structured self-attention (SEAM Eq. 1-2): ``H (B, n, z) -> M (B, h z), A (B, h, n)``.

    Args:
        features: ``z``, width of ``H``.
        hops: ``h``, number of attention distributions over the words.
        units: ``p``, width of the hidden layer ``V = tanh(H W1)``.
    """

    def __init__(self, features: int, hops: int, units: int = ATTENTION_UNITS) -> None:
        super().__init__()
        self.w1 = nn.Linear(features, units, bias=False)
        self.w2 = nn.Linear(units, hops, bias=False)
        self.hops = hops
        for linear in (self.w1, self.w2):
            nn.init.xavier_uniform_(linear.weight)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend over the real words.

        Args:
            h: ``(B, n, z)`` float, features per word.
            mask: ``(B, n)`` bool, True at real words (at least one per row).

        Returns:
            ``M`` flattened hop-major ``(B, h * z)`` and the annotation matrix ``A (B, h, n)`` whose
            rows sum to 1 over the real words and are 0 at padding.
        """
        scores = self.w2(torch.tanh(self.w1(h)))  # (B, n, h)
        scores = scores.masked_fill(~mask.unsqueeze(2), float("-inf"))
        a = torch.softmax(scores, dim=1).transpose(1, 2)  # (B, h, n)
        return torch.bmm(a, h).flatten(1), a


def attention_penalty(a: torch.Tensor) -> torch.Tensor:
    """``||A A^T - I||_F^2`` per caption: ``a (B, h, n) -> (B,)``; 0 iff the hops are orthonormal."""
    gram = torch.bmm(a, a.transpose(1, 2))
    eye = torch.eye(a.shape[1], dtype=a.dtype, device=a.device)
    return (gram - eye).pow(2).sum(dim=(1, 2))


class SEAMEncoder(TextEncoder):
    """Shared part of the SEAM variants: the word embedding, the padding mask and the penalty.

    Subclasses set ``output_dim`` and implement ``forward(tokens (B, T) long, lengths (B,) long) ->
    (B, output_dim)``, calling :meth:`embed` first and :meth:`set_penalty` with their annotation
    matrices.

    Args:
        vocab_size: words of the train-split vocabulary (index 0 ``<pad>``, 1 ``<unk>``).
        penalty: ``lambda``, coefficient of the attention penalty (0 disables it).
        word_dim: size of the word embeddings.
    """

    text_input: ClassVar[str] = "words"

    def __init__(self, vocab_size: int, penalty: float, word_dim: int) -> None:
        super().__init__()
        if penalty < 0:
            raise ValueError(f"the attention penalty lambda must be >= 0, got {penalty}")
        self.embedding = word_embedding(vocab_size, word_dim)
        self.penalty_coefficient = float(penalty)
        #: ``lambda * sum over the batch of ||A A^T - I||_F^2`` of the last forward (None if lambda = 0)
        self.penalty: torch.Tensor | None = None

    def embed(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens (B, T), lengths (B,) -> H (B, T, word_dim)`` zero after each length, ``mask (B, T)``
        bool (an empty caption keeps its first position)."""
        mask = length_mask(lengths.clamp_min(1), tokens.shape[1])[:, 0].bool()
        return self.embedding(tokens) * mask.unsqueeze(2), mask

    def set_penalty(self, annotations: list[torch.Tensor]) -> None:
        """``self.penalty = lambda * sum`` over the batch and the modules of ``||A A^T - I||_F^2``."""
        if self.penalty_coefficient == 0:
            self.penalty = None
            return
        total = sum(attention_penalty(a).sum() for a in annotations)
        self.penalty = self.penalty_coefficient * total


def _check_hops(hops: int) -> None:
    if hops < 1:
        raise ValueError(f"the number of attention hops must be >= 1, got {hops}")


class SEAME(SEAMEncoder):
    """SEAM-E: self-attention over the word embeddings, ``-> (B, word_dim * hops)``."""

    def __init__(self, vocab_size: int, hops: int = 30, penalty: float = 0.0, word_dim: int = WORD_DIM,
                 attention_units: int = ATTENTION_UNITS) -> None:
        super().__init__(vocab_size, penalty, word_dim)
        _check_hops(hops)
        self.attention = SelfAttention(word_dim, hops, attention_units)
        self.output_dim = word_dim * hops

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``tokens (B, T) long, lengths (B,) long -> (B, word_dim * hops)``."""
        h, mask = self.embed(tokens, lengths)
        m, a = self.attention(h, mask)
        self.set_penalty([a])
        return m


class SEAMC(SEAMEncoder):
    """SEAM-C: attention over same-length convolutions (widths 2 and 3) and over the embeddings,
    concatenated ``[conv2, conv3, embeddings]`` (the released code's order), ``-> (B, 500 * hops)``."""

    def __init__(self, vocab_size: int, hops: int = 5, penalty: float = 0.0, word_dim: int = WORD_DIM,
                 attention_units: int = ATTENTION_UNITS, filters: int = CONV_FILTERS,
                 widths: tuple[int, ...] = CONV_WIDTHS) -> None:
        super().__init__(vocab_size, penalty, word_dim)
        _check_hops(hops)
        self.widths = tuple(widths)
        self.convs = nn.ModuleList(nn.Conv1d(word_dim, filters, width) for width in self.widths)
        for conv in self.convs:
            nn.init.xavier_uniform_(conv.weight)
        self.conv_attention = nn.ModuleList(
            SelfAttention(filters, hops, attention_units) for _ in self.widths)
        self.word_attention = SelfAttention(word_dim, hops, attention_units)
        self.output_dim = (filters * len(self.widths) + word_dim) * hops

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``tokens (B, T) long, lengths (B,) long -> (B, (2 * filters + word_dim) * hops)``."""
        h, mask = self.embed(tokens, lengths)
        x = h.transpose(1, 2)  # (B, word_dim, T), zero after each caption's length
        parts, annotations = [], []
        for width, conv, attention in zip(self.widths, self.convs, self.conv_attention, strict=True):
            # zero words around the caption keep the length: width 2 looks back one word, width 3 both ways
            c = F.relu(conv(F.pad(x, (width // 2, (width - 1) // 2))))  # (B, filters, T)
            m, a = attention(c.transpose(1, 2), mask)
            parts.append(m)
            annotations.append(a)
        m, a = self.word_attention(h, mask)
        parts.append(m)
        annotations.append(a)
        self.set_penalty(annotations)
        return torch.cat(parts, dim=1)


class SEAMG(SEAMEncoder):
    """SEAM-G: a GRU over the word embeddings, attention over its states, ``-> (B, gru_units * hops)``."""

    def __init__(self, vocab_size: int, hops: int = 30, penalty: float = 0.0, word_dim: int = WORD_DIM,
                 attention_units: int = ATTENTION_UNITS, gru_units: int = GRU_UNITS) -> None:
        super().__init__(vocab_size, penalty, word_dim)
        _check_hops(hops)
        self.gru = nn.GRU(word_dim, gru_units, batch_first=True)
        self.attention = SelfAttention(gru_units, hops, attention_units)
        self.output_dim = gru_units * hops

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``tokens (B, T) long, lengths (B,) long -> (B, gru_units * hops)``."""
        h, mask = self.embed(tokens, lengths)
        states, _ = run_gru(self.gru, h, lengths)
        m, a = self.attention(states, mask)
        self.set_penalty([a])
        return m


#: variant letter -> encoder class
VARIANTS: dict[str, type[SEAMEncoder]] = {"E": SEAME, "C": SEAMC, "G": SEAMG}


def seam_text_parameters(variant: str, hops: int, vocab_size: int, d: int = JOINT_DIM, **kwargs: Any) -> int:
    """Text-side trainable parameters as counted by the paper's table 2: the encoder (word embedding
    included) plus the joint model's text projection ``W_t (d x output_dim)`` with its bias.

    Equal to ``parameter_report()["text_encoder"] + ["text_projection"]`` of a joint model built with
    ``text_projection_bias=True``. ``seam_text_parameters("E", 10, 11360) == 6_574_024``.

    Args:
        variant: ``"E"``, ``"C"`` or ``"G"``.
        hops: ``h`` of each attention module.
        vocab_size: words of the vocabulary (11,360 in table 2).
        d: size of the joint space (rows of ``W_t``).
        **kwargs: other constructor keywords of the variant (``word_dim``, ``gru_units``, ...).
    """
    encoder = VARIANTS[variant.upper()](vocab_size, hops=hops, **kwargs)
    return encoder.num_parameters() + (encoder.output_dim + 1) * d


@register_text_encoder("seam_e")
def seam_e(vocab_size: int, hops: int = 30, penalty: float = 0.0, word_dim: int = WORD_DIM,
           attention_units: int = ATTENTION_UNITS) -> SEAME:
    """SEAM-E: self-attention with ``hops`` over the word embeddings; penalty coefficient ``penalty``."""
    return SEAME(vocab_size, hops, penalty, word_dim, attention_units)


@register_text_encoder("seam_c")
def seam_c(vocab_size: int, hops: int = 5, penalty: float = 0.0, word_dim: int = WORD_DIM,
           attention_units: int = ATTENTION_UNITS) -> SEAMC:
    """SEAM-C: convolutions of width 2 and 3 (100 filters) + the embeddings, three attention modules."""
    return SEAMC(vocab_size, hops, penalty, word_dim, attention_units)


@register_text_encoder("seam_g")
def seam_g(vocab_size: int, hops: int = 30, penalty: float = 0.0, word_dim: int = WORD_DIM,
           attention_units: int = ATTENTION_UNITS, gru_units: int = GRU_UNITS) -> SEAMG:
    """SEAM-G: a GRU of ``gru_units`` over the embeddings, self-attention with ``hops`` (30 in the paper)."""
    return SEAMG(vocab_size, hops, penalty, word_dim, attention_units, gru_units)
