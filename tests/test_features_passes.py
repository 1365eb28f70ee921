"""Issue 44.1, the parts a CPU can check: ``--batch-size`` counts images (crops derived), the CUDA-only
layout (``channels_last``, cuDNN's benchmark mode, one pinned copy of a pass's pixels) never touches the
CPU, the Full-Network Embedding averages without float32 copies and keeps its float32 bits, and the new
settings leave the fingerprints pipelines recorded as they were."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from features.extractors.backbones import load_backbone
from features.extractors.crop_mapper import ImageMapper
from features.extractors.full_network import FullNetworkRecorder
from features.extractors.images import load_image
from features.extractors.mapper import (
    CUDA_IMAGES_PER_PASS,
    PASSES_PER_CALL,
    pass_sizes,
    pixels_to,
    place_model,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_batch_size_counts_images() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pass_sizes(None, cuda) == (CUDA_IMAGES_PER_PASS, CUDA_IMAGES_PER_PASS * PASSES_PER_CALL)
    assert pass_sizes(8, cuda) == (8, 8 * PASSES_PER_CALL)  # a pass of 8 images is 80 crops with --crops 10
    assert pass_sizes(None, cpu) == (1, 1) and pass_sizes(8, cpu) == (1, 8)


def test_cpu_rows_do_not_depend_on_the_batch_size(coco_sample) -> None:
    """On the CPU every image's 10 crops are one forward pass whatever ``--batch-size`` (before, a batch
    below 10 crops split them and changed the last bits); the mapper's calls only group images."""
    images = [load_image(p) for p in sorted((coco_sample / "images").iterdir())[:3]]
    backbone = load_backbone("efficientnet_lite0", "none", input_size=64)
    passes: list[int] = []
    backbone.model.register_forward_hook(lambda m, i, o: passes.append(i[0].shape[0]))
    for batch in (None, 1, 2, 7):
        mapper = ImageMapper(backbone, kind="fne", crops=10, batch_size=batch)
        passes.clear()
        rows = mapper(images)["fne/raw"]
        assert passes == [10, 10, 10], (batch, passes)
        if batch is None:
            reference = rows
        np.testing.assert_array_equal(rows, reference)


def test_the_cuda_layout_never_reaches_the_cpu() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    model[0].weight.data = model[0].weight.data.to(memory_format=torch.channels_last)
    before = torch.backends.cudnn.benchmark
    placed = place_model(model, torch.device("cpu"))
    assert placed[0].weight.is_contiguous() and torch.backends.cudnn.benchmark == before
    pixels = [torch.zeros(5, 7, 3, dtype=torch.uint8), torch.ones(2, 3, 3, dtype=torch.uint8)]
    moved = pixels_to(torch.device("cpu"), pixels)
    assert all(torch.equal(a, b) for a, b in zip(moved, pixels, strict=True))


def test_fne_pooling_keeps_float32_bits_and_accumulates_bf16_in_float32() -> None:
    """``torch.mean(x, (2, 3), dtype=float32)``: on float32 activations the bits of ``x.float().mean``; on
    bf16 ones the float32 mean of the bf16 values, without a float32 copy of the activation."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 6, 3),
                                torch.nn.ReLU6()).eval()
    x = torch.randn(4, 3, 33, 29)
    old = []
    handles = [m.register_forward_hook(lambda m, i, o: old.append(o.float().mean(dim=(2, 3))))
               for m in model if isinstance(m, (torch.nn.ReLU, torch.nn.ReLU6))]
    with torch.inference_mode(), FullNetworkRecorder(model) as recorder:
        model(x)
        pooled, layers = recorder.take()
    for h in handles:
        h.remove()
    assert layers == [("0", 8), ("1", 6)] or [w for _, w in layers] == [8, 6]
    assert torch.equal(pooled, torch.cat(old, dim=1))
    activation = torch.rand(2, 5, 17, 19).bfloat16()
    mean = torch.mean(activation, dim=(2, 3), dtype=torch.float32)
    assert mean.dtype == torch.float32
    torch.testing.assert_close(mean, activation.double().mean(dim=(2, 3)).float(), rtol=1e-6, atol=1e-7)


def test_new_settings_are_recorded_only_when_set() -> None:
    """A pipeline's features section that leaves the new settings out dumps what it dumped before them
    (its stage fingerprint stays valid); one that sets them records them."""
    from features.settings import features_settings

    plain = features_settings(kind="cnn", out="s.zarr").model_dump()
    assert not {"decode_threads", "read_ahead", "decoder"} & set(plain)
    given = features_settings(kind="cnn", out="s.zarr", decoder="torchvision", read_ahead=2).model_dump()
    assert given["decoder"] == "torchvision" and given["read_ahead"] == 2 and "decode_threads" not in given
