"""``train chain``: the CHAIN-VSE family (Wehrmann and Barros, CVPR 2018): its settings, its spec, its
classifier encoder. The networks (v1, v2; the reading of table 1's counts) are
:mod:`train.models.chain_vse`, imported only when a model is built."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from train.engine.settings import FamilyConfig
from train.models.family import ClassifierEncoder, Family
from train.models.spec import ModelSpec


class ChainConfig(FamilyConfig):
    """CHAIN-VSE's own settings."""

    version: Literal["v1", "v2"] = Field(
        "v1", description="CHAIN-VSE v1 (inception of character convolutions) or v2 (depthwise separable "
        "convolutions) (default v1)")
    p: float = Field(1.0, gt=0, description="width multiplier of the text encoder: p=1 has 256 filters per "
                     "stream, p=0.5 has 128 (default 1.0)")


def chain_spec(settings: Any) -> ModelSpec:
    """CHAIN-VSE: characters in, ``|W_t g(T)|`` and ``|W_i C(I)|`` (Eq. 1), order embeddings."""
    import train.models.chain_vse  # noqa: F401  start-up: registers chain_v1/chain_v2 (torch) for a model

    return ModelSpec(f"chain_{settings.version}", {"p": settings.p}, text_input="chars")


FAMILY = Family("chain", "CHAIN-VSE: character inception text encoder, order embeddings", ChainConfig,
                chain_spec, classifier=ClassifierEncoder("chain", ("version", "p")))
