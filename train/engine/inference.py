"""Running a trained model: embedding images and captions (eval mode, no gradients, in blocks) and scoring
embeddings with the evaluator. The trainer validates with these; ``train evaluate``, ``train query``,
exports and model folders embed with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from train.engine.codecs import TextCodec
from train.engine.data import Batch, CaptionSet, ImageRows
from vsecore.device import autocast

#: the fields of a batch (:class:`train.engine.data.Batch`, ``PairBatch``) that hold caption lengths
LENGTH_FIELDS = ("lengths", "other_lengths")


def batch_to(batch: Any, device: torch.device, host_lengths: bool = False) -> Any:
    """A batch (a NamedTuple of tensors and other values, and tuples of such NamedTuples: the pair
    batches) with its tensors moved to ``device``; a :class:`train.engine.data.Batch`'s image features,
    shipped in their stored dtype, become float32 there (after the copy: on a GPU the conversion is the
    device's work, and the copy moves the stored bytes). ``host_lengths``: the caption lengths
    (:data:`LENGTH_FIELDS`, ``(B,)`` int64) stay where the loader made them, on the host, for an encoder
    that packs its captions there (:func:`train.engine.step.wants_host_lengths`)."""
    def move(name: str, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x if host_lengths and name in LENGTH_FIELDS else x.to(device, non_blocking=True)
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return batch_to(x, device, host_lengths)
        if isinstance(x, tuple):
            return tuple(move(name, v) for v in x)
        return x

    moved = type(batch)(*(move(name, x) for name, x in zip(batch._fields, batch, strict=True)))
    if isinstance(moved, Batch):
        moved = moved._replace(image_features=moved.image_features.float())
    return moved


@torch.no_grad()
def embed_images(model: torch.nn.Module, features: torch.Tensor | ImageRows, device: torch.device,
                 batch_size: int = 1024, amp: bool = False) -> torch.Tensor:
    """Image features (N, *feature_shape) -> embeddings (N, d) float32 on the CPU, in blocks (region
    features of an :class:`ImageRows` with counts: padding regions masked)."""
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, features.shape[0], batch_size):
        rows = features[start:start + batch_size].float()
        counts = (features.counts_of(slice(start, start + batch_size)) if isinstance(features, ImageRows)
                  else None)
        with autocast(device, amp):
            out.append(model.encode_images(rows.to(device), None if counts is None else counts.to(device))
                       .float().cpu())
    model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, 0)


@torch.no_grad()
def embed_codes(model: torch.nn.Module, codes: Sequence[np.ndarray], codec: TextCodec, device: torch.device,
                batch_size: int = 256, amp: bool = False) -> torch.Tensor:
    """Encoded captions (``codec``'s codes) -> embeddings (M, d) float32 on the CPU.

    Captions are embedded in order of length so each block pads little; the result is in the
    order given.
    """
    was_training = model.training
    model.eval()
    order = np.argsort([len(c) for c in codes], kind="stable")
    out: list[torch.Tensor] = []
    for start in range(0, len(order), batch_size):
        tokens, lengths = codec.collate([codes[int(k)] for k in order[start:start + batch_size]])
        with autocast(device, amp):
            out.append(model.encode_captions(tokens.to(device), lengths.to(device)).float().cpu())
    model.train(was_training)
    if not out:
        return torch.zeros(0, 0)
    emb = torch.cat(out)
    result = torch.empty_like(emb)
    result[torch.from_numpy(order)] = emb
    return result


def embed_caption_set(model: torch.nn.Module, captions: CaptionSet, device: torch.device,
                      batch_size: int = 256, amp: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Embed a split: ``(images (N, d), captions (M, d))``, float32 on the CPU."""
    codes = [captions.caption_codes(k) for k in range(len(captions))]
    return (embed_images(model, captions.images, device, amp=amp),
            embed_codes(model, codes, captions.codec, device, batch_size, amp))
