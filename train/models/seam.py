"""``train seam``: the SEAM family (Wehrmann, Lopes, More and Barros, WACV 2018): its settings, defaults,
spec and classifier encoder. The self-attentive networks (SEAM-E, C, G; table 2's counts) are
:mod:`train.models.self_attention`, imported only when a model is built."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from train.engine.settings import FamilyConfig
from train.models.family import ClassifierEncoder, Family
from train.models.spec import ModelSpec

#: default hops of each variant (best image-to-text R@1 of table 2 for E and C; section 3.2 for G)
DEFAULT_HOPS = {"E": 30, "C": 5, "G": 30}


class SeamConfig(FamilyConfig):
    """SEAM's own settings: the variant, hops of each attention module (None: the variant's default), the
    penalty lambda, GRU units of SEAM-G."""

    variant: Literal["E", "C", "G"] = Field(
        "E", description="SEAM-E (attention over the word embeddings), SEAM-C (+ convolutions of width 2 and "
        "3) or SEAM-G (attention over a GRU's states) (default E)")
    hops: int | None = Field(None, ge=1, description="attention hops h of each attention module (default: "
                             "E 30, C 5, G 30)")
    penalty: float = Field(0.0, ge=0, description="lambda, coefficient of the attention penalty "
                           "||AA^T - I||_F^2 (default 0)")
    gru_units: int = Field(512, ge=1, description="GRU units of SEAM-G (default 512)")


def seam_defaults(settings: Any, dataset_name: str | None) -> dict[str, Any]:
    """SEAM section 3.2: Adam 1e-3 divided by 10 "in the 15th epoch" (the released code's
    ``lr * 0.1 ** (epoch // 15)`` over 30 epochs, no early stopping), batch 128, margin 0.05, order
    embeddings with the sum of hinges (the schema's defaults), every caption each epoch; hops by
    variant (:data:`DEFAULT_HOPS`)."""
    return {"hops": DEFAULT_HOPS[settings.variant], "lr_schedule": "step", "lr_step": 15, "epochs": 30,
            "early_stop": 30}


def seam_spec(settings: Any) -> ModelSpec:
    """SEAM: words in, ``|W_t M + b|`` (``W_t`` with bias, table 2) and ``|W_i C(I)|`` (Eq. 4)."""
    import train.models.self_attention  # noqa: F401  start-up: registers seam_e/c/g (torch) for a model

    variant = settings.variant
    kwargs: dict[str, Any] = {"hops": settings.hops or DEFAULT_HOPS[variant], "penalty": settings.penalty}
    if variant == "G":
        kwargs["gru_units"] = settings.gru_units
    return ModelSpec(f"seam_{variant.lower()}", kwargs, text_input="words", text_projection=True,
                     text_projection_bias=True, absolute=True)


FAMILY = Family("seam", "SEAM: self-attentive word-embedding text encoders (E, C, G), order embeddings",
                SeamConfig, seam_spec, defaults=seam_defaults, common_options=("max_words", "min_word_count"),
                help_notes={"hops": "; by --variant: E 30, C 5, G 30"},
                classifier=ClassifierEncoder("seam", ("variant", "hops", "penalty", "gru_units")))
