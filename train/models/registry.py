"""Registries of text and image encoders, in the manner of timm's ``create_model`` (:class:`ModelSpec`, what
a family builds, is :mod:`train.models.spec`'s, re-exported here for a plugin's file).

Every network module registers its variants with ``@register_text_encoder`` / ``@register_image_encoder``
when it is imported: a family's ``spec`` imports its own network module before it names its encoders, so
building a model through its family always finds them, and :mod:`train.models.networks` imports every
built-in one (what ``train.models.create_text_encoder`` reads). A model family (what ``train <family>``
trains) is declared in a light file of its own as a :class:`train.models.family.Family`, which names the
encoders through its :class:`ModelSpec`; the trainer only ever calls the family's rules and the
``create_*`` functions, so a new family plugs in by adding a file, without touching the trainer.

* A text encoder is an ``nn.Module`` with ``forward(tokens, lengths) -> (B, output_dim)``, an
  ``output_dim`` attribute and ``num_parameters()``. What ``tokens`` holds is the family's
  :attr:`ModelSpec.text_input` (see :data:`TEXT_INPUTS`). An encoder with a training regulariser
  (SEAM's attention penalty) sets ``self.penalty`` during ``forward``; the trainer adds it to the loss.
* An image encoder is an ``nn.Module`` with ``forward(features (B, *feature_shape)) -> (B, d)``
  (not normalised: the joint model applies ``|.|`` and the L2 normalisation).
* A family's ``spec`` rule maps its train settings to a :class:`ModelSpec`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

# what a family builds is declared without torch (the families' declarations read it); a plugin's file
# imports it from here with the registries, as docs/ARCHITECTURE.md shows
from train.models.spec import TEXT_INPUTS, ModelSpec

__all__ = ["TEXT_INPUTS", "LinearImageEncoder", "ModelSpec", "TextEncoder", "count_parameters",
           "create_image_encoder", "create_text_encoder", "list_text_encoders", "register_image_encoder",
           "register_text_encoder"]

#: name -> constructor ``(vocab_size, **kw) -> TextEncoder``
_TEXT_ENCODERS: dict[str, Callable[..., TextEncoder]] = {}
#: name -> constructor ``(feature_shape, d, **kw) -> nn.Module``
_IMAGE_ENCODERS: dict[str, Callable[..., nn.Module]] = {}


class TextEncoder(nn.Module):
    """Base class of registered text encoders.

    Subclasses set ``output_dim`` and implement ``forward(tokens, lengths (B,) long) ->
    (B, output_dim)``, masking padding explicitly (index 0 is ``<pad>``, 1 is ``<unk>``). ``tokens``
    is (B, T) long for ``chars``/``words`` input, (B, T, C) long for ``word_chars``.
    """

    output_dim: int
    #: a regulariser of the last ``forward`` (scalar tensor, coefficient applied), or ``None``
    penalty: torch.Tensor | None = None

    def num_parameters(self) -> int:
        """Number of trainable parameters."""
        return count_parameters(self)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError


def count_parameters(module: nn.Module) -> int:
    """Number of trainable parameters of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def register_text_encoder(name: str | Callable[..., TextEncoder] | None = None):
    """Decorator registering a text-encoder constructor under ``name`` (default: the function's name).

    Usable bare (``@register_text_encoder``) or with a name (``@register_text_encoder("oecc_a")``).
    Registering a name twice is an error, so two files cannot silently shadow each other.
    """

    def add(fn: Callable[..., TextEncoder], key: str | None = None) -> Callable[..., TextEncoder]:
        key = key or fn.__name__
        if key in _TEXT_ENCODERS and _TEXT_ENCODERS[key] is not fn:
            raise ValueError(f"text encoder {key!r} is already registered")
        _TEXT_ENCODERS[key] = fn
        return fn

    if callable(name):
        return add(name)
    return lambda fn: add(fn, name)


def create_text_encoder(name: str, vocab_size: int, **kwargs: Any) -> TextEncoder:
    """Build the registered text encoder ``name`` over an alphabet or word vocabulary of ``vocab_size``."""
    if name not in _TEXT_ENCODERS:
        known = ", ".join(list_text_encoders())
        raise KeyError(f"unknown text encoder {name!r} (registered: {known})")
    return _TEXT_ENCODERS[name](vocab_size, **kwargs)


def register_image_encoder(name: str):
    """Decorator registering an image-encoder constructor ``(feature_shape, d, **kw)`` under ``name``."""

    def add(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _IMAGE_ENCODERS and _IMAGE_ENCODERS[name] is not fn:
            raise ValueError(f"image encoder {name!r} is already registered")
        _IMAGE_ENCODERS[name] = fn
        return fn

    return add


def create_image_encoder(name: str, feature_shape: tuple[int, ...], d: int, **kwargs: Any) -> nn.Module:
    """Build the registered image encoder ``name`` for rows of ``feature_shape`` into ``d`` dimensions."""
    if name not in _IMAGE_ENCODERS:
        raise KeyError(f"unknown image encoder {name!r} (registered: {', '.join(sorted(_IMAGE_ENCODERS))})")
    return _IMAGE_ENCODERS[name](tuple(int(s) for s in feature_shape), d, **kwargs)


class LinearImageEncoder(nn.Module):
    """``W_i x`` without bias (CHAIN-VSE Eq. 1, OECC Eq. 3, FNE, SEAM): ``(B, C) -> (B, d)``, Xavier init."""

    def __init__(self, feature_shape: tuple[int, ...], d: int) -> None:
        super().__init__()
        if len(feature_shape) != 1:
            raise ValueError(f"the linear image encoder takes one vector per image, not rows of shape "
                             f"{feature_shape} (region features need a region encoder)")
        self.projection = nn.Linear(feature_shape[0], d, bias=False)
        nn.init.xavier_uniform_(self.projection.weight)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``features (B, C) float -> (B, d)``."""
        return self.projection(features)


register_image_encoder("linear")(LinearImageEncoder)


def list_text_encoders() -> list[str]:
    """Sorted names of the registered text encoders."""
    return sorted(_TEXT_ENCODERS)
