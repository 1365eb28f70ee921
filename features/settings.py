"""The settings of ``features cnn|fne|regions`` (the ``features:`` and ``regions:`` sections of
``pipelines.yaml``): one place for their fields and defaults, read by the ``features`` stage
(:mod:`features.run`, :mod:`features.recipe`) and by the pipeline schema (:mod:`pipelines.schema`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from vsecore.schema import Section


class FeaturesSection(Section):
    """Options of ``features cnn|fne|regions``."""

    path_fields: ClassVar[tuple[str, ...]] = ("data", "out", "weights")
    kind: Literal["cnn", "fne", "regions"] = "cnn"
    data: str | None = None
    out: str
    cnn: str = "vgg19"
    weights: str = "imagenet"
    allow_download: bool = False
    crops: Literal[1, 10] = 10
    resize: int | None = None
    input_size: int | None = None
    batch_size: int = 32
    block_size: int = 256
    device: str = "auto"
    amp: bool = False
    scheduler: str = "none"
    workers: int = 2
    threads: int | None = None
    on_error: Literal["record", "fail"] = "record"
    threshold_low: float = -0.25
    threshold_high: float = 0.15
    # regions: grid (cells of the cnn's last feature map; cnn defaults to efficientnet_lite0 there) or
    # fasterrcnn (torchvision's fasterrcnn_resnet50_fpn, also accepted by that name), then the
    # bottom-up-attention selection rules of fasterrcnn; fixed_boxes K (null: min..max_boxes)
    detector: str = "grid"
    score_threshold: float = 0.2
    nms_threshold: float = 0.3
    min_boxes: int = 10
    max_boxes: int = 100
    fixed_boxes: int | None = 36
    # regions: how the rows are compressed (features.store_layout.ROW_CODECS)
    codec: Literal["zstd", "lz4"] = "zstd"
