"""Benchmark of the text encoders: training throughput in captions per second.

One training step is what the trainer does per batch: encode the images (``|W_i x|``) and the
captions, the contrastive loss, backward and an Adam step. Captions are random characters of
random lengths around ``--chars``; images are random ``--image-dim`` vectors. The first step is a
warm-up and is not timed. Each line also gives the time of the caption side alone (forward and
backward of encoder and ``W_t``), which is where almost all the work is.

    .venv/bin/python bench/bench_models.py                                  # chain_v1 p=1 and oecc_d
    .venv/bin/python bench/bench_models.py --encoder chain_v2 --p 0.5 --device cuda --amp
"""

from __future__ import annotations

import argparse
import time

import torch

from train.engine.losses import contrastive_loss
from train.models import VisualSemanticEmbedding, create_image_encoder, create_text_encoder


def bench(encoder: str, p: float, batch: int, chars: int, steps: int, alphabet: int, image_dim: int,
          d: int, device: str, amp: bool) -> dict[str, float]:
    """Time ``steps`` training steps of one encoder; returns captions/s and seconds per step."""
    torch.manual_seed(0)
    kwargs = {"p": p} if encoder.startswith("chain") else {}
    model = VisualSemanticEmbedding(create_text_encoder(encoder, alphabet, **kwargs),
                                    create_image_encoder("linear", (image_dim,), d), d).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(max(1, chars - 20), chars + 1, (batch,), generator=gen)
    text = torch.randint(2, alphabet, (batch, int(lengths.max())), generator=gen)
    text = text.masked_fill(torch.arange(text.shape[1]) >= lengths.unsqueeze(1), 0)
    images = torch.randn(batch, image_dim, generator=gen)
    text, lengths, images = text.to(device), lengths.to(device), images.to(device)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def step() -> None:
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=amp):
            im = model.encode_images(images)
            cap = model.encode_captions(text, lengths)
        loss = contrastive_loss(im.float(), cap.float(), "order", margin=0.05)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def caption_side() -> None:
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=amp):
            model.encode_captions(text, lengths).float().sum().backward()

    step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    per_step = (time.perf_counter() - start) / steps
    start = time.perf_counter()
    caption_side()
    sync()
    return {"captions_per_s": batch / per_step, "step_s": per_step,
            "caption_side_s": time.perf_counter() - start,
            "text_encoder_params": model.parameter_report()["text_encoder"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", action="append", help="registered encoder (repeatable); "
                        "default: chain_v1 and oecc_d")
    parser.add_argument("--p", type=float, default=1.0, help="CHAIN-VSE width")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--chars", type=int, default=60, help="longest caption; lengths in [chars-20, chars]")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--alphabet", type=int, default=72)
    parser.add_argument("--image-dim", type=int, default=4096)
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast for the encoders")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for encoder in args.encoder or ["chain_v1", "oecc_d"]:
        r = bench(encoder, args.p, args.batch, args.chars, args.steps, args.alphabet, args.image_dim,
                  args.d, args.device, args.amp)
        width = f" p={args.p}" if encoder.startswith("chain") else ""
        print(f"{encoder}{width} batch {args.batch} on {args.device} ({torch.get_num_threads()} threads): "
              f"{r['captions_per_s']:.1f} captions/s, {r['step_s']:.2f} s/step "
              f"(caption side fwd+bwd {r['caption_side_s']:.2f} s), "
              f"text encoder {r['text_encoder_params']:,} parameters")


if __name__ == "__main__":
    main()
