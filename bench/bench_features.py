"""Benchmark of ``features``: where the time of an extraction goes (prints numbers; not a test).

For one CNN on CPU or GPU it prints

- the end-to-end images/s of ``features cnn`` and of ``features fne`` (in-process, store written),
- the images/s of the bare forward pass over the same crops, already decoded and cropped,
- the time spent decoding the JPEGs, resizing them on the host, and normalising and cropping them on the
  device (the mapper's split of the work), and decoding and resizing them on the device instead
  (``--decoder torchvision``),

and the ratios end-to-end / bare forward, so the pipeline's overhead is visible.

    .venv/bin/python bench/bench_features.py --cnn efficientnet_lite0 --weights none --images 32
    .venv/bin/python bench/bench_features.py --cnn vgg16 --weights none --device cuda --images 256

``--verify-rows N`` instead times the two integrity checks of :mod:`features.store.verify` on a finished
synthetic FNE store of N rows (VGG16 width, 12,416; random values): the chunk-file check every
resume runs, and the full decode of ``features verify``, with the store's size on disk.

    .venv/bin/python bench/bench_features.py --verify-rows 4096

Images: the first N of ``--images-dir`` (default ``../shared/data/coco_sample/images``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from features.extractors.crop_mapper import ImageMapper  # noqa: E402
from features.extractors.crops import normalization_table, pixel_crops, resized_pixels  # noqa: E402
from features.extractors.images import load_image  # noqa: E402
from features.extractors.mapper import device_input  # noqa: E402
from features.run import run_features  # noqa: E402
from features.settings import features_settings  # noqa: E402
from vsecore.device import resolve_device  # noqa: E402


def make_dataset(folder: Path, images: list[Path]) -> Path:
    """A minimal prepared dataset over ``images`` (two thirds train, for the FNE statistics)."""
    rows = [{"imgid": i, "split": "train" if i < len(images) * 2 // 3 else "test", "filename": p.name,
             "sentids": [], "sentences": []} for i, p in enumerate(images)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dataset.json").write_text(json.dumps({
        "dataset": "bench", "languages": ["en"], "pairs": [], "images_root": str(images[0].parent),
        "images": rows}))
    for name, key in (("chars.json", "symbols"), ("words.json", "tokens")):
        (folder / name).write_text(json.dumps({key: ["<pad>", "<unk>"]}))
    return folder


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bare_forward(mapper: ImageMapper, crops: torch.Tensor, device: str, repeats: int = 2) -> float:
    """Seconds of the network alone over pre-built crops (best of ``repeats``), fp32 or bf16 as set.

    Passes have the mapper's sizes (on CPU one image's crops per pass, on CUDA ``batch_size`` images'
    crops), so the comparison with the end-to-end run is like for like.
    """
    step = mapper.images_per_pass * mapper.crops
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=mapper.amp):
            for c0 in range(0, crops.shape[0], step):
                mapper.model(device_input(crops[c0:c0 + step].to(device, non_blocking=True)))
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def bench_verify(rows: int, width: int, block: int) -> None:
    """Print the time of the resume check (stat only) and of ``features verify`` (decode everything)."""
    import numpy as np

    from features.store.core import FeatureStore
    from features.store.ternary import finish_fne
    from features.store.verify import check_files, verify_store

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fne.zarr"
        store = FeatureStore.create(path, np.arange(rows), {"fne/raw": width}, block, {"bench": True}, {})
        t0 = time.perf_counter()
        for b in range(store.n_blocks):
            start, stop = store.block_rows(b)
            x = rng.gamma(0.5, 1.0, (stop - start, width)).astype(np.float32)
            store.write_block(b, {"fne/raw": x}, np.ones(stop - start, dtype=bool), [])
        finish_fne(store, np.arange(rows) % 5 != 0, -0.25, 0.15)
        store.set_attrs(complete=True)
        build_s = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        files = sum(1 for f in path.rglob("*") if f.is_file())
        print(f"bench_features: synthetic FNE store, {rows} rows x {width}, block {block}: {store.n_blocks} "
              f"blocks, {files} files, {size / 1e9:.2f} GB on disk (built in {build_s:.1f} s)")
        t0 = time.perf_counter()
        assert check_files(FeatureStore(path)) == {}
        files_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        assert verify_store(path).ok
        full_s = time.perf_counter() - t0
        per_block = files_s / store.n_blocks * 1e3
        print(f"resume check (stat chunk files):    {files_s:7.3f} s  {per_block:7.3f} ms/block")
        print(f"features verify (decode all):       {full_s:7.2f} s  {size / 1e6 / full_s:7.1f} MB/s on disk")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cnn", default="efficientnet_lite0")
    p.add_argument("--weights", default="none")
    p.add_argument("--device", default="auto")
    p.add_argument("--images", type=int, default=32)
    p.add_argument("--crops", type=int, choices=(1, 10), default=10)
    p.add_argument("--batch-size", type=int, default=None,
                   help="images per forward pass on CUDA, per mapper call on the CPU (default: features')")
    p.add_argument("--decoder", choices=("pil", "torchvision"), default="pil", help="features --decoder")
    p.add_argument("--decode-threads", type=int, default=None, help="features --decode-threads")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--images-dir", type=Path,
                   default=ROOT.parent / "shared" / "data" / "coco_sample" / "images")
    p.add_argument("--skip-fne", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--verify-rows", type=int, default=None, metavar="N",
                   help="only time the integrity checks on a synthetic FNE store of N rows")
    p.add_argument("--verify-width", type=int, default=12416, metavar="F", help="FNE width (VGG16: 12,416)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.verify_rows:
        bench_verify(args.verify_rows, args.verify_width, block=256)
        return
    device = str(resolve_device(args.device))
    paths = sorted(args.images_dir.glob("*.jpg"))[:args.images]
    if not paths:
        raise SystemExit(f"no .jpg images in {args.images_dir}")
    print(f"bench_features: {args.cnn} weights={args.weights} device={device} crops={args.crops} "
          f"images={len(paths)} batch={args.batch_size or 'default'} images, decoder={args.decoder}, "
          f"torch threads={torch.get_num_threads()}")
    forward_s = bench_stages(args, paths, device)
    bench_end_to_end(args, paths, device, forward_s)


def bench_stages(args: argparse.Namespace, paths: list[Path], device: str) -> float:
    """Print the decode, crop and bare-forward times of ``paths``; the bare forward's seconds."""
    n = len(paths)
    t0 = time.perf_counter()
    images = [load_image(q) for q in paths]
    decode_s = time.perf_counter() - t0
    mapper = ImageMapper.from_config(mapper_config(args, device))
    b = mapper.backbone
    t0 = time.perf_counter()
    pixels = [resized_pixels(im, b.resize, b.interpolation) for im in images]
    resize_s = time.perf_counter() - t0
    table = normalization_table(b.mean, b.std, device)
    sync(device)
    t0 = time.perf_counter()
    crops = torch.cat([pixel_crops(p.to(device), table, b.input_size, args.crops) for p in pixels])
    sync(device)
    crop_s = time.perf_counter() - t0
    with torch.inference_mode():
        crops = crops.clone()  # inference tensors, as the mapper's own
    bare_forward(mapper, crops[: args.batch_size], device, repeats=1)  # warm-up (cuDNN, allocator)
    forward_s = bare_forward(mapper, crops, device)
    del mapper
    print(f"decode (load_image, 1 thread):      {decode_s:7.2f} s  {n / decode_s:8.1f} images/s")
    print(f"resize (host, 1 thread):            {resize_s:7.2f} s  {n / resize_s:8.1f} images/s")
    print(f"pixels -> normalised crops ({device}): {crop_s:7.2f} s  {n / crop_s:8.1f} images/s")
    decode_s = device_decode_seconds(mapper_config(args, device), paths, device)
    print(f"decode + resize (torchvision, {device}): {decode_s:7.2f} s  {n / decode_s:8.1f} images/s")
    print(f"bare forward ({crops.shape[0]} crops):        {forward_s:7.2f} s  {n / forward_s:8.1f} images/s")
    return forward_s


