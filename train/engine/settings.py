"""The settings of the ``train`` stage: those of ``train <family>`` (the fields every family shares, and the
base of a family's own), of ``train classify``, and of a pipeline's ``evaluate`` and ``compare`` stages.

A run's settings are one class per family, ``TrainSection`` + the family's :class:`FamilyConfig`
submodel, made by :func:`train.models.family.settings_class`; build them with
:func:`train.models.family.train_settings` (``family=...`` picks the class). This module holds the
common fields (the schema's defaults, one place) and imports no family and no torch, so the schema
of ``pipelines.yaml`` (:mod:`pipelines.schema`) can name it.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vsecore.device import DEVICE_HELP
from vsecore.schema import Section

#: defaults of --alphabet-size / --image-dim for a --dry-run without data (COCO's lowercased
#: alphabet is about 70 symbols; VGG fc7 features have 4096 dimensions)
DRY_RUN_ALPHABET = 72
DRY_RUN_IMAGE_DIM = 4096
#: default --vocab-size of a word model's --dry-run without data: the SEAM paper's COCO vocabulary
DRY_RUN_VOCABULARY = 11360


#: region rows of a --dry-run without --features: the paper's 36 BUTD regions of 2,048 dimensions
DRY_RUN_REGIONS = (36, 2048)

#: the largest joint dimension, caption length (characters or words) and batch a run may declare: 64 times
#: the papers' largest (d 1024, 1014 characters, batch 128), so a hostile config.json or model.json cannot
#: ask for gigabytes (docs/safety.md, "Opening a shared run or model")
MAX_JOINT_DIM = 65_536
MAX_TEXT_LENGTH = 65_536
MAX_BATCH_SIZE = 65_536


class FamilyConfig(BaseModel):
    """Base of a family's own settings: its fields (with defaults and help text as ``description``) and
    validators; ``--help`` and the option parser of ``train <family>`` are generated from the fields
    (:func:`train.cli.fit_options.family_options`). A validator may read the common fields too: it runs in the
    family's settings class, which has both."""

    model_config = ConfigDict(extra="forbid")


