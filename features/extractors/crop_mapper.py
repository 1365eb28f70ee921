"""The 10-crop mapper of ``features cnn`` and ``features fne``: a list of images in, a block of feature rows
out.

``ImageMapper(backbone, kind="global"|"fne", crops=10|1, batch_size, device, amp)`` builds each image's
crops (:mod:`features.extractors.crops`: the host resizes it and sends its 8-bit pixels; the device normalises
them and cuts the crops), runs the network over the crops in batches of ``batch_size`` crops under
``torch.inference_mode()``, and averages each image's crop features after the layer's non-linearity
(fc7's ReLU for VGG; every activation for the FNE, :mod:`features.extractors.full_network`). The
executor outside (in-process or a Dask worker) builds it once from a plain config
(:meth:`ImageMapper.from_config`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from features.extractors.backbones import Backbone, load_backbone
from features.extractors.crops import normalization_table, pixel_crops, resized_pixels
from features.extractors.full_network import FullNetworkRecorder
from features.extractors.mapper import (
    PreparedImage,
    check_extractor_config,
    check_pass_options,
    pinned_threads,
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
    image's crops run as their own forward passes (chunks of at most ``batch_size`` crops). Changing
    ``batch_size`` below the crop count can change rows in the last bits (different kernel shapes). On CUDA
    whole images are packed into batches of about ``batch_size`` crops, and rows may differ in the last bits
    with the grouping. CPU kernels also sum in an order that depends on torch's intra-op thread count, so
    ``threads`` (when given) is set for every call and restored after it: mappers with equal ``threads``
    give bit-identical rows in any process (the driver, or a Dask worker whose environment says 1).
    """

    def __init__(
        self,
        backbone: Backbone,
        kind: str = "global",
        crops: int = 10,
        batch_size: int = 32,
        device: str | torch.device | None = "cpu",
        amp: bool = False,
        threads: int | None = None,
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
        # CPU kernels round differently for different batch shapes (VGG: up to 3e-7), so on CPU each image's
        # crops go through alone and a row never depends on the other images of a call; on CUDA whole
        # images are packed into batches of up to batch_size crops for throughput.
        self.images_per_pass = max(1, batch_size // crops) if self.device.type == "cuda" else 1
        self.amp = uses_amp(self.device, amp)
        self.model = backbone.model.to(self.device).eval()
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
            batch_size=int(config.get("batch_size", 32)),
            device=config.get("device", "cpu"),
            amp=bool(config.get("amp", False)),
            threads=config.get("threads"),
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
        """(n, 3, S, S) crops -> (n, width) float32 features."""
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

    def __call__(self, images: list[Image.Image | PreparedImage]) -> dict[str, np.ndarray]:
        """``images`` (RGB PIL images, see :func:`features.extractors.images.load_image`, or their
        :meth:`prepare`) -> ``{name: (len(images), width) float32}``, each row the mean over the image's
        crops."""
        with pinned_threads(self.threads):
            return self._map(images)

    def _map(self, images: list[Image.Image | PreparedImage]) -> dict[str, np.ndarray]:
        (name, width), = self.outputs.items()
        out = np.empty((len(images), width), dtype=np.float32)
        b = self.backbone
        with torch.inference_mode():
            for start in range(0, len(images), self.images_per_pass):
                group = images[start : start + self.images_per_pass]
                # the host resizes (prepare); the 8-bit pixels (0.26 MB for a 341 x 256 image, against 6.0 MB
                # of ten float32 crops) go to the device, which normalises them and cuts the crops
                pixels = [prepared(self, img).pixels.to(self.device, non_blocking=True) for img in group]
                crops = torch.cat([pixel_crops(p, self._table, b.input_size, self.crops) for p in pixels])
                feats = []
                for c0 in range(0, crops.shape[0], self.batch_size):
                    feats.append(self._forward(crops[c0 : c0 + self.batch_size]))
                per_crop = torch.cat(feats).view(len(group), self.crops, width)
                out[start : start + len(group)] = per_crop.mean(dim=1).cpu().numpy()
        return {name: out}
