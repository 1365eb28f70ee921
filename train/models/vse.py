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

Settings of the FNE paper's table 1 (``Embed. dim.`` is ``d``, the GRU size; ``Word embed. dim.``
is ``word_dim``), for the phase-B presets:

| pipeline | loss    | sim.   | d f8k / f30k / coco | word_dim        | lr               | margin | abs |
| -------- | ------- | ------ | ------------------- | --------------- | ---------------- | ------ | --- |
| SH       | sum     | cos    | 1536 / 1536 / 1536  | 1024            | 2e-4             | 0.2    | no  |
| SH-bl    | sum     | cos    | 2048 / 2048 / 2048  | 1000 (coco 2000)| 2e-4 (coco 2.5e-4)| 0.2   | no  |
| MH       | max     | cos    | 1024 / 1536 / 2048  | 1024            | 2e-4             | 0.2    | no  |
| MH-bl    | max     | cos    | 1024 / 1024 / 1024  | 300             | 2e-4             | 0.2    | no  |
| SOE      | sum     | order  | 1024 / 1024 / 1536  | 1024            | 1e-3             | 0.05   | yes |
| SOE-bl   | sum     | order  | 1024 / 1024 / 1024  | 300             | 1e-3             | 0.05   | yes |
| MOE      | max     | order  | 1536 / 1536 / 2048  | 1536            | 1e-3             | 0.05   | yes |
| MOE-bl   | max     | order  | 1024 / 1024 / 1024  | 300             | 2e-4             | 0.2    | no  |
| PH       | sum-max | cos    | 1536 / 1536 / 1536  | 1024            | 2e-4             | 0.2    | no  |
| POE      | sum-max | order  | 1024 / 1024 / 2048  | 1024            | 1e-3 then 1e-4   | 0.05   | yes |

Batch 128, Adam, gradient clipping at norm 2, one random caption of the five per image per epoch.

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

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from train.engine.objectives import ContrastiveObjective, CurriculumObjective, Objective
from train.engine.settings import FamilyConfig
from train.models.family import ClassifierEncoder, Family
from train.models.registry import ModelSpec, TextEncoder, register_text_encoder

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


#: the FNE paper's table 1: loss, similarity, ``d`` per dataset (f8k, f30k, coco), word embedding size,
#: learning rate (per dataset where it differs), margin, ``|.|``; PH and POE start with the sum loss
VSE_PRESETS: dict[str, dict[str, Any]] = {
    "SH": {"loss": "sum", "measure": "cosine", "d": (1536, 1536, 1536), "word_dim": 1024,
           "lr": 2e-4, "margin": 0.2, "absolute": False},
    "SH-bl": {"loss": "sum", "measure": "cosine", "d": (2048, 2048, 2048), "word_dim": (1000, 1000, 2000),
              "lr": (2e-4, 2e-4, 2.5e-4), "margin": 0.2, "absolute": False},
    "MH": {"loss": "max", "measure": "cosine", "d": (1024, 1536, 2048), "word_dim": 1024,
           "lr": 2e-4, "margin": 0.2, "absolute": False},
    "MH-bl": {"loss": "max", "measure": "cosine", "d": (1024, 1024, 1024), "word_dim": 300,
              "lr": 2e-4, "margin": 0.2, "absolute": False},
    "SOE": {"loss": "sum", "measure": "order", "d": (1024, 1024, 1536), "word_dim": 1024,
            "lr": 1e-3, "margin": 0.05, "absolute": True},
    "SOE-bl": {"loss": "sum", "measure": "order", "d": (1024, 1024, 1024), "word_dim": 300,
               "lr": 1e-3, "margin": 0.05, "absolute": True},
    "MOE": {"loss": "max", "measure": "order", "d": (1536, 1536, 2048), "word_dim": 1536,
            "lr": 1e-3, "margin": 0.05, "absolute": True},
    "MOE-bl": {"loss": "max", "measure": "order", "d": (1024, 1024, 1024), "word_dim": 300,
               "lr": 2e-4, "margin": 0.2, "absolute": False},
    "PH": {"loss": "sum", "measure": "cosine", "d": (1536, 1536, 1536), "word_dim": 1024,
           "lr": 2e-4, "margin": 0.2, "absolute": False},
    "POE": {"loss": "sum", "measure": "order", "d": (1024, 1024, 2048), "word_dim": 1024,
            "lr": 1e-3, "finetune_lr": 1e-4, "margin": 0.05, "absolute": True},
}
#: the curricula: the sum of hinges, then (from the best checkpoint) the max of hinges
CURRICULA = ("PH", "POE")
#: which column of table 1 a prepared dataset uses (by its ``dataset`` name); others use COCO's
PRESET_COLUMN = {"f8k": 0, "flickr8k": 0, "f30k": 1, "flickr30k": 1, "multi30k": 1, "coco": 2}