class TrainSection(Section):
    """The fields every family shares; a family's settings class adds its :class:`FamilyConfig`."""

    path_fields = ("data", "features", "out")
    #: the family's name (its settings class narrows this to ``Literal[name]``)
    family: str
    # -- data
    data: str | None = Field(
        None, json_schema_extra={"metavar": "PREPARED"},
        description="prepared dataset folder written by `prep` (required unless --pipeline gives it)")
    features: str | None = Field(
        None, json_schema_extra={"metavar": "STORE[:global|:fne|:regions]"},
        description="feature store written by `features`, with the key of the features to use: global or fne "
        "for chain/oecc/seam/vse (default: global if present, else fne), regions for clmr/liwe")
    #: language of the training and validation captions (``lang`` of the prepared sentences)
    lang: str = Field("en", description="language of the captions to train on")
    #: character models read at most this many characters of a caption
    max_chars: int = Field(256, ge=1, le=MAX_TEXT_LENGTH,
                           description="captions are cut to this many characters")
    #: word models read at most this many words of a caption
    max_words: int = Field(100, ge=1, le=MAX_TEXT_LENGTH, description="captions are cut to this many words")
    #: word models: words seen fewer times in the train split map to <unk>
    min_word_count: int = Field(1, ge=1, description="words seen fewer times in the train split map to "
                                "<unk> (1: every train word)")
    captions_per_epoch: Literal["all", "one"] = Field(
        "all", description="'all': every caption once per epoch (CHAIN-VSE, OECC, SEAM); 'one': one random "
        "caption per image per epoch (FNE paper)")
    # -- model and loss
    d: int = Field(1024, ge=1, le=MAX_JOINT_DIM, description="dimension of the joint embedding")
    measure: Literal["order", "cosine"] = Field("order", description="similarity: order violation or cosine")
    order_sqrt: bool = Field(False, description="take the square root of the order violation, as the "
                             "released code does")
    loss: Literal["sum", "max"] = Field("sum", description="sum of hinges over the contrastive examples, or "
                                        "the hardest only")
    margin: float = Field(0.05, ge=0, description="contrastive margin alpha")
    # -- optimisation
    #: a batch's other pairs are the contrastive examples, so a batch needs at least two
    batch_size: int = Field(128, ge=2, le=MAX_BATCH_SIZE,
                            description="image-caption pairs per batch; the others are the contrastive "
                            "examples")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    lr_decay_patience: int = Field(3, ge=1, description="divide the learning rate by 10 after this many "
                                   "epochs without a better validation rsum")
    #: learning-rate schedule: /10 on a validation plateau, /10 every ``lr_step`` epochs, or constant
    lr_schedule: Literal["plateau", "step", "constant"] = Field(
        "plateau", description="plateau: /10 after --lr-decay-patience epochs without improvement; step: /10 "
        "every --lr-step epochs; constant")
    lr_step: int = Field(15, ge=1, description="epochs between two /10 steps of --lr-schedule step")
    early_stop: int = Field(10, ge=1, description="stop after this many epochs without a better validation "
                            "rsum")
    epochs: int = Field(30, ge=1, description="maximum number of epochs")
    grad_clip: float | None = Field(2.0, ge=0, description="clip the gradient norm to this value; 0 disables")
    seed: int = Field(0, description="seed of initialisation and shuffling; on CPU a run is reproducible")
    # -- validation
    val_protocol: Literal["1k", "5cv", "5k", "all"] = Field(
        "all", description="protocol of the per-epoch validation rsum")
    val_images: int | None = Field(None, ge=1, description="validate on the first N val images only")
    # -- run
    out: str = Field(json_schema_extra={"metavar": "RUN_DIR"},
                     description="run directory (default runs/<family>-<timestamp>)")
    #: write a mid-epoch checkpoint every this many steps, so ``--resume`` survives a kill
    checkpoint_every: int = Field(200, ge=1, description="also write checkpoints/last.pt every this many "
                                  "steps within an epoch")
    device: str = Field("auto", description=DEVICE_HELP)
    amp: bool = Field(False, description="bf16 autocast on CUDA (ignored on CPU)")
    workers: int = Field(0, ge=0, description="worker processes that collate the batches (a DataLoader's; 0: "
                         "in this process)")
    #: execution choices of the training step (the step's loss is the eager step's to float rounding)
    compile: bool = Field(False, description="torch.compile the model and the loss; captions are padded to a "
                          "few fixed lengths so the compiled code is reused (each new length compiles once, "
                          "minutes on a CPU), and a batch of another size (an epoch's last) runs eagerly")
    cuda_graphs: bool = Field(False, description="replay each training step (forward, backward, Adam) as a "
                              "CUDA graph, one per padded caption length (CUDA only; families without a GRU: "
                              "chain, oecc, seam C and E)")

    @model_validator(mode="before")
    @classmethod
    def _a_family_class(cls, data: Any) -> Any:
        if cls is TrainSection:  # the common fields alone are no run's settings
            raise TypeError("TrainSection holds the common fields only: build a family's settings with "
                            "train.models.family.train_settings(family=...)")
        return data

    @property
    def train_langs(self) -> list[str]:
        """Languages of the image-text training captions: ``[lang]`` (a family with settings of its own for
        them overrides this property in its config, as clmr/liwe do)."""
        return [self.lang]

    @property
    def cross_langs(self) -> list[str]:
        """Languages paired with ``lang`` by a cross-language loss: none (overridden like
        :attr:`train_langs`)."""
        return []


