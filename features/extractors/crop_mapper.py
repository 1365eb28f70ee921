"""The 10-crop mapper of ``features cnn`` and ``features fne``: a list of images in, a block of feature rows
out.

``ImageMapper(backbone, kind="global"|"fne", crops=10|1, batch_size, device, amp, decoder)`` builds each
image's crops (:mod:`features.extractors.crops`: the host resizes it and sends its 8-bit pixels; the device
normalises them and cuts the crops; with ``decoder="torchvision"`` the device decodes and resizes JPEGs
itself, :mod:`features.extractors.decode`), runs the network over the crops under
``torch.inference_mode()``, and averages each image's crop features after the layer's non-linearity
(fc7's ReLU for VGG; every activation for the FNE, :mod:`features.extractors.full_network`). ``batch_size``
counts images (:func:`features.extractors.mapper.pass_sizes`). The executor outside (in-process or a Dask
worker) builds it once from a plain config (:meth:`ImageMapper.from_config`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from features.executors.block import MAPPER_FAILURES
from features.extractors.backbones import Backbone, load_backbone
from features.extractors.crops import normalization_table, pixel_crops, resized_pixels
from features.extractors.decode import (
    DECODERS,
    DEVICE_INTERPOLATION,
    EncodedImage,
    decode_jpegs,
    device_decoder,
    read_encoded,
    resize_on_device,
)
from features.extractors.full_network import FullNetworkRecorder
from features.extractors.images import ImageError, load_image
from features.extractors.mapper import (
    PreparedImage,
    check_extractor_config,
    check_pass_options,
    device_input,
    pass_sizes,
    pinned_threads,
    pixels_to,
    place_model,
    prepared,
)
from vsecore.device import autocast, resolve_device, uses_amp
from vsecore.errors import UserError

KINDS = ("global", "fne")


class ImageMapper:
    """Images -> averaged crop features, float32.

    ``outputs`` maps array names to widths (``{"global": 4096}`` or ``{"fne/raw": 12416}``);
    ``mapper(images)`` returns ``{name: np.ndarray (len(images), width) float32}`` in the images' order.

    Determinism: on CPU the same image gives a bit-identical row whatever other images share the call: each
    image's crops run as one forward pass of their own (``batch_size`` is then the images of one call). On
    CUDA ``batch_size`` whole images (``crops`` each) make one pass, in ``channels_last`` with cuDNN's
    benchmark mode, and rows may differ in the last bits with the grouping. CPU kernels also sum in an order
    that depends on torch's intra-op thread count, so ``threads`` (when given) is set for every call and
    restored after it: mappers with equal ``threads`` give bit-identical rows in any process (the driver, or a
    Dask worker whose environment says 1). ``decoder``: ``pil`` (the host decodes and resizes) or
    ``torchvision`` (JPEGs decoded and resized on ``device``; other pixels, so other rows).
    """

    def __init__(
        self,
        backbone: Backbone,
        kind: str = "global",
        crops: int = 10,
        batch_size: int | None = None,
        device: str | torch.device | None = "cpu",
        amp: bool = False,
        threads: int | None = None,
        decoder: str = "pil",
    ) -> None:
        if kind not in KINDS:
            raise UserError(f"unknown feature kind {kind!r}: use one of {', '.join(KINDS)}")
        if crops not in (1, 10):
            raise UserError(f"--crops must be 1 or 10, not {crops}")
        check_pass_options(batch_size, threads)
        self.threads = threads
        self.backbone = backbone
        self.kind = kind
        self.crops = crops
        self.batch_size = batch_size
        self.device = resolve_device(device)
        self.decoder = check_decoder(decoder, backbone)
        self.images_per_pass, self.images_per_call = pass_sizes(batch_size, self.device)
        self.amp = uses_amp(self.device, amp)
        self.model = place_model(backbone.model, self.device)
        self._table = normalization_table(backbone.mean, backbone.std, self.device)
        self._build_kw: dict[str, Any] = {}
        self._layers = self._probe_layers()
        width = sum(w for _, w in self._layers) if kind == "fne" else backbone.global_dim
        self.outputs: dict[str, int] = {"global" if kind == "global" else "fne/raw": int(width)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ImageMapper:
        """Build from :attr:`config`'s plain dict (``cnn``, ``weights``, ``kind``, ``crops``,
        ``batch_size``, ``device``, ``amp``, optional ``allow_download``, ``input_size``, ``resize``,
        ``seed``, ``threads``), e.g. once per Dask worker. A configuration read from a file (a model
        folder's record of its store) is checked first (:func:`check_extractor_config`)."""
        check_extractor_config(config)
        backbone = load_backbone(
            config["cnn"],
            config.get("weights", "imagenet"),
            bool(config.get("allow_download", False)),
            input_size=config.get("input_size"),
            resize=config.get("resize"),
            seed=int(config.get("seed", 0)),
        )
        mapper = cls(
            backbone,
            kind=config.get("kind", "global"),
            crops=int(config.get("crops", 10)),
            batch_size=config.get("batch_size"),
            device=config.get("device", "cpu"),
            amp=bool(config.get("amp", False)),
            threads=config.get("threads"),
            decoder=str(config.get("decoder") or "pil"),
        )
        mapper._build_kw = {
            "allow_download": bool(config.get("allow_download", False)),
            "seed": int(config.get("seed", 0)),
        }
        return mapper

    @property
    def config(self) -> dict[str, Any]:
        """Plain, JSON-able dict that :meth:`from_config` turns back into an equal mapper."""
        b = self.backbone
        weights = "none" if b.weights.startswith("none") else b.weights
        return {
            "cnn": b.name,
            "weights": weights,
            "allow_download": self._build_kw.get("allow_download", False),
            "seed": self._build_kw.get("seed", 0),
            "kind": self.kind,
            "crops": self.crops,
            "batch_size": self.batch_size,
            "device": str(self.device),
            "amp": self.amp,
            "input_size": b.input_size,
            "resize": b.resize,
            "threads": self.threads,
            "decoder": self.decoder,
        }

    @property
    def provenance(self) -> dict[str, Any]:
        """What produced the rows: network, weights checksum, crops, sizes, normalisation, layers."""
        import timm
        import torchvision

        b = self.backbone
        return {
            "network": b.name,
            "weights": b.weights,
            "weights_file": b.weights_file,
            "weights_sha256": b.weights_sha256,
            "kind": self.kind,
            "crops": self.crops,
            "crop_positions": "4 corners + centre, then their mirrors" if self.crops == 10 else "centre",
            "input_size": b.input_size,
            "resize": b.resize,
            "interpolation": b.interpolation,
            "mean": list(b.mean),
            "std": list(b.std),
            "outputs": dict(self.outputs),
            "layers": [{"name": n, "width": w} for n, w in self._layers],
            "amp": self.amp,
            "decoder": device_decoder(self.decoder, self.device) or "pil",
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "timm": timm.__version__,
        }

    def _probe_layers(self) -> list[tuple[str, int]]:
        """Layer names and widths from one forward pass of a zero image."""
        x = torch.zeros(1, 3, self.backbone.input_size, self.backbone.input_size, device=self.device)
        if self.kind == "global":
            return [("global", self.backbone.global_dim)]
        with torch.inference_mode(), FullNetworkRecorder(self.model) as rec:
            self.model(x)
            _, layers = rec.take()
        return layers

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """(n, 3, S, S) crops -> (n, width) features, float32 (on the mapper's device)."""
        x = device_input(x)
        with autocast(self.device, self.amp):
            if self.kind == "global":
                return self.model(x).float()
            with FullNetworkRecorder(self.model) as rec:
                self.model(x)
                out, _ = rec.take()
            return out.float()

    @property
    def resize(self) -> int:
        """The shorter side images are resized to before cropping (it bounds an image's work when loaded)."""
        return int(self.backbone.resize)

    @property
    def recipe(self) -> tuple[Any, ...]:
        """How :meth:`prepare` resizes: ``("shorter side", resize, interpolation)``."""
        return ("shorter side", self.backbone.resize, self.backbone.interpolation)

    def prepare(self, img: Image.Image) -> PreparedImage:
        """The host's part of ``img``'s crops (thread-safe; the extraction's decode threads call it): its
        shorter side resized, as 8-bit pixels (:func:`features.extractors.crops.resized_pixels`)."""
        b = self.backbone
        return PreparedImage(resized_pixels(img, b.resize, b.interpolation), img.size, self.recipe)

    def load(self, path: str, resize: int | None = None) -> PreparedImage | EncodedImage:
        """An image file as the decode threads read it (thread-safe): with the PIL decoder decoded and
        prepared (:meth:`prepare`); with ``torchvision`` a JPEG's checked bytes, decoded later on the device
        (:func:`features.extractors.decode.read_encoded`; another format by PIL). Raises
        :class:`~features.extractors.images.ImageError` for an unusable file."""
        if self.decoder != "pil":
            encoded = read_encoded(path, resize=resize)
            if encoded is not None:
                return encoded
        return self.prepare(load_image(path, resize=resize))

    def __call__(self, images: list[Image.Image | PreparedImage | EncodedImage]) -> dict[str, Any]:
        """``images`` (RGB PIL images, see :func:`features.extractors.images.load_image`, their
        :meth:`prepare` or :meth:`load`) -> ``{name: (len(images), width) float32}``, each row the mean over
        the image's crops; images that turn out unusable (a JPEG no decoder reads) are listed under
        :data:`~features.executors.block.MAPPER_FAILURES`, their rows NaN."""
        with pinned_threads(self.threads):
            return self._map(images)

    def _map(self, images: list[Image.Image | PreparedImage | EncodedImage]) -> dict[str, Any]:
        (name, width), = self.outputs.items()
        b = self.backbone
        rows, failed = [], []
        with torch.inference_mode():
            for start in range(0, len(images), self.images_per_pass):
                pixels, bad = self._pixels(images[start : start + self.images_per_pass])
                failed += [(start + k, reason) for k, reason in bad]
                if not pixels:
                    continue
                crops = torch.cat([pixel_crops(p, self._table, b.input_size, self.crops) for p in pixels])
                per_crop = self._forward(crops).view(len(pixels), self.crops, width)
                rows.append(per_crop.mean(dim=1))
            # one copy back (and one wait for the device) per call, not per pass
            out = torch.cat(rows).cpu().numpy() if rows else np.empty((0, width), np.float32)
        result: dict[str, Any] = {name: out}
        if failed:
            result[name] = out = np.insert(out, [k - i for i, (k, _) in enumerate(failed)], np.nan, axis=0)
            result[MAPPER_FAILURES] = failed
        return result

    def _pixels(self, group: list[Any]) -> tuple[list[torch.Tensor], list[tuple[int, str]]]:
        """A pass's images -> their resized 8-bit pixels ``(H, W, 3)`` on the device (the host's sent in one
        copy, JPEGs decoded there in one call) and the images no decoder could use ``[(index, reason)]``."""
        items: list[Any] = [g if isinstance(g, EncodedImage) else prepared(self, g).pixels for g in group]
        host = [k for k, item in enumerate(items) if not isinstance(item, EncodedImage)]
        for k, on_device in zip(host, pixels_to(self.device, [items[k] for k in host]), strict=True):
            items[k] = on_device
        encoded = [k for k, item in enumerate(items) if isinstance(item, EncodedImage)]
        decoded = decode_jpegs([items[k] for k in encoded], self.device) if encoded else []
        bad = []
        b = self.backbone
        for k, image in zip(encoded, decoded, strict=True):
            if image is not None:
                items[k] = resize_on_device(image, b.resize, b.interpolation)
                continue
            try:  # a JPEG the device decoder refuses (CMYK, arithmetic coding): PIL, as with --decoder pil
                items[k] = self.prepare(load_image(items[k].path, resize=b.resize)).pixels.to(self.device)
            except ImageError as exc:
                bad.append((k, str(exc.reason)))
        return [items[k] for k in range(len(items)) if k not in {i for i, _ in bad}], bad


def check_decoder(decoder: str, backbone: Backbone) -> str:
    """``decoder`` (``pil``, ``torchvision``, or a store's record of it: ``torchvision-cuda|cpu``) as the
    mapper runs it: ``pil`` or ``torchvision`` (a one-line error for another, or for a network whose resize
    the device cannot do)."""
    name = "torchvision" if str(decoder).startswith("torchvision") else str(decoder)
    if name not in DECODERS:
        raise UserError(f"--decoder {decoder!r}: use one of {', '.join(DECODERS)}")
    if name != "pil" and backbone.interpolation not in DEVICE_INTERPOLATION:
        raise UserError(f"--decoder {decoder}: {backbone.name} resizes with {backbone.interpolation}, which "
                        "the device resize does not have (use --decoder pil)")
    return name
