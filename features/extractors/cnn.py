"""``features cnn``: 10-crop averaged global CNN features (CHAIN-VSE 2.3, OECC 2.2) -> ``global``.

The shorter side resized to 256 (or the network's own scale), crops of the network's input size from the
four corners and the centre plus their mirrors (or the centre crop alone), the global feature of each crop
averaged (:class:`features.extractors.crop_mapper.ImageMapper`, built only when a mapper is needed: the
settings below are read by ``features --help`` and ``pipelines.yaml`` without torch).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from features.extractors.images import check_sizes
from features.extractors.registry import Extractor, ExtractorConfig

#: what every 10-crop network option says (``fne`` adds the paper's choice)
CNN_HELP = ("network: vgg16, vgg19 (fc7, 4096), resnet152 (pooled 2048), inception_resnet_v2 (pooled 1536, "
            "299 px) or any timm model name (its pooled features); default vgg19")


class CnnConfig(ExtractorConfig):
    """The settings of the 10-crop CNN extractors (``cnn``; ``fne`` adds its thresholds)."""

    path_fields = ("weights",)
    cnn: str = Field("vgg19", description=CNN_HELP, json_schema_extra={"metavar": "NAME"})
    weights: str = Field("imagenet", json_schema_extra={"metavar": "imagenet|PATH|none"}, description=(
        "imagenet: from the local torchvision/timm caches (never downloaded unless --allow-download); "
        "PATH: a state dict file; none: random init, for tests"))
    crops: Literal[1, 10] = Field(10, description=(
        "10: four corners and centre plus mirrors, averaged (the papers); 1: centre crop"))
    resize: int | None = Field(None, json_schema_extra={"metavar": "PX"}, description=(
        "shorter side before cropping (default: the network's own, 256 for 224 px nets)"))
    input_size: int | None = Field(None, json_schema_extra={"metavar": "PX"},
                                   description="crop size (default: the network's input size)")


def crops_recipe(settings: Any) -> dict[str, Any]:
    """What the settings ask of the 10-crop mapper, as its store records it (sizes not given stay ``None``:
    the network's own, which the store records resolved)."""
    return {"kind": settings.kind, "cnn": settings.cnn, "weights": settings.weights, "crops": settings.crops,
            "input_size": settings.input_size, "resize": settings.resize, "amp": settings.amp}


def crops_record(settings: Any, mapper: Any, store: dict[str, Any]) -> dict[str, Any]:
    """The ``config`` of a 10-crop store: the settings, the weights' SHA-256 and the sizes the network
    resolved (its provenance), then the store's own keys ``store``."""
    prov = mapper.provenance
    return {"kind": settings.kind, "cnn": settings.cnn, "weights": settings.weights,
            "weights_sha256": prov.get("weights_sha256"), "crops": settings.crops,
            "input_size": prov.get("input_size", settings.input_size),
            "resize": prov.get("resize", settings.resize), "amp": settings.amp, **store}


def check_crops(settings: Any) -> None:
    """``--input-size`` and ``--resize`` in range (:func:`features.extractors.images.check_sizes`)."""
    check_sizes(settings.input_size, settings.resize)


def crop_mapper(config: dict[str, Any], kind: str) -> Any:
    """The 10-crop mapper of ``config`` computing ``kind`` (``global`` or ``fne``)."""
    # the network's modules (torch, timm) load only when a mapper is built: --help and pipelines.yaml need
    # only the settings above
    from features.extractors.crop_mapper import ImageMapper

    return ImageMapper.from_config({**config, "kind": kind})


def build_cnn(config: dict[str, Any]) -> Any:
    """The mapper of a ``cnn`` store's config: the crop-averaged global feature."""
    return crop_mapper(config, "global")


#: batch sizes count whole images, each ``--crops`` forward passes
BATCH_HELP = {"batch_size": "images per forward pass (each is --crops crops); default 32"}

EXTRACTOR = Extractor(
    name="cnn", kind="cnn", summary="10-crop averaged global CNN features -> 'global'",
    description="10-crop averaged global CNN features (CHAIN-VSE 2.3, OECC 2.2) -> 'global'.",
    config=CnnConfig, recipe=crops_recipe, build=build_cnn, keys=("global",), record=crops_record,
    check=check_crops, option_help=BATCH_HELP)
