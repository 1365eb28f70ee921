"""The one meaning of ``--device`` in every command, and of ``--amp`` on a device (:func:`autocast`)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from vsecore.errors import UserError

#: the help text of --device in every command
DEVICE_HELP = "where to compute: auto (cuda when available, else cpu), cpu, cuda or cuda:N (default auto)"


def add_device_argument(parser: Any, default: str | None = "auto", **kwargs: Any) -> None:
    """``--device`` of every command that computes (:data:`DEVICE_HELP`); ``default`` None: the settings'."""
    parser.add_argument("--device", default=default, help=DEVICE_HELP, **kwargs)


def resolve_device(device: Any) -> Any:
    """``"auto"``/``None`` -> CUDA when available, else CPU (a ``torch.device``); a device torch cannot
    read, or a CUDA one this machine lacks, is a one-line :class:`UserError`."""
    import torch

    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UserError(f"--device {device}: not a device (auto, cpu, cuda or cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {device}: CUDA is not available on this machine (use cpu or auto)")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UserError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def uses_amp(device: Any, amp: bool) -> bool:
    """Whether ``--amp`` (bf16 autocast) applies on ``device``: on CUDA only; a CPU stays float32, exact."""
    return bool(amp) and getattr(device, "type", str(device).split(":")[0]) == "cuda"


def autocast(device: Any, amp: bool) -> Any:
    """The context every model call runs in: bf16 autocast on CUDA when ``amp`` (:func:`uses_amp`), else a
    no-op context (the same numbers as no context at all)."""
    if not uses_amp(device, amp):
        return nullcontext()
    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16)
