"""``train oecc``: the OECC family (Wehrmann, Mattjie and Barros, Pattern Recognition Letters 2018): its
settings, its spec, its classifier encoder. The networks (convolutions through time, architectures A-D) are
:mod:`train.models.ctt`, imported only when a model is built."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from train.engine.settings import FamilyConfig
from train.models.family import ClassifierEncoder, Family
from train.models.spec import ModelSpec


class OeccConfig(FamilyConfig):
    """OECC's own settings."""

    arch: Literal["A", "B", "C", "D"] = Field("D", description="OECC text encoder architecture A-D (paper, "
                                              "Table 1) (default D)")


def oecc_spec(settings: Any) -> ModelSpec:
    """OECC: characters in, ``|W_t CTT(T)|`` and ``|W_i C(I)|`` (Eq. 3), order embeddings."""
    import train.models.ctt  # noqa: F401  start-up: registers oecc_a .. oecc_d (torch) for a model

    return ModelSpec(f"oecc_{settings.arch.lower()}", text_input="chars")


FAMILY = Family("oecc", "OECC: order embeddings with character convolutions through time", OeccConfig,
                oecc_spec, classifier=ClassifierEncoder("oecc", ("arch",)))
