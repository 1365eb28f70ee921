"""Benchmark of the blocked evaluation: wall time and peak memory for N images x k*N captions.

Each (measure, d) configuration runs in a fresh subprocess so that its peak memory is its own:
the resident-set high-water mark (``ru_maxrss``) after the embeddings are built and after the
evaluation, and on CUDA ``torch.cuda.max_memory_allocated``. The time is that of one
``ground_truth_ranks`` call (both directions). Since the work is proportional to the number of
pairs (and to d for order), each line also gives the rate in pairs per second and the time that
rate implies for the full COCO-5k size (5,000 x 25,000), so a scaled-down run can be
extrapolated; the line says whether it was measured or extrapolated.

For order on the CPU, the fused kernel of ``train.similarity.order_violation`` is made ready
before the clock starts (one tiny call with ``fused=True``): that first call's time, which for
the compiled kernel is the compilation (fast with a warm inductor cache, ``TORCHINDUCTOR_CACHE_DIR``),
is printed as its own column, and the kernel used as ``compiled`` / ``blocked`` (``VSE_NO_COMPILE=1``
selects the blocked one) or ``eager`` (``--eager``, the unfused reference).

    .venv/bin/python bench/bench_evaluate.py                      # 5000 x 25000, d 1024 8192, both
    .venv/bin/python bench/bench_evaluate.py --measure order --dim 8192 --images 500   # scaled down
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

FULL_IMAGES, FULL_CAPTIONS_PER_IMAGE = 5000, 5


def _maxrss_mb() -> float:
    # Linux reports kilobytes
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(measure: str, dim: int, images: int, per_image: int, device: str, threads: int | None,
            block_images: int | None, block_captions: int | None, eager: bool = False) -> dict[str, object]:
    """Evaluate one configuration in this process; returns the measurements."""
    import torch

    from train.evaluate import TileStats, ground_truth_ranks, vsepp_caption_image

    if threads:
        torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    n, m = images, images * per_image
    if measure == "order":  # order embeddings are non-negative
        img = torch.rand(n, dim, generator=gen)
        cap = torch.rand(m, dim, generator=gen)
    else:
        img = torch.nn.functional.normalize(torch.randn(n, dim, generator=gen), dim=1)
        cap = torch.nn.functional.normalize(torch.randn(m, dim, generator=gen), dim=1)
    ci = vsepp_caption_image(n, per_image)
    if device.startswith("cuda"):
        img, cap = img.to(device), cap.to(device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    kernel, first_call = "", float("nan")
    if measure == "order" and not device.startswith("cuda"):
        import train.similarity as similarity_module
        if eager:  # the unfused reference: no tile takes the fused kernel
            similarity_module.FUSED_MIN_WORK = 1 << 62
            kernel = "eager"
        else:
            t0 = time.perf_counter()
            similarity_module.order_violation(img[:2], cap[:2], fused=True)  # compiles, once per d range
            first_call = time.perf_counter() - t0
            kernel = similarity_module.fused_backend() or ""
    rss_before = _maxrss_mb()
    stats = TileStats()
    t0 = time.perf_counter()
    ranks = ground_truth_ranks(img, cap, ci, measure, device=device, block_images=block_images,
                               block_captions=block_captions, stats=stats)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    pairs = n * m
    full_pairs = FULL_IMAGES * FULL_IMAGES * FULL_CAPTIONS_PER_IMAGE
    out = {
        "measure": measure, "dim": dim, "images": n, "captions": m, "device": device,
        "threads": torch.get_num_threads(), "seconds": seconds, "pairs_per_s": pairs / seconds,
        "full_seconds": seconds * full_pairs / pairs, "measured_full": pairs >= full_pairs,
        "rss_embeddings_mb": rss_before, "rss_peak_mb": _maxrss_mb(),
        "tile": [stats.block_images, stats.block_captions], "tiles": stats.tiles,
        "check_mean_rank_t2i": float(ranks.t2i.mean()), "kernel": kernel, "first_call_s": first_call,
    }
    if device.startswith("cuda"):
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=FULL_IMAGES)
    parser.add_argument("--captions-per-image", type=int, default=FULL_CAPTIONS_PER_IMAGE)
    parser.add_argument("--dim", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--measure", nargs="+", default=["cosine", "order"], choices=["cosine", "order"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--block-images", type=int, default=None)
    parser.add_argument("--block-captions", type=int, default=None)
    parser.add_argument("--eager", action="store_true",
                        help="order on the CPU: the unfused eager kernel (the 'before' numbers)")
    parser.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.single:
        print(json.dumps(run_one(args.measure[0], args.dim[0], args.images, args.captions_per_image,
                                 args.device, args.threads, args.block_images, args.block_captions,
                                 args.eager)))
        return
    print(f"{'measure':8}{'d':>6}{'images':>8}{'captions':>10}{'threads':>8}{'tile':>12}{'seconds':>10}"
          f"{'Mpairs/s':>10}{'5k x 25k s':>12}{'RSS MB emb/peak':>18}{'CUDA MB':>9}{'kernel':>10}"
          f"{'1st call s':>11}")
    for measure in args.measure:
        for dim in args.dim:
            cmd = [sys.executable, __file__, "--single", "--measure", measure, "--dim", str(dim),
                   "--images", str(args.images), "--captions-per-image", str(args.captions_per_image),
                   "--device", args.device]
            for flag, value in (("--threads", args.threads), ("--block-images", args.block_images),
                                ("--block-captions", args.block_captions)):
                if value:
                    cmd += [flag, str(value)]
            if args.eager:
                cmd.append("--eager")
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{measure:8}{dim:>6}  failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            full = f"{r['full_seconds']:.1f}" + ("" if r["measured_full"] else "*")
            tile = f"{r['tile'][0]}x{r['tile'][1]}"
            print(f"{measure:8}{dim:>6}{r['images']:>8}{r['captions']:>10}{r['threads']:>8}{tile:>12}"
                  f"{r['seconds']:>10.2f}{r['pairs_per_s'] / 1e6:>10.2f}{full:>12}"
                  f"{r['rss_embeddings_mb']:>9.0f}/{r['rss_peak_mb']:<8.0f}"
                  f"{r.get('cuda_peak_mb', float('nan')):>9.0f}{r['kernel']:>10}{r['first_call_s']:>11.1f}",
                  flush=True)
    print("* extrapolated from the measured rate (time is proportional to images x captions)")


if __name__ == "__main__":
    main()
