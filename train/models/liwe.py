"""``train clmr`` and ``train liwe``: the families of "Language-Agnostic Visual-Semantic Embeddings"
(Wehrmann, Souza, Lopes and Barros, ICCV 2019): their settings (the eta schedule, languages, LIWE's word
embedder), defaults, specs and objective, and the word-embedding report of ``train liwe --dry-run``. The
networks (the BiGRU caption encoders, LIWE's character-built word embedder, their readings of the paper) are
:mod:`train.models.language_agnostic`, the region image encoder :mod:`train.models.regions`, imported only
when a model is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field, field_validator, model_validator

from train.engine.settings import FamilyConfig
from train.models.family import Family
from train.models.spec import ModelSpec

if TYPE_CHECKING:
    from train.engine.objectives import Objective


def _region_family(settings: Any, text_encoder: str, text_input: str, text_kwargs: dict[str, Any]
                   ) -> ModelSpec:
    # start-up: the networks (torch) register their encoders only when a model is built
    import train.models.language_agnostic  # noqa: F401  start-up: clmr, liwe
    import train.models.regions  # noqa: F401  start-up: nonlocal_regions

    # the BiGRU's size is the joint space (no W_t); cosine embeddings, so no |.| before the L2 norm
    return ModelSpec(text_encoder, {"d": settings.d, **text_kwargs}, text_input=text_input,
                     image_encoder="nonlocal_regions", text_projection=False, absolute=False)


class RegionFamilyConfig(FamilyConfig):
    """The settings clmr and liwe share: the eta schedule and the languages (and what they refuse)."""

    #: the hard-negative weight lambda = 1 - eta^iteration of J = lambda J_max + (1 - lambda) J_sum
    eta: float = Field(0.991, ge=0, le=1, description="hard-negative schedule: J = lambda J_max + (1 - "
                       "lambda) J_sum with lambda = 1 - eta^iteration (1: sum of hinges only, 0: max of "
                       "hinges only)")
    #: languages of the image-text training captions (default: ``lang`` only, as the paper's Eq. 8 and LAVSE)
    langs: list[str] | None = Field(
        None, min_length=1, json_schema_extra={"metavar": "LANG[,LANG]"},
        description="languages of the image-text training captions (default: --lang only, as the paper's "
        "Eq. 8 and LAVSE: other languages enter through --cross-lang); the test evaluation is done per "
        "language")
    #: languages aligned to ``lang`` by the dataset's pairs, for the cross-language loss (none: off)
    cross_lang: list[str] = Field(
        default_factory=list, json_schema_extra={"metavar": "LANG[,LANG]"},
        description="add the cross-language loss over the dataset's pairs aligning --lang with each of these "
        "languages (default: none)")

    @property
    def train_langs(self) -> list[str]:
        """Languages of the image-text training captions: ``langs``, else ``[lang]`` (overrides
        :attr:`train.engine.settings.TrainSection.train_langs`; the settings class puts this config first)."""
        return list(self.langs) if self.langs else [self.lang]  # type: ignore[attr-defined]

    @property
    def cross_langs(self) -> list[str]:
        """Languages paired with ``lang`` by the cross-language loss (``cross_lang``), or []."""
        return list(self.cross_lang)

    @model_validator(mode="after")
    def _cosine_and_the_eta_schedule(self) -> RegionFamilyConfig:
        # the defaults (cosine, margin 0.2) are region_defaults; here what cannot be asked for explicitly
        family, fields_set = getattr(self, "family", "?"), self.model_fields_set
        measure, loss = getattr(self, "measure", "cosine"), getattr(self, "loss", "sum")
        if "measure" in fields_set and measure != "cosine":
            raise ValueError(f"family '{family}' uses the cosine similarity (the paper's), not '{measure}'")
        if "loss" in fields_set and loss == "max":
            # the eta schedule weighs sum and max; eta 0 is the max alone
            raise ValueError(f"family '{family}' mixes the sum and max of hinges by the eta schedule: use "
                             "eta 0 for the max of hinges alone, not loss 'max'")
        return self

    @model_validator(mode="after")
    def _languages(self) -> RegionFamilyConfig:
        lang = getattr(self, "lang", "en")
        if self.langs is not None and lang not in self.langs:
            raise ValueError(f"langs {self.langs} must include lang '{lang}' (the validation language)")
        if lang in self.cross_lang:
            raise ValueError(f"cross_lang pairs '{lang}' with other languages; it cannot include it")
        return self


class ClmrConfig(RegionFamilyConfig):
    """CLMR's own settings: those of the region families."""


class LiweConfig(RegionFamilyConfig):
    """LIWE's own settings: the word embedder's layers and C_w, then those of the region families."""

    #: LIWE: sizes of the word embedder's fully connected layers (f1, f2, ...): LIWE(128,256)
    layers: list[int] = Field(default_factory=lambda: [128, 256], min_length=1,
                              json_schema_extra={"metavar": "F1,F2"},
                              description="fully connected layers of the character-built word embedder: "
                              "LIWE(f1,f2) (default 128,256)")
    #: characters per word (longer words are cut); None: from the train split's word lengths
    word_length: int | None = Field(None, ge=1, json_schema_extra={"metavar": "C_W"},
                                    description="characters per word (longer words are cut) (default: the "
                                    "length covering 99.9% of the train split's distinct words; 26 for a "
                                    "--dry-run without --data)")


    @field_validator("layers")
    @classmethod
    def _layers_have_units(cls, layers: list[int]) -> list[int]:
        if any(n < 1 for n in layers):
            raise ValueError("every layer needs at least 1 unit")
        return layers