class ClassifySection(Section):
    """The settings of ``train classify`` (CHAIN-VSE section 5): a registered text encoder + a softmax head.

    This class holds classification's own fields; the encoder's options (``version``/``p`` of chain,
    ``arch`` of oecc, ``variant``/``hops``/``penalty``/``gru_units`` of seam, ``word_dim`` of vse's GRU) are
    the fields of the encoder family's config, composed onto it by
    :func:`train.models.classifier.classify_settings_class` (their type, bounds and help are the family's),
    and ``encoder`` is narrowed to the registered classifier encoders there. Build settings with
    :func:`train.models.classifier.classify_settings`. The loop is the retrieval trainer's, with the
    validation accuracy in place of the rsum.
    """

    path_fields: ClassVar[tuple[str, ...]] = ("data", "out")
    #: what the shared trainer reads of a retrieval run's settings: every text once per epoch
    captions_per_epoch: ClassVar[str] = "all"
    encoder: str = Field("chain", description="the text encoder of a retrieval family")
    data: str | None = Field(None, json_schema_extra={"metavar": "PREPARED"},
                             description="folder written by `prep textcls`")
    out: str = Field(json_schema_extra={"metavar": "RUN_DIR"},
                     description="run directory (default runs/classify-<timestamp>)")
    dropout: float = Field(0.5, ge=0, lt=1, description="dropout before the softmax layer")
    max_chars: int = Field(1014, ge=1, le=MAX_TEXT_LENGTH, description="character encoders read at most "
                           "this many characters (Zhang et al.'s 1014)")
    max_words: int = Field(200, ge=1, le=MAX_TEXT_LENGTH,
                           description="word encoders read at most this many words")
    min_word_count: int = Field(1, ge=1,
                                description="word encoders: train words seen fewer times map to <unk>")
    lang: str = Field("en", description="language of new texts given to a word encoder (predict, noise); "
                      "the dataset's rows carry their own")
    batch_size: int = Field(128, ge=1, le=MAX_BATCH_SIZE, description="texts per batch")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    lr_schedule: Literal["plateau", "step", "constant"] = Field(
        "plateau", description="plateau: /10 after --lr-decay-patience epochs without a better val accuracy; "
        "step: /10 every --lr-step epochs; constant")
    lr_decay_patience: int = Field(2, ge=1, description="epochs without improvement before the /10")
    lr_step: int = Field(15, ge=1, description="epochs per /10 step of --lr-schedule step")
    early_stop: int = Field(4, ge=1, description="stop after this many epochs without a better val accuracy")
    epochs: int = Field(20, ge=1, description="maximum number of epochs")
    grad_clip: float | None = Field(5.0, ge=0, description="clip the gradient norm; 0 disables")
    train_noise: float = Field(
        0.0, ge=0, lt=1, json_schema_extra={"metavar": "P"},
        description="replace this ratio of each training text's characters, as `train evaluate --noise` "
        "does, drawn afresh every epoch (seeded by --seed, the epoch and the text; exact on --resume); "
        "0: none")
    seed: int = Field(0, description="seed of initialisation and shuffling")
    checkpoint_every: int = Field(200, ge=1,
                                  description="also write checkpoints/last.pt every this many steps")
    device: str = Field("auto", description=DEVICE_HELP)
    amp: bool = Field(False, description="bf16 autocast on CUDA")
    workers: int = Field(0, ge=0, description="batch-collating worker processes")

    @model_validator(mode="before")
    @classmethod
    def _a_composed_class(cls, data: Any) -> Any:
        if cls is ClassifySection:  # without its encoders' options it is no run's settings
            raise TypeError("ClassifySection holds classification's own fields only: build settings with "
                            "train.models.classifier.classify_settings(...)")
        return data


class EvaluateSection(Section):
    """Options of the final evaluation of a pipeline's run."""

    split: Literal["val", "test"] = "test"
    protocols: list[Literal["1k", "5cv", "5k", "all"]] = Field(default_factory=lambda: ["all"])
    noise: str | None = None
    length_analysis: bool = False


class CompareSection(Section):
    """Options of ``train compare`` as a pipeline stage (:mod:`train.retrieval.compare`).

    ``data`` defaults to ``prep.out``, ``features`` to the ``features`` stage's store and ``regions`` to
    the ``regions`` stage's (a second feature stage, of kind ``regions``, for the region families).
    """

    path_fields: ClassVar[tuple[str, ...]] = ("data", "features", "regions", "out")
    #: family names (their defaults) or pipeline names of the same file; None: every registered family
    families: list[str] | None = Field(None, min_length=1)
    epochs: int | None = Field(None, ge=1)
    seed: int = 0
    seeds: int = Field(1, ge=1)
    noise: str = "0.05:0.25:0.05"
    device: str = "auto"
    data: str | None = None
    features: str | None = None
    regions: str | None = None
    out: str


def first_non_finite(settings: BaseModel) -> tuple[str, float] | None:
    """``(field, value)`` of the first float setting (or float in a list setting) that is NaN or infinite,
    or ``None``: the schema lets them through, no run can use them."""
    for key, value in settings.model_dump().items():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                return key, v
    return None
