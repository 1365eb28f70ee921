"""What a family builds (:class:`ModelSpec`) and what a text encoder reads (:data:`TEXT_INPUTS`): declared
without torch, so a family's declaration (its settings, defaults and spec rule) loads without the networks
(``train --help``, ``pipelines.yaml``); :mod:`train.models.registry` builds the encoders it names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: what a text encoder reads: ``chars`` (B, T) character indices; ``words`` (B, T) word indices of
#: the train-split ``words.json``; ``word_chars`` (B, T, C) each word spelled as C character
#: indices (zero-padded). ``lengths`` (B,) counts characters or words. Index 0 is always padding.
TEXT_INPUTS = ("chars", "words", "word_chars")


@dataclass(frozen=True)
class ModelSpec:
    """What a family builds: its encoders, what the text encoder reads, and the joint-space maps.

    Attributes:
        text_encoder, text_kwargs: registered text encoder and its constructor keywords.
        text_input: one of :data:`TEXT_INPUTS`.
        image_encoder, image_kwargs: registered image encoder (``linear``: ``W_i x``, no bias).
        text_projection: a ``W_t`` after the text encoder (``False`` when it already outputs ``d``).
        text_projection_bias: whether that ``W_t`` has a bias (SEAM's linear layer does).
        absolute: ``|.|`` on both sides before the L2 normalisation (order embeddings need it).
    """

    text_encoder: str
    text_kwargs: dict[str, Any] = field(default_factory=dict)
    text_input: str = "chars"
    image_encoder: str = "linear"
    image_kwargs: dict[str, Any] = field(default_factory=dict)
    text_projection: bool = True
    text_projection_bias: bool = False
    absolute: bool = True

    def __post_init__(self) -> None:
        if self.text_input not in TEXT_INPUTS:
            raise ValueError(f"unknown text input {self.text_input!r} (expected one of {TEXT_INPUTS})")
