"""Peak memory and time of the order-violation training loss (forward + backward) at batch 128, 512 and 1,024.

``train.engine.losses.contrastive_loss`` (order violation, sum of hinges) of random non-negative unit-norm
embeddings (B, d), with gradients, through each kernel of ``train.engine.similarity``:

- ``eager``: the broadcast kernel (what a batch up to ``BOUNDED_MIN_ELEMS`` broadcast elements takes);
  autograd keeps the B x B x d broadcast for the backward pass;
- ``bounded``: the chunked kernel with its own backward (what larger batches take), about
  ``BOUNDED_CHUNK_ELEMS`` elements at a time.

Each (kernel, batch) runs in a fresh process so its peak is its own: on the CPU the growth of the peak
resident set (``ru_maxrss``) over the process's peak before the loss, on CUDA ``max_memory_allocated`` over
the memory before it. Also the loss of both kernels (they agree to float rounding). Prints a table.

    .venv/bin/python bench/bench_loss_memory.py                             # CPU, d 1024, B 128 512 1024
    .venv/bin/python bench/bench_loss_memory.py --batches 128 512 --kernels eager bounded --device cuda
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def one(kernel: str, batch: int, d: int, device: str, repeats: int) -> dict[str, float]:
    """Peak memory growth (MiB), best seconds of ``repeats`` forward + backward passes, and the loss."""
    import torch

    from train.engine import similarity
    from train.engine.losses import contrastive_loss

    # the kernel is chosen by the size of the broadcast: move the threshold so this one is taken
    similarity.BOUNDED_MIN_ELEMS = 0 if kernel == "bounded" else 1 << 62
    gen = torch.Generator().manual_seed(0)
    images = torch.nn.functional.normalize(torch.rand(batch, d, generator=gen), dim=1).to(device)
    captions = torch.nn.functional.normalize(torch.rand(batch, d, generator=gen), dim=1).to(device)
    images.requires_grad_(True)
    captions.requires_grad_(True)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss = contrastive_loss(images, captions, "order", 0.05, "sum")
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
        images.grad = captions.grad = None
    peak = (torch.cuda.max_memory_allocated() if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"peak_mib": round((peak - before) / MIB, 1), "seconds": round(min(seconds), 4),
            "loss": float(loss)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[128, 512, 1024])
    p.add_argument("--kernels", nargs="+", default=["eager", "bounded"], choices=["eager", "bounded"])
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=2, help="forward + backward passes per process (best kept)")
    p.add_argument("--one", nargs=2, metavar=("KERNEL", "BATCH"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.d, args.device, args.repeats)))
        return
    print(f"order-violation sum of hinges, d {args.d}, {args.device}: peak memory growth of forward + "
          "backward")
    print(f"{'batch':>6} {'kernel':>8} {'B x B x d (MiB f32)':>20} {'peak MiB':>10} {'best s':>8} "
          f"{'loss':>14}")
    for batch in args.batches:
        for kernel in args.kernels:
            done = subprocess.run([sys.executable, __file__, "--one", kernel, str(batch), "--d", str(args.d),
                                   "--device", args.device, "--repeats", str(args.repeats)],
                                  capture_output=True, text=True, cwd=ROOT)
            if done.returncode:
                print(f"{batch:>6} {kernel:>8} failed: {(done.stderr.strip().splitlines() or [''])[-1]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            broadcast = batch * batch * args.d * 4 / MIB
            print(f"{batch:>6} {kernel:>8} {broadcast:>20,.0f} {r['peak_mib']:>10,.1f} {r['seconds']:>8.3f} "
                  f"{r['loss']:>14.6f}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