def region_defaults(settings: Any, dataset_name: str | None) -> dict[str, Any]:
    """LIWE paper section 2.4 and LAVSE: cosine similarity, margin 0.2 (the config refuses another measure
    and a plain max of hinges: the eta schedule mixes sum and max)."""
    return {"measure": "cosine", "margin": 0.2}


def clmr_spec(settings: Any) -> ModelSpec:
    """CLMR: word lookup + BiGRU over words; non-local region image encoder; cosine."""
    return _region_family(settings, "clmr", "words", {})


def liwe_spec(settings: Any) -> ModelSpec:
    """LIWE(f1, f2, ...): character-built words (``C_w`` = ``word_length``) + BiGRU; region image encoder."""
    from train.models.language_agnostic import WORD_LENGTH  # start-up: torch only when a model is built

    word_length = settings.word_length or WORD_LENGTH
    return _region_family(settings, "liwe", "word_chars",
                          {"word_length": word_length, "layers": tuple(settings.layers)})


def liwe_data_defaults(settings: Any, dataset: Any) -> dict[str, Any]:
    """``word_length`` (C_w) not given: from the train split's word lengths
    (:func:`word_length_from_statistics`), recorded in the run's settings."""
    if settings.word_length is not None:
        return {}
    return {"word_length": word_length_from_statistics(dataset.words.counts)}


def scheduled_objective(settings: Any) -> Objective:
    """The LIWE paper's loss: the eta schedule of hinges, plus the cross-language loss."""
    from train.engine.objectives import ScheduledContrastiveObjective  # start-up: torch when a run trains

    return ScheduledContrastiveObjective(eta=settings.eta, margin=settings.margin, measure=settings.measure)


CLMR = Family("clmr", "CLMR: word embeddings + BiGRU, non-local region image encoder, cosine, eta schedule, "
              "cross-language loss", ClmrConfig, clmr_spec, defaults=region_defaults,
              objective=scheduled_objective, common_options=("max_words", "min_word_count"))
LIWE = Family("liwe", "LIWE: character-built word embeddings + BiGRU, non-local region image encoder, "
              "cosine, eta schedule, cross-language loss", LiweConfig, liwe_spec, defaults=region_defaults,
              objective=scheduled_objective, data_defaults=liwe_data_defaults, common_options=("max_words",))


# --- the word-embedding report and C_w ----------------------------------------------------------------


def word_embedding_report(alphabet_size: int, word_length: int, layers: Sequence[int], vocab_size: int,
                          char_dim: int | None = None, word_dim: int | None = None) -> dict[str, Any]:
    """LIWE embedder vs CLMR table for the same data: ``{"liwe", "clmr", "ratio", ...}`` (``train liwe
    --dry-run`` prints :func:`format_word_embedding_report` of it); ``char_dim`` and ``word_dim`` default to
    the paper's (:mod:`train.models.language_agnostic`)."""
    # start-up: counted on the networks (torch), built only for the report
    from train.models.language_agnostic import (
        CHAR_DIM,
        WORD_DIM,
        clmr_word_table_parameters,
        liwe_word_embedder_parameters,
    )

    char_dim = CHAR_DIM if char_dim is None else char_dim
    word_dim = WORD_DIM if word_dim is None else word_dim
    liwe_count = liwe_word_embedder_parameters(alphabet_size, word_length, layers, char_dim)
    clmr_count = clmr_word_table_parameters(vocab_size, word_dim)
    return {"alphabet_size": int(alphabet_size), "word_length": int(word_length),
            "layers": [int(n) for n in layers], "char_dim": int(char_dim), "vocab_size": int(vocab_size),
            "word_dim": int(word_dim), "liwe": liwe_count, "clmr": clmr_count,
            "ratio": clmr_count / liwe_count}


def format_word_embedding_report(report: Mapping[str, Any]) -> str:
    """Two lines: the LIWE word-embedder count and the CLMR table size with the ratio."""
    layers = ",".join(str(n) for n in report["layers"])
    return (f"LIWE({layers}) word embedder: {report['liwe']:,} parameters "
            f"(alphabet {report['alphabet_size']} x {report['char_dim']}-d characters, "
            f"C_w = {report['word_length']})\n"
            f"CLMR word table for the same data: {report['vocab_size']:,} words x {report['word_dim']} = "
            f"{report['clmr']:,} parameters ({report['ratio']:.1f}x the LIWE embedder)")


def word_length_from_statistics(counts: Mapping[str, int], coverage: float = 0.999,
                                skip: Sequence[str] = ("<pad>", "<unk>")) -> int:
    """``C_w``: the smallest length such that a fraction ``coverage`` of the distinct train-split words
    (``words.json`` ``counts``, specials skipped) are at most that long; longer words are cut.

    The paper fixes ``C_w`` "based on the statistics of the word lengths within the corpora" without the
    rule; a quantile of the word types is that statistic here (types, not occurrences: a frequent short
    word should not push a rare long one out).
    """
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    lengths = np.sort(np.array([len(w) for w in counts if w not in skip], dtype=np.int64))
    if not len(lengths):
        raise ValueError("no words to measure")
    index = min(len(lengths) - 1, max(0, math.ceil(coverage * len(lengths)) - 1))
    return int(lengths[index])
