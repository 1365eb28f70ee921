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
from vsecore.errors import UserError

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
    decoder: Literal["pil", "torchvision"] = Field("pil", description=(
        "pil (default): PIL decodes and resizes every image on the host; torchvision: JPEGs decoded and "
        "resized where the network runs (CUDA: nvjpeg on the GPU; CPU: libjpeg-turbo), other formats by PIL. "
        "The pixels differ, so the rows do: a store records its decoder and is resumed only with it"))


def crops_recipe(settings: Any) -> dict[str, Any]:
    """What the settings ask of the 10-crop mapper, as its store records it (sizes not given stay ``None``:
    the network's own, which the store records resolved; the decoder only when it is not PIL, as stores
    made before the option record none)."""
    decoder = {} if settings.decoder == "pil" else {"decoder": settings.decoder}
    return {"kind": settings.kind, "cnn": settings.cnn, "weights": settings.weights, "crops": settings.crops,
            "input_size": settings.input_size, "resize": settings.resize, "amp": settings.amp, **decoder}


def crops_record(settings: Any, mapper: Any, store: dict[str, Any]) -> dict[str, Any]:
    """The ``config`` of a 10-crop store: the settings, the weights' SHA-256 and the sizes the network
    resolved (its provenance), the decoder where it is not PIL (:func:`recorded_decoder`), then the store's
    own keys ``store``."""
    prov = mapper.provenance
    decoder = recorded_decoder(settings, mapper)
    return {"kind": settings.kind, "cnn": settings.cnn, "weights": settings.weights,
            "weights_sha256": prov.get("weights_sha256"), "crops": settings.crops,
            "input_size": prov.get("input_size", settings.input_size),
            "resize": prov.get("resize", settings.resize), "amp": settings.amp,
            **({"decoder": decoder} if decoder else {}), **store}


def recorded_decoder(settings: Any, mapper: Any) -> str | None:
    """The decoder a store records: ``None`` for PIL, else ``torchvision-cuda`` or ``torchvision-cpu`` (nvjpeg
    and libjpeg-turbo give other pixels): of ``--device``, or where ``auto`` took this run's mapper."""
    if settings.decoder == "pil":
        return None
    device = str(getattr(mapper, "device", "cpu")) if settings.device == "auto" else str(settings.device)
    return f"torchvision-{device.split(':')[0]}"


def check_crops(settings: Any) -> None:
    """``--input-size`` and ``--resize`` in range (:func:`features.extractors.images.check_sizes`); a
    ``--decoder torchvision`` on a cluster needs its device named (the driver cannot tell what ``auto`` gives
    a worker, and the store records the decoder of one device)."""
    check_sizes(settings.input_size, settings.resize)
    if settings.decoder != "pil" and settings.scheduler != "none" and settings.device == "auto":
        raise UserError("--decoder torchvision on a Dask cluster needs --device cpu or cuda (the decoder's "
                        "pixels depend on the device, and a store never mixes decoders)")


def crop_mapper(config: dict[str, Any], kind: str) -> Any:
    """The 10-crop mapper of ``config`` computing ``kind`` (``global`` or ``fne``)."""
    # the network's modules (torch, timm) load only when a mapper is built: --help and pipelines.yaml need
    # only the settings above
    from features.extractors.crop_mapper import ImageMapper

    return ImageMapper.from_config({**config, "kind": kind})


def build_cnn(config: dict[str, Any]) -> Any:
    """The mapper of a ``cnn`` store's config: the crop-averaged global feature."""
    return crop_mapper(config, "global")


#: batch sizes count whole images (a pass of N images is N x --crops crops)
BATCH_HELP = {"batch_size": "images per forward pass on CUDA, each --crops crops (default 32); on the "
                            "CPU every image's crops are a forward pass of their own and N images are mapped "
                            "between two progress updates (default 1)"}
#: what a resumed store made with another decoder is told
DECODER_HINT = {"decoder": "a store never mixes JPEG decoders: give the --decoder it was made with (none "
                           "recorded: pil), or --overwrite"}

EXTRACTOR = Extractor(
    name="cnn", kind="cnn", summary="10-crop averaged global CNN features -> 'global'",
    description="10-crop averaged global CNN features (CHAIN-VSE 2.3, OECC 2.2) -> 'global'.",
    config=CnnConfig, recipe=crops_recipe, build=build_cnn, keys=("global",), record=crops_record,
    check=check_crops, option_help=BATCH_HELP, hints=DECODER_HINT)
