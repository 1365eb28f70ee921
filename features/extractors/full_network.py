"""The Full-Network Embedding (Garcia-Gasulla et al.; FNE paper section 3.1): which activations it takes.
Their statistics over the train split and the ternary code are the store's (:mod:`features.store.ternary`).

Layers. The paper takes the spatial average of every convolutional layer's feature maps plus the fully
connected layers, each after its non-linearity (VGG16: 13 conv + fc6 + fc7 = 12,416 features). For any
network we read "every layer's output after its non-linearity" as **every call of an activation module**
(ReLU, ReLU6, SiLU, GELU, ... see :data:`ACTIVATIONS`) in the forward pass that produces the global feature,
in call order: 4-D outputs (B, C, H, W) are spatially averaged to C features, 2-D outputs (B, C) taken as
they are. A module called several times (torchvision's shared ``relu`` in a ResNet bottleneck) gives one
entry per call. Gates (sigmoid) and functional activations are not counted. Dimensions this gives:

- ``vgg16``: 12,416 (64*2 + 128*2 + 256*3 + 512*3 + 512*3 + 4,096 + 4,096), exactly the paper's.
- ``vgg19``: 13,696 (16 conv + fc6 + fc7).
- ``resnet152`` (torchvision): 71,872 (stem 64; per bottleneck its two inner ReLUs and its output).
- ``inception_resnet_v2`` (timm): 73,952 from 243 activation calls (every BasicConv2d's ReLU, inside the
  Inception branches too, and each residual block's output ReLU).
- ``efficientnet_lite0`` (timm): 19,200 from 33 ReLU6 calls.

The width for any network is reported by ``ImageMapper.outputs`` and the layer list by its provenance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: Module types counted as a layer's non-linearity (timm's own activation classes subclass or wrap these,
#: and are added by name below so that importing timm is not needed here).
ACTIVATIONS: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.SiLU, nn.GELU, nn.Hardswish, nn.Mish, nn.LeakyReLU, nn.ELU, nn.PReLU, nn.SELU,
    nn.CELU, nn.Softplus,
)
_ACTIVATION_NAMES = {
    "Swish", "HardSwish", "HardSwishMe", "SwishMe", "Mish", "MishMe", "GELUTanh", "QuickGELU",
}

def is_activation(module: nn.Module) -> bool:
    """True for the non-linearity modules whose outputs make up the Full-Network Embedding."""
    return isinstance(module, ACTIVATIONS) or type(module).__name__ in _ACTIVATION_NAMES


class FullNetworkRecorder:
    """Forward hooks that pool every activation call of ``model``: use as a context manager.

    Inside ``with recorder:``, each forward pass of ``model`` appends one (B, C) tensor per activation call
    to ``recorder.pooled``; :meth:`take` concatenates and clears them: (B, F) float32. ``names`` lists the
    module name of each call (``features.1``, ``layer1.0.relu#2``) after the first pass.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.pooled: list[torch.Tensor] = []
        self.calls: list[str] = []
        self._handles: list[Any] = []

    def __enter__(self) -> FullNetworkRecorder:
        for name, module in self.model.named_modules():
            if is_activation(module):
                self._handles.append(module.register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
            if output.dim() == 4:
                # averaged in the activation's own dtype with float32 accumulation: a bf16 activation is never
                # copied whole to float32 (on float32 ones, the same bits as before)
                pooled = torch.mean(output, dim=(2, 3), dtype=torch.float32)
            elif output.dim() == 2:
                pooled = output.float()
            else:
                return  # token sequences etc. are not convolutional layers
            self.pooled.append(pooled)
            self.calls.append(name)

        return hook

    def take(self) -> tuple[torch.Tensor, list[tuple[str, int]]]:
        """(B, F) activations of the last forward pass and the ``(layer name, width)`` of each piece."""
        counts: dict[str, int] = {}
        layers = []
        for name, piece in zip(self.calls, self.pooled, strict=True):
            counts[name] = counts.get(name, 0) + 1
            label = name if counts[name] == 1 else f"{name}#{counts[name]}"
            layers.append((label, int(piece.shape[1])))
        out = torch.cat(self.pooled, dim=1)
        self.pooled.clear()
        self.calls.clear()
        return out, layers
