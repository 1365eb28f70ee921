"""Registry of text encoders, in the manner of timm's ``create_model``.

Every model file registers its variants with ``@register_text_encoder``; the trainer only ever calls
``create_text_encoder(name, alphabet_size, **kw)``, so a new family (SEAM, UVS, CLMR, LIWE) plugs in
by adding a file that registers its encoders and a family rule (``register_family``), without
touching the trainer.

A text encoder is an ``nn.Module`` with ``forward(chars (B, T) long, lengths (B,) long) ->
(B, output_dim)``, an ``output_dim`` attribute and ``num_parameters()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: name -> constructor ``(alphabet_size, **kw) -> TextEncoder``
_TEXT_ENCODERS: dict[str, Callable[..., TextEncoder]] = {}
#: family -> rule ``(settings) -> (encoder name, constructor keywords)``
_FAMILIES: dict[str, Callable[[Any], tuple[str, dict[str, Any]]]] = {}


class TextEncoder(nn.Module):
    """Base class of registered text encoders.

    Subclasses set ``output_dim`` and implement ``forward(chars (B, T) long, lengths (B,) long) ->
    (B, output_dim)``, masking padding explicitly (index 0 is ``<pad>``, 1 is ``<unk>``).
    """

    output_dim: int

    def num_parameters(self) -> int:
        """Number of trainable parameters."""
        return count_parameters(self)

    def forward(self, chars: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:  # pragma: no cover
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


def create_text_encoder(name: str, alphabet_size: int, **kwargs: Any) -> TextEncoder:
    """Build the registered text encoder ``name`` over an alphabet (or vocabulary) of ``alphabet_size``."""
    _load_builtin_models()
    if name not in _TEXT_ENCODERS:
        known = ", ".join(list_text_encoders())
        raise KeyError(f"unknown text encoder {name!r} (registered: {known})")
    return _TEXT_ENCODERS[name](alphabet_size, **kwargs)


def list_text_encoders() -> list[str]:
    """Sorted names of the registered text encoders."""
    _load_builtin_models()
    return sorted(_TEXT_ENCODERS)


def register_family(family: str):
    """Decorator registering how ``train <family>`` picks its encoder from the train settings.

    The rule maps a ``TrainSection`` to ``(encoder name, constructor keywords)``.
    """

    def add(rule: Callable[[Any], tuple[str, dict[str, Any]]]):
        _FAMILIES[family] = rule
        return rule

    return add


def encoder_for(settings: Any) -> tuple[str, dict[str, Any]]:
    """``(encoder name, keywords)`` for ``settings.family`` (a ``TrainSection``)."""
    _load_builtin_models()
    if settings.family not in _FAMILIES:
        known = ", ".join(sorted(_FAMILIES))
        raise KeyError(f"no text encoder is registered for family {settings.family!r} (available: {known})")
    return _FAMILIES[settings.family](settings)


def _load_builtin_models() -> None:
    """Import the model files so that their ``@register_text_encoder`` decorators have run."""
    from train.models import chain_vse, oecc, seam, uvs  # noqa: F401
