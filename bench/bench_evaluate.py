"""Benchmark of the blocked evaluation against a bare matrix product of the same shapes.

Each (measure, d) configuration runs in a fresh subprocess, so that its peak memory is its own and
the order-violation kernel is compiled (or not) as in a fresh ``train evaluate``. In that process:

* ``matmul s``: a bare float32 ``images @ captions.T`` of the same shapes (N x M output): what any
  evaluation has to compute at least;
* ``eval s``: one ``ground_truth_ranks`` call (both directions, ties counted, bounded memory), and
  ``ratio`` = eval / matmul; the two are alternated ``--repeat`` times (default 3) and the best time of
  each is reported, so that both see the same machine load (the load average is printed);
* for order on the CPU, ``compile s``: the compilation of the fused kernel, made (and timed) before
  the clock starts when the evaluation would compile it (``COMPILE_MIN_WORK``); the ``kernel``
  column says which kernel ran (``compiled``, ``blocked``, ``eager``; ``--order-kernel`` forces one);
* the RSS high-water mark after building the embeddings and after the evaluation (``ru_maxrss``;
  the matrix product's N x M output comes after the evaluation's high-water mark), on CUDA
  ``torch.cuda.max_memory_allocated``.

With ``--images`` below 5,000 the run is scaled down and ``5k x 25k s`` extrapolates the evaluation
to 5,000 x 25,000 (time is proportional to images x captions; marked ``*``).

    .venv/bin/python bench/bench_evaluate.py                                # cosine d 1024, 8192; order 1024
    .venv/bin/python bench/bench_evaluate.py --measure order --dim 8192 --images 1000   # scaled down

``--against DIR`` is an A/B in one run: DIR is another source tree of the project (e.g. ``git worktree
add /tmp/base main``); every configuration runs ``--rounds`` times in this tree and in DIR (its own
``bench/bench_evaluate.py``, importing DIR's packages), alternately, and a second line per
configuration reports DIR's best times and ``this/DIR``:

    git worktree add /tmp/base HEAD~3 && .venv/bin/python bench/bench_evaluate.py --against /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

FULL_IMAGES, FULL_CAPTIONS_PER_IMAGE = 5000, 5
DEFAULT_RUNS = (("cosine", 1024), ("cosine", 8192), ("order", 1024))


def _maxrss_mb() -> float:
    # Linux reports kilobytes
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _embeddings(measure: str, n: int, m: int, dim: int) -> tuple[Any, Any]:
    """Seeded tie-free embeddings: uniform non-negative rows for order, unit normal rows for cosine."""
    import torch

    gen = torch.Generator().manual_seed(0)
    if measure == "order":  # order embeddings are non-negative
        return torch.rand(n, dim, generator=gen), torch.rand(m, dim, generator=gen)
    return (torch.nn.functional.normalize(torch.randn(n, dim, generator=gen), dim=1),
            torch.nn.functional.normalize(torch.randn(m, dim, generator=gen), dim=1))


def _kernel_ran(measure: str, device: str, order_kernel: str, compiled_ready: bool) -> str:
    """Which order-violation kernel scored the tiles ("" for cosine)."""
    if measure != "order":
        return ""
    if device.startswith("cuda") or order_kernel == "eager":
        return "eager"
    return "compiled" if compiled_ready and order_kernel != "blocked" else "blocked"


def run_one(measure: str, dim: int, images: int, per_image: int, device: str, threads: int | None,
            block_images: int | None, block_captions: int | None, order_kernel: str = "auto",
            repeat: int = 3) -> dict[str, object]:
    """Evaluate one configuration in this process; returns the measurements."""
    import torch

    from train.retrieval.evaluate import OrderKernel, TileStats, ground_truth_ranks, vsepp_caption_image

    if threads:
        torch.set_num_threads(threads)
    n, m = images, images * per_image
    img, cap = _embeddings(measure, n, m, dim)
    ci = vsepp_caption_image(n, per_image)
    if device.startswith("cuda"):
        img, cap = img.to(device), cap.to(device)
        _sync(device)
        torch.cuda.reset_peak_memory_stats()
    compile_s = 0.0
    evaluator_kernel = OrderKernel()  # as in a fresh train evaluate
    if measure == "order" and not device.startswith("cuda") and order_kernel in ("auto", "compiled"):
        if order_kernel == "compiled" or n * m * dim >= evaluator_kernel.compile_min_work:
            t0 = time.perf_counter()
            evaluator_kernel.prepare(dim, log=print)
            compile_s = time.perf_counter() - t0
    rss_before = _maxrss_mb()
    evals, matmul = [], []
    for _ in range(repeat):  # alternate, so that both see the same machine load
        stats = TileStats()
        t0 = time.perf_counter()
        ranks = ground_truth_ranks(img, cap, ci, measure, device=device, block_images=block_images,
                                   block_captions=block_captions, stats=stats, order_kernel=order_kernel,
                                   kernel=evaluator_kernel)
        _sync(device)
        evals.append(time.perf_counter() - t0)
        if len(evals) == 1:  # before any N x M product exists
            rss_eval = _maxrss_mb()
        t0 = time.perf_counter()
        product = img @ cap.t()
        _sync(device)
        matmul.append(time.perf_counter() - t0)
        del product
    seconds = min(evals)
    kernel = _kernel_ran(measure, device, order_kernel, evaluator_kernel.ready(dim))
    pairs = n * m
    full_pairs = FULL_IMAGES * FULL_IMAGES * FULL_CAPTIONS_PER_IMAGE
    out = {
        "measure": measure, "dim": dim, "images": n, "captions": m, "device": device,
        "threads": torch.get_num_threads(), "seconds": seconds, "matmul_s": min(matmul), "repeat": repeat,
        "ratio": seconds / min(matmul), "pairs_per_s": pairs / seconds,
        "full_seconds": seconds * full_pairs / pairs, "measured_full": pairs >= full_pairs,
        "rss_embeddings_mb": rss_before, "rss_eval_mb": rss_eval,
        "tile": [stats.block_images, stats.block_captions], "tiles": stats.tiles,
        "check_mean_rank_t2i": float(ranks.t2i.mean()), "kernel": kernel, "compile_s": compile_s,
    }
    if device.startswith("cuda"):
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def _run_single(tree: str, measure: str, dim: int, args: argparse.Namespace) -> dict | str:
    """One configuration in a fresh process of the source tree ``tree``: its measurements, or the error."""
    cmd = [sys.executable, os.path.join(tree, "bench", "bench_evaluate.py"), "--single", "--measure",
           measure, "--dim", str(dim), "--images", str(args.images), "--captions-per-image",
           str(args.captions_per_image), "--device", args.device, "--order-kernel", args.order_kernel,
           "--repeat", str(args.repeat)]
    for flag, value in (("--threads", args.threads), ("--block-images", args.block_images),
                        ("--block-captions", args.block_captions)):
        if value:
            cmd += [flag, str(value)]
    env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return str(done.stderr.strip().splitlines()[-1:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _print_row(measure: str, dim: int, r: dict, tree: str, this: dict | None) -> None:
    full = f"{r['full_seconds']:.1f}" + ("" if r["measured_full"] else "*")
    tile = f"{r['tile'][0]}x{r['tile'][1]}"
    print(f"{measure:8}{dim:>6}{r['images']:>8}{r['captions']:>10}{r['threads']:>8}{tile:>11}"
          f"{r['matmul_s']:>10.2f}{r['seconds']:>9.2f}{r['ratio']:>7.2f}{full:>12}"
          f"{r['rss_embeddings_mb']:>8.0f}/{r['rss_eval_mb']:<8.0f}"
          f"{r.get('cuda_peak_mb', float('nan')):>9.0f}{r['kernel']:>10}{r['compile_s']:>10.1f}"
          + (f"  {tree}: this/{tree} eval {this['seconds'] / r['seconds']:.3f}" if tree and this else ""),
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=FULL_IMAGES)
    parser.add_argument("--captions-per-image", type=int, default=FULL_CAPTIONS_PER_IMAGE)
    parser.add_argument("--dim", type=int, nargs="+", default=None,
                        help="embedding sizes (default: cosine 1024 and 8192, order 1024)")
    parser.add_argument("--measure", nargs="+", default=None, choices=["cosine", "order"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--block-images", type=int, default=None)
    parser.add_argument("--block-captions", type=int, default=None)
    parser.add_argument("--order-kernel", default="auto", choices=["auto", "eager", "blocked", "compiled"],
                        help="order on the CPU: the kernel of every tile (auto: as train evaluate)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="evaluations and matrix products, alternated; the best of each is reported")
    parser.add_argument("--against", default=None, metavar="DIR",
                        help="another source tree of the project: an A/B of every configuration, alternated")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --against: processes per tree and configuration, alternated (the best "
                             "is reported)")
    parser.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.single:
        print(json.dumps(run_one(args.measure[0], args.dim[0], args.images, args.captions_per_image,
                                 args.device, args.threads, args.block_images, args.block_captions,
                                 args.order_kernel, max(1, args.repeat))))
        return
    if args.measure is None and args.dim is None:
        runs = list(DEFAULT_RUNS)
    else:
        runs = [(measure, dim) for measure in (args.measure or ["cosine", "order"])
                for dim in (args.dim or [1024])]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'measure':8}{'d':>6}{'images':>8}{'captions':>10}{'threads':>8}{'tile':>11}{'matmul s':>10}"
          f"{'eval s':>9}{'ratio':>7}{'5k x 25k s':>12}{'RSS MB emb/eval':>17}{'CUDA MB':>9}{'kernel':>10}"
          f"{'compile s':>10}")
    trees = [("", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
    if args.against:
        against = os.path.abspath(args.against)
        trees.append((os.path.basename(against.rstrip("/")), against))
    for measure, dim in runs:
        best: dict[str, dict] = {}
        for _ in range(args.rounds if args.against else 1):
            for name, tree in trees:
                r = _run_single(tree, measure, dim, args)
                if isinstance(r, str):
                    print(f"{measure:8}{dim:>6}  failed ({name or 'this tree'}): {r}")
                    continue
                if name not in best or r["seconds"] < best[name]["seconds"]:
                    best[name] = r
        for name, _ in trees:
            if name in best:
                _print_row(measure, dim, best[name], name, best.get("") if name else None)
    print("matmul: a bare float32 images @ captions.T of the same shapes; eval s and matmul s: the best of "
          f"{args.repeat}, alternated; ratio = eval / matmul; * extrapolated from the measured rate")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
