"""The Full-Network Embedding (Garcia-Gasulla et al.; FNE paper section 3.1): which activations it takes,
their per-feature standardisation from the train split, and the ternary discretisation.

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

Statistics and discretisation (section 3.1): each feature is standardised with the mean and the population
standard deviation of the **train** rows only; a feature constant over them (std 0) maps to z = 0. Then
``z < low -> -1``, ``z > high -> 1``, else 0 (strict bounds: z equal to a threshold is 0), with the paper's
``low = -0.25`` and ``high = 0.15``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
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

DEFAULT_LOW = -0.25
DEFAULT_HIGH = 0.15


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
                pooled = output.float().mean(dim=(2, 3))
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


def fne_statistics(raw: Any, train_rows: np.ndarray, chunk_rows: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and population std (ddof 0) of ``raw`` (N, F) over the rows where ``train_rows``
    (N,) bool is True, read ``chunk_rows`` rows at a time (``raw`` may be a Zarr or NumPy array).

    Pass ``train & valid`` so that failed images do not count. Returns float32 (F,), (F,); a feature whose
    train values are all equal has std exactly 0. Chunks are combined with Chan et al.'s parallel update in
    float64, so the result does not depend on ``chunk_rows`` beyond rounding.
    """
    train_rows = np.asarray(train_rows, dtype=bool)
    n_rows, n_feat = raw.shape
    if train_rows.shape != (n_rows,):
        raise ValueError(f"train_rows has shape {train_rows.shape}, expected ({n_rows},)")
    if not train_rows.any():
        raise ValueError("no train rows: the FNE statistics come from the train split only")
    count = 0
    mean = np.zeros(n_feat, dtype=np.float64)
    m2 = np.zeros(n_feat, dtype=np.float64)
    low = np.full(n_feat, np.inf)
    high = np.full(n_feat, -np.inf)
    for start in range(0, n_rows, chunk_rows):
        stop = min(n_rows, start + chunk_rows)
        select = train_rows[start:stop]
        if not select.any():
            continue  # never read chunks without train rows
        x = np.asarray(raw[start:stop], dtype=np.float64)[select]
        n_b = x.shape[0]
        mean_b = x.mean(axis=0)
        m2_b = ((x - mean_b) ** 2).sum(axis=0)
        delta = mean_b - mean
        total = count + n_b
        mean = mean + delta * (n_b / total)
        m2 = m2 + m2_b + delta**2 * (count * n_b / total)
        count = total
        low = np.minimum(low, x.min(axis=0))
        high = np.maximum(high, x.max(axis=0))
    std = np.sqrt(m2 / count)
    std[low == high] = 0.0  # exactly constant, whatever the rounding of the sums
    return mean.astype(np.float32), std.astype(np.float32)


def standardize(raw: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """z-values (N, F) float64: ``(raw - mean) / std``, and 0 where ``std == 0``."""
    raw = np.asarray(raw, dtype=np.float64)
    std = np.asarray(std, dtype=np.float64)
    safe = np.where(std > 0, std, 1.0)
    z = (raw - np.asarray(mean, dtype=np.float64)) / safe
    return np.where(std > 0, z, 0.0)


def check_thresholds(low: float, high: float, strict: bool = True) -> None:
    """A ``ValueError`` unless ``low`` and ``high`` are finite numbers and ``low < high`` (``strict``;
    else ``low <= high``). A NaN threshold compares false with every z, an infinite one with all of them:
    either turns the ternary code into {0, 1} or all zeros without any other sign."""
    for name, value in (("low", low), ("high", high)):
        if not isinstance(value, (int, float, np.floating, np.integer)) or not np.isfinite(value):
            raise ValueError(f"threshold {name} must be a finite number, got {value!r}")
    if low > high or (strict and low == high):
        raise ValueError(f"threshold low {low} must be below high {high}")


def ternarize(
    raw: np.ndarray, mean: np.ndarray, std: np.ndarray, low: float = DEFAULT_LOW, high: float = DEFAULT_HIGH
) -> np.ndarray:
    """The FNE discretisation: (N, F) raw activations -> int8 (N, F) in {-1, 0, 1}.

    ``z < low -> -1``, ``z > high -> 1``, otherwise 0 (strict inequalities); constant features (std 0) and
    NaN inputs give 0. ``low`` and ``high`` must be finite, ``low`` not above ``high``.
    """
    check_thresholds(low, high, strict=False)
    z = standardize(raw, mean, std)
    out = np.zeros(z.shape, dtype=np.int8)
    out[z < low] = -1
    out[z > high] = 1
    return out