def mapper_config(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """The mapper the stages are timed with (global features, PIL's decoder)."""
    return {"cnn": args.cnn, "weights": args.weights, "kind": "global", "crops": args.crops,
            "batch_size": args.batch_size, "device": device, "amp": args.amp}


def device_decode_seconds(config: dict[str, Any], paths: list[Path], device: str) -> float:
    """Seconds to read ``paths`` and decode and resize them where the network runs (``--decoder
    torchvision``: the file reads in this thread, then one decode call on the device)."""
    from features.extractors.decode import decode_jpegs, read_encoded, resize_on_device

    mapper = ImageMapper.from_config({**config, "decoder": "torchvision"})
    b = mapper.backbone
    sync(device)
    t0 = time.perf_counter()
    encoded = [read_encoded(p, resize=b.resize) for p in paths]
    for image in decode_jpegs(encoded, torch.device(device)):
        resize_on_device(image, b.resize, b.interpolation)
    sync(device)
    return time.perf_counter() - t0


def bench_end_to_end(args: argparse.Namespace, paths: list[Path], device: str, forward_s: float) -> None:
    """Print ``features cnn`` (and ``fne``) end to end on ``paths``, beside the bare forward."""
    n = len(paths)
    with tempfile.TemporaryDirectory() as tmp:
        data = make_dataset(Path(tmp) / "prep", paths)
        for kind in ("cnn",) if args.skip_fne else ("cnn", "fne"):
            settings = features_settings(kind=kind, data=str(data), out=str(Path(tmp) / f"{kind}.zarr"),
                                         cnn=args.cnn, weights=args.weights, crops=args.crops,
                                         batch_size=args.batch_size, block_size=args.block_size,
                                         device=device, amp=args.amp, threads=torch.get_num_threads(),
                                         decoder=args.decoder, decode_threads=args.decode_threads)
            t0 = time.perf_counter()
            run_features(settings, overwrite=True, progress=False)
            total = time.perf_counter() - t0
            print(f"features {kind} end to end:            {total:7.2f} s  {n / total:8.1f} images/s  "
                  f"(ratio to bare forward {total / forward_s:5.2f}x; includes model load and store)")


if __name__ == "__main__":
    main()