def vse_preset(kind: str, dataset_name: str | None) -> dict[str, Any]:
    """The table 1 settings of pipeline ``kind`` for a dataset: ``{loss, measure, d, word_dim, lr,
    margin, absolute[, finetune_lr]}``. Flickr8k and Flickr30k (and Multi30k, Flickr30k's images)
    have their columns; every other dataset takes COCO's."""
    column = PRESET_COLUMN.get(dataset_name or "coco", 2)
    return {k: (v[column] if isinstance(v, tuple) else v) for k, v in VSE_PRESETS[kind].items()}


# --- the family: ``train vse`` ------------------------------------------------------------------------

#: help notes of the settings the ``--kind`` preset gives
_PRESET_NOTE = "; the --kind preset of the prepared dataset's column, COCO's without one"


class VseConfig(FamilyConfig):
    """The VSE pipelines' own settings: the FNE paper's pipeline (table 1 preset), word embedding size,
    ``|.|`` on both sides, learning rate of a curriculum's second (max-of-hinges) phase (None: ``lr``)."""

    kind: Literal["SH", "SH-bl", "MH", "MH-bl", "SOE", "SOE-bl", "MOE", "MOE-bl", "PH", "POE"] = Field(
        "SH", description="the FNE paper's pipeline, with its table 1 settings as defaults: sum (S) or max "
        "(M) of hinges, cosine (H) or order (OE); PH/POE train with the sum until validation stops "
        "improving, then go on from the best checkpoint with the max; -bl: the baselines' settings "
        "(default SH)")
    word_dim: int = Field(1024, ge=1, description="size of the word embedding (default: the --kind preset)")
    absolute: bool = Field(False, description="|.| on both sides before the L2 normalisation (default: the "
                           "--kind preset)")
    finetune_lr: float | None = Field(None, gt=0, description="learning rate of the second (max of hinges) "
                                      "phase of PH/POE (default: the preset; POE 1e-4, PH --lr)")


def vse_defaults(settings: Any, dataset_name: str | None) -> dict[str, Any]:
    """The ``--kind`` preset, plus the FNE paper's training (section 4.3.1): one random caption per
    image per epoch, batch 128, constant Adam learning rate, gradient clipping at 2, up to 200 epochs.
    The paper keeps the best validation model of 200 epochs without early stopping; the curricula need
    "no improvement in the validation set" made concrete: 20 epochs without a better rsum (our choice)."""
    return {**vse_preset(settings.kind, dataset_name), "captions_per_epoch": "one", "lr_schedule": "constant",
            "epochs": 200, "early_stop": 20}


def vse_spec(settings: Any) -> ModelSpec:
    """VSE pipelines: words in, the GRU's last state (``d`` units, no ``W_t``) and ``W_i x`` (no bias),
    ``|.|`` when ``absolute`` (table 1), L2-normalised."""
    return ModelSpec("uvs_gru", {"d": settings.d, "word_dim": settings.word_dim}, text_input="words",
                     text_projection=False, absolute=settings.absolute)


def vse_objective(settings: Any) -> Objective:
    """The FNE paper's pipelines: PH and POE are curricula (sum, then max of hinges); the others the
    plain contrastive loss of their preset."""
    if settings.kind in CURRICULA:
        return CurriculumObjective(settings.measure, settings.margin, settings.loss, settings.order_sqrt,
                                   phases=(settings.loss, "max"), later_lr=settings.finetune_lr)
    return ContrastiveObjective(settings.measure, settings.margin, settings.loss, settings.order_sqrt)


def classifier_gru(settings: Any) -> dict[str, Any]:
    """``train classify --encoder gru``: the UVS GRU alone, of ``gru_units`` units (its ``d``), no ``|.|``."""
    return {"d": settings.gru_units, "absolute": False}


FAMILY = Family(
    "vse", "VSE pipelines of the FNE paper: word embedding + GRU on FNE or one-layer features "
    "(SH, MH, SOE, MOE, PH, POE)", VseConfig, vse_spec, defaults=vse_defaults, objective=vse_objective,
    common_options=("max_words", "min_word_count"),
    help_notes={key: _PRESET_NOTE for key in VSE_PRESETS["SH"]},
    classifier=ClassifierEncoder("gru", ("word_dim", "gru_units"), defaults={"word_dim": 300},
                                 spec_settings=classifier_gru))
