"""``features regions --detector fasterrcnn``: the bottom-up-attention selection of torchvision's Faster
R-CNN boxes (:class:`features.extractors.detector_mapper.DetectorRegionMapper`, built only when a mapper is
needed), ``K = 36`` regions of 1,024 box-head features by default."""

from __future__ import annotations

import importlib.util
from collections.abc import Collection
from typing import Any

from pydantic import Field

from features.extractors.regions import (
    ADAPTIVE_BOXES,
    DEFAULT_BOXES,
    FASTERRCNN_NETWORK,
    NMS_IOU,
    SCORE_THRESHOLD,
    RegionConfig,
    check_regions,
    region_record,
)
from features.extractors.registry import Extractor
from vsecore.errors import UserError


class DetectorConfig(RegionConfig):
    """The detector's weights and scale, and the selection rules.

    ``weights`` is the stage's setting of that name, whose default (imagenet) means the detector's own COCO
    weights here.
    """

    path_fields = ("weights",)
    weights: str = Field("imagenet", json_schema_extra={"metavar": "coco|PATH|none"}, description=(
        "fasterrcnn: coco (default: the torchvision COCO checkpoint from the local torch cache); PATH: a "
        "state dict file; none: seeded random init, for tests"))
    input_size: int | None = Field(None, json_schema_extra={"metavar": "PX"}, description=(
        "fasterrcnn: the shorter side the detector sees (default 800, longer side at most 1333/800 of it)"))
    fixed_boxes: int | None = Field(DEFAULT_BOXES, json_schema_extra={"metavar": "K", "option": "--boxes"},
                                    description=f"fasterrcnn: exactly K regions per image (default "
                                                f"{DEFAULT_BOXES}, BUTD's fixed K)")
    min_boxes: int = Field(ADAPTIVE_BOXES[0], json_schema_extra={"metavar": "N"}, description=(
        f"fasterrcnn: adaptive regions, at least N (BUTD: {ADAPTIVE_BOXES[0]}); given without --boxes, the "
        "count is adaptive"))
    max_boxes: int = Field(ADAPTIVE_BOXES[1], json_schema_extra={"metavar": "N"}, description=(
        f"fasterrcnn: adaptive regions, at most N (BUTD: {ADAPTIVE_BOXES[1]}; the store's k)"))
    score_threshold: float = Field(SCORE_THRESHOLD, json_schema_extra={"metavar": "X"}, description=(
        f"fasterrcnn: keep boxes whose best class probability is at least X (default {SCORE_THRESHOLD})"))
    nms_threshold: float = Field(NMS_IOU, json_schema_extra={"metavar": "IOU"},
                                 description=f"fasterrcnn: class-agnostic NMS IoU (default {NMS_IOU})")


def detector_recipe(settings: Any) -> dict[str, Any]:
    """Weights ``coco`` (``imagenet``, the stage's default, means the detector's own COCO weights), a file or
    ``none``; ``--input-size`` the shorter side the detector sees (default 800, the longer capped at
    1333 / 800 of it); ``fixed_boxes`` K gives exactly K regions (``min_boxes = max_boxes = K``), ``null``
    the adaptive ``min_boxes..max_boxes``; the selection's ``score_threshold`` and ``nms_threshold``."""
    if "cnn" in settings.model_fields_set:
        raise UserError(f"--cnn {settings.cnn}: the network of --detector fasterrcnn is "
                        f"{FASTERRCNN_NETWORK}; --cnn chooses the network of --detector grid")
    low, high = ((settings.fixed_boxes, settings.fixed_boxes) if settings.fixed_boxes
                 else (settings.min_boxes, settings.max_boxes))
    weights = "coco" if settings.weights == "imagenet" else settings.weights
    scale = {} if settings.input_size is None else {
        "min_size": settings.input_size, "max_size": round(settings.input_size * 1333 / 800)}
    return {"kind": settings.kind, "detector": "fasterrcnn", "amp": settings.amp, **scale, "weights": weights,
            "min_boxes": low, "max_boxes": high, "score_threshold": settings.score_threshold,
            "nms_iou": settings.nms_threshold}


def adaptive_when_bounded(settings: Any, given: Collection[str]) -> dict[str, Any]:
    """``--min-boxes`` or ``--max-boxes`` given without ``--boxes`` ask for an adaptive count."""
    if "fixed_boxes" not in given and {"min_boxes", "max_boxes"} & set(given):
        return {"fixed_boxes": None}
    return {}


def explain_detectron2(value: str) -> str | None:
    """``detectron2`` is no detector here: the way round it."""
    if value != "detectron2":
        return None
    state = "is not a backend here" if importlib.util.find_spec("detectron2") else "is not installed"
    return (f"--detector detectron2: detectron2 {state}; use --detector fasterrcnn or grid, or run a "
            "detectron2 bottom-up-attention extractor and import its TSV with --format butd-tsv")


def build_detector(config: dict[str, Any]) -> Any:
    """The Faster R-CNN mapper of a region store's config."""
    # torchvision's detection modules load only when a mapper is built: --help and pipelines.yaml need only
    # the settings above
    from features.extractors.detector_mapper import DetectorRegionMapper

    return DetectorRegionMapper.from_config(config)


EXTRACTOR = Extractor(
    name="fasterrcnn", kind="regions", summary="region features of Faster R-CNN boxes",
    description="Region features of torchvision's Faster R-CNN with the bottom-up-attention selection.",
    config=DetectorConfig, recipe=detector_recipe, build=build_detector, keys=("regions",),
    selector="detector", aliases=(FASTERRCNN_NETWORK,), record=region_record, check=check_regions,
    command_line=adaptive_when_bounded, explain=explain_detectron2, queryable=False)
