"""Encode + similarity time of CLMR and LIWE for 1,000 images x 5,000 captions (LIWE paper, section 4.4).

The paper, averaged over ten runs: CLMR encodes 1,000 images and 5,000 captions in 3.1 s and builds the
similarity matrix in 0.15 s on CPU; CLMR+LIWE in 5.11 s and 0.14 s. This script times the same work with
the toolkit's own evaluation path: random weights (``d = 1024``, LIWE(128,256), ``C_w = 26``, alphabet 101),
random region features of the paper's shape (36 x 2048, all regions real), random captions of COCO length
(words normal(10.5, 2.5) clipped to 5..30, words of 2..10 characters), embedded with
:func:`train.engine.inference.embed_images` / :func:`train.engine.inference.embed_codes` (eval mode, no
gradients) and
scored with :func:`train.engine.similarity.similarity` (cosine: one (1000, 5000) matrix product). Prints one
line
per model and stage (mean and min over ``--repeats`` after ``--warmup`` untimed calls); nothing is asserted.

    .venv/bin/python bench/bench_liwe.py                  # CPU, torch's default threads
    .venv/bin/python bench/bench_liwe.py --threads 1 --repeats 3
    .venv/bin/python bench/bench_liwe.py --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prep.dataset import Vocabulary  # noqa: E402
from train.engine.codecs import TextCodec
from train.engine.data import ImageRows
from train.engine.inference import embed_codes, embed_images  # noqa: E402
from train.engine.similarity import similarity  # noqa: E402
from train.models.family import train_settings  # noqa: E402
from train.models.joint import build_model  # noqa: E402
from vsecore.device import resolve_device  # noqa: E402


def random_word_captions(n: int, vocab: int, word_length: int, seed: int) -> tuple[list[np.ndarray],
                                                                                    list[np.ndarray]]:
    """``n`` random captions as word indices (CLMR) and as the same words spelled in characters (LIWE)."""
    rng = np.random.default_rng(seed)
    spellings = np.zeros((vocab, word_length), dtype=np.int64)
    for w in range(2, vocab):
        size = int(rng.integers(2, 11))
        spellings[w, :size] = rng.integers(2, 101, size)
    words, chars = [], []
    for length in np.clip(rng.normal(10.5, 2.5, n).round(), 5, 30).astype(np.int64):
        ids = rng.integers(2, vocab, int(length))
        words.append(ids)
        chars.append(spellings[ids])
    return words, chars


def timed(fn: Callable[[], torch.Tensor], device: torch.device, repeats: int, warmup: int = 1
          ) -> tuple[list[float], torch.Tensor]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls, and its last result."""
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--captions", type=int, default=5000)
    parser.add_argument("--regions", type=int, default=36)
    parser.add_argument("--region-dim", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=20000, help="CLMR words (Flickr30k + Multi30k: ~20,000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls before the timed ones")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="clmr,liwe")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    rng = np.random.default_rng(0)
    shape = (args.images, args.regions, args.region_dim)
    features = torch.from_numpy(rng.normal(0, 1, shape).astype(np.float32))
    rows = ImageRows(features, np.arange(args.images))
    words, chars = random_word_captions(args.captions, args.vocab, 26, 0)
    symbols = ["<pad>", "<unk>"] + [f"s{k}" for k in range(args.vocab - 2)]
    mean_words = np.mean([len(w) for w in words])
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} CPU threads; {args.images} images "
          f"x {args.regions} x {args.region_dim}, {args.captions} captions (mean {mean_words:.1f} words); "
          f"mean (min) of {args.repeats} runs after {args.warmup} untimed")
    for family in args.models.split(","):
        torch.manual_seed(0)
        settings = train_settings(family=family, out="bench", d=1024, device=str(device),
                                **({"word_length": 26, "layers": [128, 256]} if family == "liwe" else {}))
        if family == "liwe":
            codec = TextCodec("word_chars", Vocabulary(symbols=symbols[:101]), max_len=100, word_length=26)
            codes, vocab_size = chars, 101
        else:
            codec = TextCodec("words", Vocabulary(symbols=symbols), max_len=100)
            codes, vocab_size = words, args.vocab
        model = build_model(settings, vocab_size, (args.regions, args.region_dim)).to(device).eval()
        t_img, images = timed(lambda m=model: embed_images(m, rows, device, batch_size=128), device,
                              args.repeats, args.warmup)
        t_cap, caps = timed(lambda m=model, c=codec, k=codes: embed_codes(m, k, c, device, batch_size=128),
                            device, args.repeats, args.warmup)
        im, cap = images.to(device), caps.to(device)
        t_sim, sims = timed(lambda a=im, b=cap: similarity(a, b, "cosine"), device, args.repeats,
                            max(1, args.warmup))
        assert sims.shape == (args.images, args.captions)
        for stage, times in (("encode images", t_img), ("encode captions", t_cap),
                             ("encode total", [a + b for a, b in zip(t_img, t_cap, strict=True)]),
                             ("similarity", t_sim)):
            print(f"{family:<5} {stage:<16} {statistics.mean(times):8.3f} s  (min {min(times):.3f} s)")


if __name__ == "__main__":
    main()
