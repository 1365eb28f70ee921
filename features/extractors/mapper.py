"""The mapper base every image mapper shares: a list of images in, a block of feature rows out.

A mapper (:class:`features.executors.extract.Mapper`) is built once per process from a plain config
(``from_config``). What every built-in one shares lives here: the host's part of its input made in the
extraction's decode threads (:class:`PreparedImage`, :func:`prepared`), its forward passes pinned to the
run's torch threads (:func:`pinned_threads`), and the checks of the numbers of a configuration
(:func:`check_pass_options`, :func:`check_extractor_config`), which may come from a file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from features.extractors.images import INPUT_SIZE_RANGE, MAX_RESIZE, check_sizes
from vsecore.errors import UserError


@contextmanager
def pinned_threads(threads: int | None) -> Iterator[None]:
    """Run the body with ``threads`` torch intra-op threads (``None``: unchanged), then restore the count.

    CPU kernels sum in an order that depends on the thread count, so every mapper pins its forward
    passes to the run's ``--threads``: equal counts give bit-identical rows in any process.
    """
    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@dataclass(frozen=True)
class PreparedImage:
    """An image after the host's part of a mapper's input (``mapper.prepare``), made in the extraction's
    decode threads so that the thread driving the network does no image work.

    ``pixels``: ``(H, W, 3)`` uint8 on the CPU; ``size``: ``(width, height)`` of the image as loaded;
    ``recipe``: how it was resized (a mapper refuses pixels prepared for another input).
    """

    pixels: torch.Tensor
    size: tuple[int, int]
    recipe: tuple[Any, ...]


def prepared(mapper: Any, item: Image.Image | PreparedImage) -> PreparedImage:
    """``item`` prepared by ``mapper`` (a PIL image is prepared here; a prepared one is checked)."""
    if not isinstance(item, PreparedImage):
        return mapper.prepare(item)
    if item.recipe != mapper.recipe:
        raise ValueError(f"an image prepared as {item.recipe}, but this mapper's input is {mapper.recipe}")
    return item


def check_pass_options(batch_size: int | None, threads: int | None) -> None:
    """One-line errors for a mapper's ``--batch-size`` below 1 and ``--threads`` below 1 (every mapper's)."""
    if batch_size is not None and batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, not {batch_size}")
    if threads is not None and threads < 1:
        raise UserError(f"--threads must be at least 1, not {threads}")


#: the whole-number fields of an extractor configuration, and the most each may be
EXTRACTOR_INTEGERS = {"crops": 10, "batch_size": 1 << 16, "seed": 2**32 - 1, "threads": 4096,
                      "input_size": INPUT_SIZE_RANGE[1], "resize": MAX_RESIZE}


def check_extractor_config(config: dict[str, Any]) -> None:
    """A one-line UserError unless the numbers of an extractor configuration (``crops``, ``batch_size``,
    ``seed``, ``threads``, ``input_size``, ``resize``) are whole numbers in the ranges the ``features``
    options allow (:func:`features.extractors.images.check_sizes`), and ``amp``/``allow_download`` are
    booleans: a configuration read from a file never reaches the network or an allocation unchecked."""
    for key, most in EXTRACTOR_INTEGERS.items():
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 0 <= value <= most):
            raise UserError(f"the extractor configuration's {key} {_shown(value)} is not a whole number "
                            f"from 0 to {most}")
    for key in ("amp", "allow_download"):
        if not isinstance(config.get(key, False), bool):
            raise UserError(f"the extractor configuration's {key} {_shown(config[key])} is not true or false")
    check_sizes(config.get("input_size"), config.get("resize"))


def _shown(value: Any) -> str:
    """``value`` for a message in about 40 characters (an integer of thousands of digits: its size)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"(an integer of {value.bit_length()} bits)"
    return repr(value)[:40]


#: images per forward pass on CUDA when ``--batch-size`` is not given (10-crop VGG19: 320 crops a pass)
CUDA_IMAGES_PER_PASS = 32
#: forward passes per call of a mapper on CUDA: one device synchronisation (the rows copied back) per call
PASSES_PER_CALL = 4


def pass_sizes(batch_size: int | None, device: torch.device) -> tuple[int, int]:
    """``(images per forward pass, images per call)`` of a mapper with ``--batch-size`` ``batch_size`` on
    ``device``. On CUDA a pass holds ``batch_size`` images (default :data:`CUDA_IMAGES_PER_PASS`) and a call
    :data:`PASSES_PER_CALL` passes. On the CPU every image is its own pass (CPU kernels round differently
    for other batch shapes, so a row never depends on its neighbours) and a call maps ``batch_size`` images
    (default 1): the block runner reports progress, and keeps rows on an interrupt, a call at a time."""
    if device.type == "cuda":
        per_pass = batch_size or CUDA_IMAGES_PER_PASS
        return per_pass, per_pass * PASSES_PER_CALL
    return 1, batch_size or 1


def place_model(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` in eval mode on ``device``: on CUDA in ``channels_last`` memory format with cuDNN's
    benchmark mode (the fastest convolution kernels for the shapes met, chosen on first use); on the CPU
    in the default (contiguous) format, whose kernels the CPU rows were always computed with."""
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        return model.to(device, memory_format=torch.channels_last).eval()
    return model.to(device, memory_format=torch.contiguous_format).eval()


def device_input(x: torch.Tensor) -> torch.Tensor:
    """A network input ``(B, 3, S, S)`` in the memory format of :func:`place_model` (``channels_last`` on
    CUDA)."""
    return x.contiguous(memory_format=torch.channels_last) if x.is_cuda else x


def pixels_to(device: torch.device, pixels: list[torch.Tensor]) -> list[torch.Tensor]:
    """8-bit pixel tensors (on the CPU, any shapes) on ``device``: on CUDA packed into one pinned buffer and
    sent in one asynchronous copy (the host goes on while it runs); on the CPU as they are."""
    if device.type != "cuda" or not pixels:
        return [p.to(device) for p in pixels]
    sizes = [p.numel() for p in pixels]
    staging = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=True)
    torch.cat([p.reshape(-1) for p in pixels], out=staging)
    flat = staging.to(device, non_blocking=True)
    return [part.view(p.shape) for part, p in zip(flat.split(sizes), pixels, strict=True)]
