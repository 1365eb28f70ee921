"""``features regions --detector grid``: the cells of a CNN's last feature map are an image's regions.

The whole image resized to the network's input, one view (:class:`features.extractors.grid_mapper.
GridRegionMapper`, built only when a mapper is needed); EfficientNet-Lite0 by default, whose ImageNet
weights install offline and whose 7 x 7 x 1280 last feature map gives 49 regions.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from features.extractors.regions import RegionConfig, check_regions, region_record
from features.extractors.registry import Extractor

#: the network of ``features regions --detector grid`` when no --cnn is given: its ImageNet weights install
#: offline (see README), and its 7 x 7 x 1280 last feature map gives 49 regions
GRID_CNN = "efficientnet_lite0"


class GridConfig(RegionConfig):
    """The network whose feature map is cut, its weights, and the side the image is resized to.

    ``cnn`` and ``weights`` are the stage's settings of those names (``features cnn`` defaults them to vgg19
    and imagenet, so their defaults are those): grid reads ``cnn`` only when it is given, else
    :data:`GRID_CNN`.
    """

    path_fields = ("weights",)
    cnn: str = Field("vgg19", json_schema_extra={"metavar": "NAME"}, description=(
        f"grid: the network whose last feature map is cut into regions (default {GRID_CNN}; vgg16/vgg19: "
        "pool5 512 x 7x7; resnet152: layer4 2048 x 7x7; any timm model name)"))
    weights: str = Field("imagenet", json_schema_extra={"metavar": "imagenet|PATH|none"}, description=(
        "grid: imagenet (default, from the local caches); PATH: a state dict file; none: seeded random init, "
        "for tests"))
    input_size: int | None = Field(None, json_schema_extra={"metavar": "PX"}, description=(
        "grid: the side the whole image is resized to (default: the network's input size)"))


def grid_recipe(settings: Any) -> dict[str, Any]:
    """The network (``--cnn``, default :data:`GRID_CNN`), its weights and the view's side."""
    cnn = settings.cnn if "cnn" in settings.model_fields_set else GRID_CNN
    return {"kind": settings.kind, "detector": "grid", "amp": settings.amp, "cnn": cnn,
            "weights": settings.weights, "input_size": settings.input_size}


def build_grid(config: dict[str, Any]) -> Any:
    """The grid mapper of a region store's config."""
    # the network's modules (torch, timm) load only when a mapper is built: --help and pipelines.yaml need
    # only the settings above
    from features.extractors.grid_mapper import GridRegionMapper

    return GridRegionMapper.from_config(config)


EXTRACTOR = Extractor(
    name="grid", kind="regions", summary="region features -> regions (N, k, D), boxes (N, k, 4), counts (N,)",
    description="Region features for CLMR/LIWE: k regions of D features per image (zero rows after an "
                "image's real regions), their boxes in pixels, their count, and the image size.",
    config=GridConfig, recipe=grid_recipe, build=build_grid, keys=("regions",), selector="detector",
    record=region_record, check=check_regions, queryable=False,
    option_help={"batch_size": "images per forward pass on CUDA (default 32); on the CPU every image runs "
                               "alone and N images are mapped between two progress updates (default 1)"})
