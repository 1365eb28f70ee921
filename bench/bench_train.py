"""Training throughput (captions/s) of the trainer's step for CHAIN-VSE v1 p=1 and OECC arch D.

Random image features (4096-d, as VGG fc7) and random captions of COCO-like length (about 55
characters, normal with sd 12, clipped to 20..150) go through the trainer's own batch collation
and optimisation step (forward, sum-of-hinges order loss, backward, gradient clipping, Adam).
Validation is not included. Prints one line per model; nothing is asserted.

    .venv/bin/python bench/bench_train.py                     # CPU, batch 128
    .venv/bin/python bench/bench_train.py --device cuda --amp # GPU, bf16 autocast
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prep.dataset import Vocabulary  # noqa: E402
from train.engine.codecs import TextCodec
from train.engine.data import CaptionSet, ImageRows
from train.engine.objectives import ContrastiveObjective  # noqa: E402
from train.engine.trainer import Trainer  # noqa: E402
from train.models.family import train_settings  # noqa: E402
from train.models.joint import build_model  # noqa: E402
from vsecore.device import resolve_device  # noqa: E402

MODELS = {
    "chain-v1-p1": {"family": "chain", "version": "v1", "p": 1.0},
    "chain-v2-p1": {"family": "chain", "version": "v2", "p": 1.0},
    "oecc-D": {"family": "oecc", "arch": "D"},
    "oecc-A": {"family": "oecc", "arch": "A"},
}


def random_captions(n_images: int, per_image: int, alphabet: int, image_dim: int, mean_len: float,
                    seed: int) -> CaptionSet:
    """A CaptionSet of random features (n_images, image_dim) and random character captions."""
    rng = np.random.default_rng(seed)
    m = n_images * per_image
    lengths = np.clip(rng.normal(mean_len, 12, m).round(), 20, 150).astype(np.int64)
    offsets = np.zeros(m + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    codes = rng.integers(2, alphabet, int(offsets[-1])).astype(np.int16)
    images = torch.from_numpy(rng.normal(0, 1, (n_images, image_dim)).astype(np.float32))
    vocab = Vocabulary(symbols=["<pad>", "<unk>"] + [chr(ord("!") + k) for k in range(alphabet - 2)])
    return CaptionSet(split="train", lang="en", images=ImageRows(images, np.arange(n_images)),
                      imgids=np.arange(n_images), codes=codes, offsets=offsets,
                      caption_image=np.repeat(np.arange(n_images), per_image), texts=[""] * m,
                      skipped_images=0, codec=TextCodec("chars", vocab, max_len=256))


def bench_model(name: str, args: argparse.Namespace, device: torch.device) -> None:
    settings = train_settings(out="bench", batch_size=args.batch_size, d=args.d, amp=args.amp,
                              device=str(device), **MODELS[name])
    data = random_captions(max(args.batch_size, 256), 5, args.alphabet, args.image_dim, args.mean_len, 0)
    torch.manual_seed(0)
    model = build_model(settings, args.alphabet, args.image_dim)
    objective = ContrastiveObjective(measure="order", margin=0.05, reduction="sum")
    trainer = Trainer(settings, model, objective, data, data, Path("bench-run"), device, log=lambda s: None)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).numpy()
    batches = [order[(k * args.batch_size) % (len(order) - args.batch_size):][:args.batch_size]
               for k in range(args.warmup + args.steps)]
    for b in batches[:args.warmup]:
        trainer._step(data.batch(b))
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for b in batches[args.warmup:]:
        trainer._step(data.batch(b))
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    params = model.parameter_report()["total"]
    rate, ms = args.steps * args.batch_size / elapsed, 1000 * elapsed / args.steps
    print(f"{name:<12} {device.type:<5} batch {args.batch_size:<4} params {params / 1e6:6.2f}M  "
          f"{rate:9.1f} captions/s  {ms:8.1f} ms/step"
          f"{'  (bf16 autocast)' if args.amp and device.type == 'cuda' else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["chain-v1-p1", "oecc-D"], choices=list(MODELS))
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast (CUDA only)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--image-dim", type=int, default=4096)
    parser.add_argument("--alphabet", type=int, default=72)
    parser.add_argument("--mean-len", type=float, default=55.0, help="mean caption length in characters")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
          + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""))
    for name in args.models:
        bench_model(name, args, device)


if __name__ == "__main__":
    main()
