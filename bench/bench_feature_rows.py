"""How much two ways of computing the same feature rows differ (prints numbers; not a test).

``--compare amp``: bf16 autocast against float32 (``features --amp`` runs bf16 on CUDA only; this measures
the CPU's bf16, ``torch.autocast("cpu")``, as a stand-in, labelled so). ``--compare decoder``: the JPEG
decoders of ``--decoder``, torchvision's (on the CPU: libjpeg-turbo, then torch's antialiased resize)
against PIL's. Both on real photos (the first ``--images`` of ``coco_sample``), 10 crops, ImageNet
EfficientNet-Lite0, for the global feature and the Full-Network Embedding; per image the relative
difference ``||a - b|| / ||b||`` (median, 99th percentile, largest), the smallest cosine similarity, and for
the FNE the share of ternary codes that change (statistics and thresholds of the reference rows).

    .venv/bin/python bench/bench_feature_rows.py --compare amp --images 100 --threads 1
    .venv/bin/python bench/bench_feature_rows.py --compare decoder --images 100 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from features.extractors.backbones import load_backbone  # noqa: E402
from features.extractors.crop_mapper import ImageMapper  # noqa: E402
from features.store.ternary import DEFAULT_HIGH, DEFAULT_LOW, fne_statistics, ternarize  # noqa: E402


def rows(mapper: ImageMapper, paths: list[Path], bf16: bool) -> tuple[np.ndarray, float]:
    """``(rows (N, width) float32, seconds)`` of ``paths`` read by ``mapper.load``, under CPU bf16 autocast
    when ``bf16``."""
    context = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    t0 = time.perf_counter()
    with context:
        (out,) = mapper([mapper.load(str(p), resize=mapper.resize) for p in paths]).values()
    return out, time.perf_counter() - t0


def differences(a: np.ndarray, b: np.ndarray, fne: bool) -> dict[str, Any]:
    """Per-row relative differences of ``a`` against the reference ``b``, cosines, FNE code changes."""
    rel = np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    out = {"rel median": np.median(rel), "rel p99": np.percentile(rel, 99), "rel max": rel.max(),
           "cos min": cos.min()}
    if fne:
        mean, std = fne_statistics(b, np.ones(len(b), bool))
        codes_a, codes_b = (ternarize(x, mean, std, DEFAULT_LOW, DEFAULT_HIGH) for x in (a, b))
        out["ternary changed"] = float((codes_a != codes_b).mean())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compare", choices=("amp", "decoder"), required=True)
    p.add_argument("--images", type=int, default=100)
    p.add_argument("--cnn", default="efficientnet_lite0")
    p.add_argument("--weights", default="imagenet")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--images-dir", type=Path,
                   default=ROOT.parent / "shared" / "data" / "coco_sample" / "images")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    paths = sorted(args.images_dir.glob("*.jpg"))[: args.images]
    backbone = load_backbone(args.cnn, args.weights)
    label = ("CPU bf16 autocast vs float32" if args.compare == "amp"
             else "decoder torchvision (CPU: libjpeg-turbo + torch resize) vs pil")
    print(f"bench_feature_rows: {label}; {args.cnn} ({args.weights}), 10 crops, {len(paths)} coco_sample "
          f"images, torch threads {torch.get_num_threads()}")
    for kind in ("global", "fne"):
        reference = ImageMapper(backbone, kind=kind, crops=10)
        other = ImageMapper(backbone, kind=kind, crops=10,
                            decoder="torchvision" if args.compare == "decoder" else "pil")
        b, b_s = rows(reference, paths, bf16=False)
        a, a_s = rows(other, paths, bf16=args.compare == "amp")
        found = differences(a, b, kind == "fne")
        shown = ", ".join(f"{k} {v:.6f}" if k.startswith("cos") else f"{k} {v:.3g}" for k, v in found.items())
        rates = f"{len(paths) / b_s:.2f} vs {len(paths) / a_s:.2f} images/s (reference vs other)"
        print(f"{kind:6s} ({b.shape[1]:>6,}): {shown}; {rates}", flush=True)


if __name__ == "__main__":
    main()
