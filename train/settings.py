"""The settings of ``train <family>``: the fields every family shares, and the base of a family's own.

A run's settings are one class per family, ``TrainSection`` + the family's :class:`FamilyConfig`
submodel, made by :func:`train.models.family.settings_class`; build them with
:func:`train.models.family.train_settings` (``family=...`` picks the class). This module holds the
common fields (the schema's defaults, one place) and imports no family and no torch, so the schema
of ``pipelines.yaml`` (:mod:`pipelines.schema`) can name it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vsecore.schema import Section


class FamilyConfig(BaseModel):
    """Base of a family's own settings: its fields (with defaults and help text as ``description``) and
    validators; ``--help`` and the option parser of ``train <family>`` are generated from the fields
    (:func:`train.fit_options.family_options`). A validator may read the common fields too: it runs in the
    family's settings class, which has both."""

    model_config = ConfigDict(extra="forbid")


class TrainSection(Section):
    """The fields every family shares; a family's settings class adds its :class:`FamilyConfig`."""

    path_fields = ("data", "features", "out")
    #: the family's name (its settings class narrows this to ``Literal[name]``)
    family: str
    data: str | None = None
    features: str | None = None
    out: str
    d: int = Field(1024, ge=1)
    measure: Literal["order", "cosine"] = "order"
    order_sqrt: bool = False
    loss: Literal["sum", "max"] = "sum"
    margin: float = Field(0.05, ge=0)
    #: a batch's other pairs are the contrastive examples, so a batch needs at least two
    batch_size: int = Field(128, ge=2)
    lr: float = Field(1e-3, gt=0)
    lr_decay_patience: int = Field(3, ge=1)
    early_stop: int = Field(10, ge=1)
    epochs: int = Field(30, ge=1)
    #: character models read at most this many characters of a caption
    max_chars: int = Field(256, ge=1)
    #: word models read at most this many words of a caption
    max_words: int = Field(100, ge=1, description="captions are cut to this many words")
    #: word models: words seen fewer times in the train split map to <unk>
    min_word_count: int = Field(1, ge=1, description="words seen fewer times in the train split map to "
                                "<unk> (default 1: every train word)")
    grad_clip: float | None = Field(2.0, ge=0)
    #: learning-rate schedule: /10 on a validation plateau, /10 every ``lr_step`` epochs, or constant
    lr_schedule: Literal["plateau", "step", "constant"] = "plateau"
    lr_step: int = Field(15, ge=1)
    captions_per_epoch: Literal["all", "one"] = "all"
    #: language of the training and validation captions (``lang`` of the prepared sentences)
    lang: str = "en"
    #: write a mid-epoch checkpoint every this many steps, so ``--resume`` survives a kill
    checkpoint_every: int = Field(200, ge=1)
    val_images: int | None = Field(None, ge=1)
    val_protocol: Literal["1k", "5cv", "5k", "all"] = "all"
    seed: int = 0
    device: str = "auto"
    amp: bool = False
    workers: int = Field(0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _a_family_class(cls, data: Any) -> Any:
        if cls is TrainSection:  # the common fields alone are no run's settings
            raise TypeError("TrainSection holds the common fields only: build a family's settings with "
                            "train.models.family.train_settings(family=...)")
        return data

    @property
    def train_langs(self) -> list[str]:
        """Languages of the image-text training captions: ``langs`` (clmr/liwe), else ``[lang]``."""
        langs = getattr(self, "langs", None)
        return list(langs) if langs else [self.lang]

    @property
    def cross_langs(self) -> list[str]:
        """Languages paired with ``lang`` by the cross-language loss (``cross_lang`` of clmr/liwe), or []."""
        return list(getattr(self, "cross_lang", None) or [])
