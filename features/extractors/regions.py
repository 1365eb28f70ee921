"""Region features: images -> ``k`` region vectors (and their boxes) per image, for CLMR/LIWE.

Two region extractors (``grid``, :mod:`features.extractors.grid`; ``fasterrcnn``,
:mod:`features.extractors.detector`) whose mappers have the shape of API of
:class:`features.extractors.crop_mapper.ImageMapper` (``outputs``,
``provenance``, ``config``, ``from_config``, ``__call__(images) -> dict[name, np.ndarray]``), except that a
row is not a vector: ``outputs`` maps each array name to the shape of ONE image's entry,

====================  ===========  =========  =====================================================
name                  row shape    dtype      meaning
====================  ===========  =========  =====================================================
``regions``           ``(k, D)``   float32    region features; rows ``count..k-1`` are zero padding
``boxes``             ``(k, 4)``   float32    ``x1, y1, x2, y2`` in pixels of the image as loaded
                                              (the BUTD TSV convention); padding rows are zero
``counts``            ``()``       int32      real regions of the image (``<= k``)
``image_size``        ``(2,)``     int32      ``width, height`` of the image as loaded
====================  ===========  =========  =====================================================

and ``mapper(images)`` returns ``{name: (len(images), *row_shape)}``. Images that cannot be decoded never
reach a mapper: :func:`features.executors.extract.read_block` turns them into failure records, exactly as for
``cnn``.

This module holds what they share, without torch (their settings are read by ``features --help`` and
``pipelines.yaml``): the per-image row shapes, the bottom-up-attention selection rules' numbers, the
settings of the ``regions`` kind (:class:`RegionConfig`) and the store record of a region mapper.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from features.extractors.images import check_sizes
from features.extractors.registry import SPEED_KEYS, ExtractorConfig
from features.store.codecs import ROW_CODECS

#: the one Faster R-CNN network supported, and its torchvision COCO weights (``--weights coco``)
FASTERRCNN_NETWORK = "fasterrcnn_resnet50_fpn"
#: bottom-up-attention selection rules (Anderson et al. 2018, ``generate_tsv.py``)
SCORE_THRESHOLD = 0.2
NMS_IOU = 0.3
DEFAULT_BOXES = 36
ADAPTIVE_BOXES = (10, 100)
#: the data type of each array of a region store (``features regions``, region imports)
REGION_DTYPES: dict[str, np.dtype] = {
    "regions": np.dtype(np.float32), "boxes": np.dtype(np.float32),
    "counts": np.dtype(np.int32), "image_size": np.dtype(np.int32),
}


def region_outputs(k: int, dim: int) -> dict[str, tuple[int, ...]]:
    """Per-image shapes of the region arrays: ``regions (k, D)``, ``boxes (k, 4)``, ``counts ()``,
    ``image_size (2,)``."""
    return {"regions": (k, dim), "boxes": (k, 4), "counts": (), "image_size": (2,)}


def empty_region_rows(n: int, outputs: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Zero-filled ``{name: (n, *shape)}`` arrays of the region outputs, in their dtypes."""
    return {name: np.zeros((n, *shape), dtype=REGION_DTYPES[name]) for name, shape in outputs.items()}


class RegionConfig(ExtractorConfig):
    """The settings of the ``regions`` kind that every region extractor reads: which one, and how the rows
    are compressed."""

    detector: str = Field("grid", json_schema_extra={"metavar": "grid|fasterrcnn"}, description=(
        "grid (default): the cells of --cnn's last feature map are the regions (EfficientNet-Lite0: 7x7 = 49 "
        "regions of 1280, real weights offline); fasterrcnn: torchvision's fasterrcnn_resnet50_fpn, "
        "bottom-up-attention selection of its RPN boxes, 1024-d RoI-pooled box-head features"))
    codec: Literal[ROW_CODECS] = Field("zstd", description=(  # type: ignore[valid-type]  # the one list
        "compression of the region rows: zstd (default, the smallest files) or lz4 (Blosc LZ4HC, byte "
        "shuffle: about 2.6x faster to decompress while training, about 1.3x the bytes); `features "
        "recompress` converts a finished store"))


def region_record(settings: Any, mapper: Any, store: dict[str, Any]) -> dict[str, Any]:
    """The ``config`` of a region store: what the mapper describes itself by (its ``config`` without the speed
    keys), ``amp`` as asked (on a cluster the driver's CPU copy has it off while CUDA workers use it), the
    weights' SHA-256, then the store's own keys ``store``."""
    described = {k: v for k, v in getattr(mapper, "config", {}).items() if k not in SPEED_KEYS}
    return {**described, "kind": settings.kind, "amp": settings.amp,
            "weights_sha256": mapper.provenance.get("weights_sha256"), **store}


def check_regions(settings: Any) -> None:
    """``--input-size`` in range (a region mapper takes no ``--resize``)."""
    check_sizes(settings.input_size, None)
