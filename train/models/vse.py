"""``train vse``: the VSE pipelines of the FNE paper (their settings, presets, spec, objective and classifier
encoder); the word-embedding + GRU network (UVS) is :mod:`train.models.uvs`, imported only when a model is
built.

Vilalta et al., "Studying the Impact of the Full-Network Embedding on Multimodal Pipelines", Semantic Web
2019. Settings of the FNE paper's table 1 (``Embed. dim.`` is ``d``, the GRU size; ``Word embed. dim.`` is
``word_dim``), for the phase-B presets:

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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from train.engine.settings import FamilyConfig
from train.models.family import ClassifierEncoder, Family, contrastive_objective
from train.models.spec import ModelSpec

if TYPE_CHECKING:
    from train.engine.objectives import Objective

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
    import train.models.uvs  # noqa: F401  start-up: registers uvs_gru (torch) for a model

    return ModelSpec("uvs_gru", {"d": settings.d, "word_dim": settings.word_dim}, text_input="words",
                     text_projection=False, absolute=settings.absolute)


def vse_objective(settings: Any) -> Objective:
    """The FNE paper's pipelines: PH and POE are curricula (sum, then max of hinges); the others the
    plain contrastive loss of their preset."""
    if settings.kind not in CURRICULA:
        return contrastive_objective(settings)
    from train.engine.objectives import CurriculumObjective  # start-up: torch only when a run trains

    return CurriculumObjective(settings.measure, settings.margin, settings.loss, settings.order_sqrt,
                               phases=(settings.loss, "max"), later_lr=settings.finetune_lr)


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
