"""UVS: the word-embedding + GRU sentence encoder of the FNE paper's VSE pipelines.

Vilalta et al., "Studying the Impact of the Full-Network Embedding on Multimodal Pipelines",
Semantic Web 2019, section 3.2, following Kiros, Salakhutdinov and Zemel, "Unifying
visual-semantic embeddings with multimodal neural language models" (UVS, 2014). Released code:
github.com/armandvilalta/Full-network-multimodal-embeddings (Theano, a fork of
ryankiros/visual-semantic-embedding and ivendrov/order-embedding).

Each word index goes through a trainable linear word embedding (``word_dim``), the embeddings are
fed to a GRU whose number of units is the size ``d`` of the joint space, and the GRU's hidden
state after the caption's **last real word** is the sentence embedding (the joint model then takes
``|.|`` for order embeddings and L2-normalises). No projection follows: ``output_dim = d`` (its
``ModelSpec`` has ``text_projection=False``).

Readings where the paper is silent (from the released code):

- initialisation as in Kiros' ``param_init_gru``: word embeddings and the GRU's input weights
  uniform in [-0.1, 0.1], recurrent weights orthogonal per gate, biases zero;
- PyTorch's ``nn.GRU`` computes the same cell as the Theano GRU of the released code (the reset gate
  multiplies the recurrent term ``U_x h``), but carries a second bias vector per gate (``b_hh``),
  i.e. ``3 d`` more parameters; starting at zero, ``b_hn`` is the only one that is not redundant;
- the padding word (index 0) has a zero embedding that is never trained (``padding_idx``); the
  last hidden state is read at each caption's own length (packed sequences), so padding never
  changes a caption's embedding.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from train.models.registry import TextEncoder, register_text_encoder

#: Kiros' ``norm_weight``: uniform initialisation in [-0.1, 0.1] of word embeddings and input weights
INIT_SCALE = 0.1


def word_embedding(vocab_size: int, word_dim: int) -> nn.Embedding:
    """Trainable word embedding, uniform in [-0.1, 0.1], with a zero, untrained ``<pad>`` row (index 0).

    Both released codes (UVS/FNE and SEAM) initialise word embeddings uniformly in [-0.1, 0.1].
    """
    embedding = nn.Embedding(vocab_size, word_dim, padding_idx=0)
    with torch.no_grad():
        embedding.weight.uniform_(-INIT_SCALE, INIT_SCALE)
        embedding.weight[0].zero_()
    return embedding


def run_gru(gru: nn.GRU, words: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A one-layer, one-direction, batch-first GRU over the real words of each caption only.

    Args:
        gru: ``nn.GRU(batch_first=True)``.
        words: ``(B, T, word_dim)`` float, the embedded words (padding after each caption's length).
        lengths: ``(B,)`` long, words per caption; 0 is read as 1 (an empty caption keeps one step).

    Returns:
        ``outputs (B, T, k)`` hidden state at every step (zeros after each caption's length) and
        ``last (B, k)`` the hidden state after each caption's last real word.
    """
    lengths = lengths.clamp_min(1).cpu()
    packed = pack_padded_sequence(words, lengths, batch_first=True, enforce_sorted=False)
    outputs, last = gru(packed)
    outputs, _ = pad_packed_sequence(outputs, batch_first=True, total_length=words.shape[1])
    return outputs, last[-1]


def init_gru_like_kiros(gru: nn.GRU) -> None:
    """Kiros' ``param_init_gru``: input weights uniform in [-0.1, 0.1], each gate's recurrent weights
    orthogonal, biases zero."""
    k = gru.hidden_size
    with torch.no_grad():
        for name, weight in gru.named_parameters():
            if name.startswith("weight_ih"):
                weight.uniform_(-INIT_SCALE, INIT_SCALE)
            elif name.startswith("weight_hh"):
                for gate in range(3):  # PyTorch stacks the reset, update and new gates' (k, k) blocks
                    nn.init.orthogonal_(weight[gate * k:(gate + 1) * k])
            else:
                weight.zero_()


class UVSEncoder(TextEncoder):
    """UVS sentence encoder: ``tokens (B, T) long, lengths (B,) long -> (B, d)``.

    Args:
        vocab_size: words of the train-split vocabulary (index 0 ``<pad>``, 1 ``<unk>``).
        d: GRU units, which is the joint embedding size (``output_dim``).
        word_dim: size of the word embedding.
    """

    text_input: ClassVar[str] = "words"
    #: its GRU packs the captions on the host: a training step hands it host lengths, so the ``.cpu()``
    #: before packing copies nothing back from the device (train.engine.step.wants_host_lengths)
    lengths_on_host: ClassVar[bool] = True

    def __init__(self, vocab_size: int, d: int = 1024, word_dim: int = 1024) -> None:
        super().__init__()
        if d < 1 or word_dim < 1:
            raise ValueError(f"d and word_dim must be positive, got d={d}, word_dim={word_dim}")
        self.embedding = word_embedding(vocab_size, word_dim)
        self.gru = nn.GRU(word_dim, d, batch_first=True)
        self.output_dim = d
        self.penalty = None
        init_gru_like_kiros(self.gru)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Embed the words, run the GRU, return its state after each caption's last word."""
        _, last = run_gru(self.gru, self.embedding(tokens), lengths)
        return last


@register_text_encoder("uvs_gru")
def uvs_gru(vocab_size: int, d: int = 1024, word_dim: int = 1024) -> UVSEncoder:
    """UVS / VSE pipelines' encoder: word embedding (``word_dim``) + GRU of ``d`` units, last state."""
    return UVSEncoder(vocab_size, d=d, word_dim=word_dim)
