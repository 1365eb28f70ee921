"""Grid regions: the cells of a CNN's last feature map are an image's regions.

``grid`` (:class:`GridRegionMapper`): the cells of a CNN's last feature map are the regions. The whole image
is resized to ``S x S`` (``S`` = the backbone's input size, 224 for EfficientNet-Lite0) **without keeping the
aspect ratio and without cropping**: one view, no 10-crop, because regions need one spatial layout and the
cells should tile the entire picture (a centre crop would drop what captions mention near the borders). The
``C x h x w`` map (EfficientNet-Lite0: ``1280 x 7 x 7`` after its head convolution, BN and ReLU6) gives
``k = h * w`` regions of ``D = C`` features in row-major order (cell ``(i, j)`` is region ``i * w + j``),
and each box is the cell's rectangle mapped back onto the original image:
``(j W / w, i H / h, (j + 1) W / w, (i + 1) H / h)``. Every region is real (``counts = k``). The feature
maps used: timm models' ``forward_features`` (after the head), VGG's ``features`` (pool5, ``512 x 7 x 7``),
torchvision ResNets' ``layer4`` (``2048 x 7 x 7``).

Determinism: on CPU every image goes through the network alone, so a row never depends on the other images
of a call (batching pads images to a common size, which changes features near the borders, and CPU kernels
round differently for other batch shapes). On CUDA, ``grid`` packs ``batch_size`` images per pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from features.extractors.backbones import Backbone, VGGFc7, load_backbone
from features.extractors.crops import normalization_table, normalize_pixels, rgb_pixels
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
from features.extractors.regions import REGION_DTYPES, empty_region_rows, region_outputs
from vsecore.device import autocast, resolve_device, uses_amp
from vsecore.errors import UserError


def feature_map(backbone: Backbone, x: torch.Tensor) -> torch.Tensor:
    """The backbone's last convolutional feature map: ``x (B, 3, S, S) -> (B, C, h, w)``.

    timm models: ``forward_features`` (after the head convolution where the model has one); VGG: ``features``
    (pool5); torchvision ResNets: ``layer4``.
    """
    import torchvision

    model = backbone.model
    if isinstance(model, VGGFc7):
        return model.features(x)
    if isinstance(model, torchvision.models.ResNet):
        x = model.maxpool(model.relu(model.bn1(model.conv1(x))))
        return model.layer4(model.layer3(model.layer2(model.layer1(x))))
    if hasattr(model, "forward_features"):
        return model.forward_features(x)
    raise UserError(f"backbone {backbone.name!r} has no feature map the grid regions can use")


def grid_boxes(h: int, w: int, width: int, height: int) -> np.ndarray:
    """Pixel rectangles ``(h * w, 4)`` float32 (``x1, y1, x2, y2``) of an ``h x w`` grid laid over a
    ``width x height`` image, row-major (cell ``(i, j)`` is row ``i * w + j``)."""
    xs = np.arange(w + 1, dtype=np.float64) * width / w
    ys = np.arange(h + 1, dtype=np.float64) * height / h
    x1, y1 = np.meshgrid(xs[:-1], ys[:-1])
    x2, y2 = np.meshgrid(xs[1:], ys[1:])
    return np.stack([x1, y1, x2, y2], axis=-1).reshape(h * w, 4).astype(np.float32)


class GridRegionMapper:
    """Images -> grid regions of a CNN's last feature map (see the module docstring).

    Args:
        backbone: from :func:`features.extractors.backbones.load_backbone` (its ``input_size`` is the side
            ``S`` the whole image is resized to).
        batch_size: images per forward pass on CUDA (on CPU one image per pass, see the module docstring;
            there the images of one call), :func:`features.extractors.mapper.pass_sizes`.
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
        amp: bfloat16 autocast on CUDA.
        threads: torch threads of every call (``None``: unchanged), see
            :func:`features.extractors.mapper.pinned_threads`.
    """

    detector = "grid"

    def __init__(self, backbone: Backbone, batch_size: int | None = None,
                 device: str | torch.device | None = "cpu", amp: bool = False,
                 threads: int | None = None) -> None:
        check_pass_options(batch_size, threads)
        self.threads = threads
        self.backbone = backbone
        self.batch_size = batch_size
        self.device = resolve_device(device)
        self.amp = uses_amp(self.device, amp)
        self.images_per_pass, self.images_per_call = pass_sizes(batch_size, self.device)
        self.model = place_model(backbone.model, self.device)
        self._table = normalization_table(backbone.mean, backbone.std, self.device)
        self._build_kw: dict[str, Any] = {}
        size = backbone.input_size
        with torch.inference_mode():
            c, h, w = feature_map(backbone, torch.zeros(1, 3, size, size, device=self.device)).shape[1:]
        self.grid = (int(h), int(w))
        self.outputs = region_outputs(int(h * w), int(c))

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GridRegionMapper:
        """Build from :attr:`config`'s plain dict (``cnn``, ``weights``, ``input_size``, ``batch_size``,
        ``device``, ``amp``, optional ``allow_download``, ``seed``), checked first
        (:func:`features.extractors.mapper.check_extractor_config`)."""
        check_extractor_config(config)
        backbone = load_backbone(config["cnn"], config.get("weights", "imagenet"),
                                 bool(config.get("allow_download", False)),
                                 input_size=config.get("input_size"), seed=int(config.get("seed", 0)))
        mapper = cls(backbone, batch_size=config.get("batch_size"),
                     device=config.get("device", "cpu"), amp=bool(config.get("amp", False)),
                     threads=config.get("threads"))
        mapper._build_kw = {"allow_download": bool(config.get("allow_download", False)),
                            "seed": int(config.get("seed", 0))}
        return mapper

    @property
    def config(self) -> dict[str, Any]:
        """Plain, JSON-able dict that :meth:`from_config` turns back into an equal mapper."""
        b = self.backbone
        return {"detector": "grid", "cnn": b.name, "weights": "none" if b.weights.startswith("none") else
                b.weights, "allow_download": self._build_kw.get("allow_download", False),
                "seed": self._build_kw.get("seed", 0), "input_size": b.input_size,
                "batch_size": self.batch_size, "device": str(self.device), "amp": self.amp,
                "threads": self.threads}

    @property
    def dtypes(self) -> dict[str, str]:
        """Numpy dtype name of each output (:data:`REGION_DTYPES`)."""
        return {name: REGION_DTYPES[name].name for name in self.outputs}

    @property
    def provenance(self) -> dict[str, Any]:
        """Network, weights checksum, the single resized view, grid and feature sizes."""
        import timm
        import torchvision

        b = self.backbone
        k, dim = self.outputs["regions"]
        return {
            "detector": "grid", "network": b.name, "weights": b.weights, "weights_file": b.weights_file,
            "weights_sha256": b.weights_sha256, "input_size": b.input_size,
            "view": f"whole image resized to {b.input_size}x{b.input_size} (aspect ratio not kept, no crop)",
            "interpolation": b.interpolation, "mean": list(b.mean), "std": list(b.std),
            "grid": list(self.grid), "k": k, "dim": dim,
            "features": "cells of the last feature map, row-major",
            "boxes": "cell rectangles in pixels of the loaded image, x1 y1 x2 y2",
            "outputs": {n: list(s) for n, s in self.outputs.items()}, "amp": self.amp,
            "torch": torch.__version__, "torchvision": torchvision.__version__, "timm": timm.__version__,
        }

    @property
    def recipe(self) -> tuple[Any, ...]:
        """How :meth:`prepare` resizes: ``("square", input_size, interpolation)``."""
        return ("square", self.backbone.input_size, self.backbone.interpolation)

    def prepare(self, img: Image.Image) -> PreparedImage:
        """The host's part (thread-safe; the extraction's decode threads call it): the image resized to the
        network's input, ``(size, size, 3)`` uint8 pixels (normalised on the device)."""
        b = self.backbone
        size = b.input_size
        resized = img.convert("RGB").resize((size, size), Image.Resampling[b.interpolation.upper()])
        return PreparedImage(rgb_pixels(resized), img.size, self.recipe)

    def __call__(self, images: list[Image.Image | PreparedImage]) -> dict[str, np.ndarray]:
        """RGB PIL images (or their :meth:`prepare`) -> ``{regions (B, k, D), boxes (B, k, 4), counts (B,),
        image_size (B, 2)}``."""
        with pinned_threads(self.threads):
            return self._map(images)

    def _map(self, images: list[Image.Image | PreparedImage]) -> dict[str, np.ndarray]:
        items = [prepared(self, img) for img in images]
        out = empty_region_rows(len(items), self.outputs)
        h, w = self.grid
        with torch.inference_mode():
            for start in range(0, len(items), self.images_per_pass):
                group = items[start : start + self.images_per_pass]
                pixels = torch.stack(pixels_to(self.device, [item.pixels for item in group]))
                x = device_input(normalize_pixels(pixels, self._table))
                with autocast(self.device, self.amp):
                    fmap = feature_map(self.backbone, x)
                # (B, C, h, w) -> (B, h * w, C): region i * w + j is cell (i, j)
                out["regions"][start : start + len(group)] = (
                    fmap.float().flatten(2).transpose(1, 2).cpu().numpy())
        for i, item in enumerate(items):
            out["boxes"][i] = grid_boxes(h, w, *item.size)
            out["counts"][i] = h * w
            out["image_size"][i] = item.size
        return out
