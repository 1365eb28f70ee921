"""Synthetic inputs of ``bench/gpu_check.py`` (captions, features, a region store), its comparisons of a
device's results with the CPU's, and its timing helpers (the device's queue drained around a timing)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from features.store.core import FeatureStore
from prep.dataset import Vocabulary
from train.engine.codecs import TextCodec
from train.engine.data import CaptionSet, ImageRows

#: made-up text: characters of the alphabet, words (``--dry``: fewer), letters per spelled word
ALPHABET, WORDS, DRY_WORDS, WORD_LENGTH = 72, 20_000, 500, 16


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (where a CUDA error of that work surfaces)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mib(device: torch.device) -> float | None:
    """Peak memory allocated on the device since the last reset, MiB (None on the CPU)."""
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    """Start counting the device's peak memory afresh (nothing on the CPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def timed(fn: Any, device: torch.device) -> float:
    """Seconds of ``fn()``, the device's queue drained before and after."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def relative_difference(values: np.ndarray | torch.Tensor, reference: np.ndarray | torch.Tensor) -> float:
    """``||values - reference|| / ||reference||`` in float64 (0 when both are zero; inf for a NaN)."""
    a = torch.as_tensor(values).detach().to("cpu", torch.float64)
    b = torch.as_tensor(reference).detach().to("cpu", torch.float64)
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    norm = float(torch.linalg.vector_norm(b))
    diff = float(torch.linalg.vector_norm(a - b))
    return float(f"{diff / norm:.3g}") if norm else (0.0 if diff == 0 else float("inf"))


def codec_of(text_input: str, words: int = WORDS) -> TextCodec:
    """A codec over a made-up vocabulary of the family's text input (``words`` words for ``words``)."""
    if text_input == "words":
        return TextCodec("words", Vocabulary(["<pad>", "<unk>"] + [f"w{k}" for k in range(words - 2)]), 50)
    chars = Vocabulary(["<pad>", "<unk>"] + [chr(ord("!") + k) for k in range(ALPHABET - 2)])
    if text_input == "word_chars":
        return TextCodec("word_chars", chars, 50, WORD_LENGTH)
    return TextCodec("chars", chars, 256)


def random_codes(codec: TextCodec, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``m`` random captions of COCO length: ``(codes (S,) int16, offsets (m + 1,) int64)``."""
    if codec.kind == "chars":
        lengths = np.clip(rng.normal(55, 12, m).round(), 20, 150).astype(np.int64)
        codes = rng.integers(2, codec.vocab_size, int(lengths.sum()))
    else:
        lengths = np.clip(rng.normal(11, 2.5, m).round(), 6, 25).astype(np.int64)
        codes = rng.integers(2, codec.vocab_size, int(lengths.sum()))
        if codec.kind == "word_chars":  # words of 2..10 characters, zero-padded to the word length
            spelled = rng.integers(2, codec.vocab_size, (len(codes), WORD_LENGTH))
            spelled[np.arange(WORD_LENGTH) >= rng.integers(2, 11, len(codes))[:, None]] = 0
            codes, lengths = spelled.reshape(-1), lengths * WORD_LENGTH
    offsets = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return codes.astype(np.int16), offsets


def random_features(shape: tuple[int, ...], dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, *shape) features: ternary for int8 (the FNE), rectified normal values otherwise."""
    if dtype == "int8":
        return rng.integers(-1, 2, (n, *shape), dtype=np.int8)
    return np.maximum(rng.standard_normal((n, *shape), dtype=np.float32), 0).astype(dtype)


def caption_set(features: Any, codec: TextCodec, n: int, rng: np.random.Generator,
                counts: torch.Tensor | None = None) -> CaptionSet:
    """Five random captions per image of ``features`` (an array or the rows of a store)."""
    codes, offsets = random_codes(codec, 5 * n, rng)
    return CaptionSet(split="train", lang="en", images=ImageRows(features, np.arange(n), counts),
                      imgids=np.arange(n), codes=codes, offsets=offsets,
                      caption_image=np.repeat(np.arange(n), 5),
                      texts=[""] * (5 * n), skipped_images=0, codec=codec)


def compare_results(results: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """``results`` against ``reference`` (``{protocol: ProtocolResult}`` each), over the protocols of
    ``reference``: the share of ground-truth ranks that differ and the largest change of one, the largest
    difference of a recall (R@1, R@5, R@10, in points), and the tied queries of each (device, CPU)."""
    differ = total = change = 0
    recall = 0.0
    ties = [0, 0]
    for protocol, ref in reference.items():
        got = results[protocol]
        for a, b in zip(got.fold_ranks, ref.fold_ranks, strict=True):
            for direction in ("i2t", "t2i"):
                x, y = getattr(a.ranks, direction), getattr(b.ranks, direction)
                differ, total = differ + int((x != y).sum()), total + len(y)
                change = max(change, int(np.abs(x.astype(np.int64) - y).max(initial=0)))
        for direction in ("i2t", "t2i"):
            x, y = getattr(got.metrics, direction).to_dict(), getattr(ref.metrics, direction).to_dict()
            recall = max([recall] + [abs(float(x[k]) - float(y[k])) for k in ("r1", "r5", "r10")])
            ties = [ties[0] + int(x["ties"]), ties[1] + int(y["ties"])]
    return {"ranks_differ_vs_cpu": round(differ / max(total, 1), 6), "max_rank_change_vs_cpu": change,
            "max_recall_diff_vs_cpu": round(recall, 4), "tied_queries_device_cpu": ties}


def region_store(path: Path, n: int, shape: tuple[int, int], rng: np.random.Generator) -> str:
    """A complete store of ``n`` rows of ``shape`` (49 x 1,280) float16 regions (sharded for rows of 32 KiB
    and more, as ``features regions``)."""
    store = FeatureStore.create(path, np.arange(n), {"regions": shape, "counts": ()}, block_size=256,
                                config={"kind": "regions"}, provenance={"network": "random (gpu_check)"},
                                dtypes={"regions": "float16", "counts": "int32"})
    for b in range(store.n_blocks):
        start, stop = store.block_rows(b)
        columns = {"regions": random_features(shape, "float16", stop - start, rng),
                   "counts": np.full(stop - start, shape[0], np.int32)}
        store.write_block(b, columns, np.ones(stop - start, bool), [])
    store.set_attrs(complete=True)
    return f"{path}:regions"
