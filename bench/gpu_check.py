"""One call that runs every CUDA path of the toolkit on synthetic data and writes one JSON of its numbers.

From a fresh clone, with no data and no network (random weights, random images and features made here):

- **extraction** (``bench/gpu_check_extraction.py``): ``features.extractors.crop_mapper.ImageMapper`` (10
  crops per image, the paper's) on ``--images`` synthetic 640 x 480 images, global features and the
  Full-Network Embedding, float32 and bf16 AMP; then ``features cnn`` (10-crop VGG19) end to end from JPEG
  files, host (PIL) and device (nvjpeg) decoding, float32 and bf16;
- **steps**: every registered family's model, objective and :class:`train.engine.trainer.Trainer` step
  (forward, loss, backward, Adam) at its COCO defaults on its own feature shape (4,096-d globals, the 12,416-d
  int8 FNE, 49 x 1,280 float16 regions), ``--steps`` steps in float32 and in bf16 autocast, and
  ``--cpu-steps`` on the CPU beside them;
- **evaluation**: COCO-5k and COCO-1k (5,000 images, 25,000 captions, d 1,024) ranked on the device, order
  violation and cosine (``train.retrieval.evaluate.evaluate_protocols``);
- **loader**: batches of region features read per batch from a sharded store
  (``features.store.rows.StoreRows``), ``--workers 0`` and ``--workers 2`` with pinned memory, moved to the
  device;
- **training** (``bench/gpu_check_train.py``): each family's step eager, ``--compile``, ``--cuda-graphs``,
  batch 128 and 512, fused Adam, each against the eager step; a checkpoint's write; issue 44's targets.

Beside each device number, where cheap, the same work on the CPU, and the device's results against the CPU's:
the rows of the first few images (relative difference), each family's loss on its first batch (eval mode,
the same weights), and the ranks and metrics of each evaluation (cosine on every protocol, order on 1k).

The first error (a CUDA error, out of memory, no CUDA at all) ends the check in one line on stderr, exit 1,
after the JSON of what ran before it: nothing falls back to the CPU. ``--keep-going`` runs the stages after a
failed one instead (each error one line, all of them in the JSON, exit 1): every broken path from one call
of a short GPU lease. ``--dry`` runs tiny sizes (the test
suite runs ``--device cpu --dry``).

    make gpu-check                                                        # --device cuda, gpu_check.json
    python bench/gpu_check.py --device cuda --json gpu_check.json         # the same
    PYTHONPATH=. python bench/gpu_check.py --device cpu --dry --json /tmp/check.json   # the suite's check
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_data import (  # noqa: E402
    DRY_WORDS,
    WORD_LENGTH,
    WORDS,
    caption_set,
    codec_of,
    compare_results,
    peak_mib,
    random_features,
    region_store,
    relative_difference,
    reset_peak,
    sync,
    timed,
)
from gpu_check_extraction import extraction  # noqa: E402
from gpu_check_train import training  # noqa: E402

from features.store.recompress import recompress_store  # noqa: E402
from features.store.rows import open_rows  # noqa: E402
from train.engine.data import ImageRows, batch_loader  # noqa: E402
from train.engine.inference import batch_to  # noqa: E402
from train.engine.trainer import Trainer  # noqa: E402
from train.models.family import build_objective, model_spec, train_settings, with_family_defaults  # noqa: E402
from train.models.joint import build_model  # noqa: E402
from train.retrieval.evaluate import evaluate_protocols  # noqa: E402
from vsecore.device import autocast, resolve_device  # noqa: E402
from vsecore.errors import UserError  # noqa: E402
from vsecore.io import write_json_atomic  # noqa: E402
from vsecore.outputs import check_output_file  # noqa: E402

MIB = 2**20
#: family -> the features its COCO pipeline reads: (row shape, stored dtype)
FEATURES = {"chain": ((4096,), "float32"), "oecc": ((4096,), "float32"), "seam": ((4096,), "float32"),
            "vse": ((12416,), "int8"), "clmr": ((49, 1280), "float16"), "liwe": ((49, 1280), "float16")}
#: ``--dry``: small features and models (the same code paths, a fraction of the work)
DRY_FEATURES = {"chain": (64,), "oecc": (64,), "seam": (64,), "vse": (64,), "clmr": (4, 32), "liwe": (4, 32)}
#: ``--dry``'s loader rows: 16 x 1,024 float16 = 32 KiB, stored one chunk per row as real region rows are
DRY_LOADER_ROWS = (16, 1024)
DRY_SETTINGS = {"chain": {"p": 0.125}, "oecc": {"arch": "A"}, "seam": {"gru_units": 16},
                "vse": {"word_dim": 16}, "liwe": {"layers": [16, 16]}}
STAGES = ("extraction", "steps", "evaluation", "loader", "training")
#: ``--images`` at most: every synthetic image is held in memory (0.9 MB) with its resized pixels
MAX_IMAGES = 2000
#: the evaluation's captions: their image's embedding plus this much noise per dimension
EVAL_NOISE = 0.08
#: batches collated before the timed steps, which cycle through them (the step is timed, not the collation)
POOL = 8
#: sizes of a real check and of ``--dry``
SIZES = {"real": {"images": 300, "cnn": "vgg19", "input_size": None, "steps": 200, "cpu_steps": 2,
                  "batch": 128, "train_images": 1024, "eval_images": 5000, "eval_protocols": ("5k", "1k"),
                  "loader_rows": 2048, "loader_batches": 120, "loader_workers": (0, 2, 4, 8)},
         "dry": {"images": 1, "cnn": "resnet18", "input_size": 32, "steps": 2, "cpu_steps": 1, "batch": 8,
                 "train_images": 16, "eval_images": 40, "eval_protocols": ("all",), "loader_rows": 24,
                 "loader_batches": 3, "loader_workers": (0, 1)}}


class CheckFailed(Exception):
    """The first error of a stage: ends the check (one line)."""


class Check:
    """The JSON being written, the device, and the stage now running."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.args, self.device, self.t0 = args, device, time.perf_counter()
        self.sizes = dict(SIZES["dry" if args.dry else "real"])
        for key in ("images", "steps", "cpu_steps"):
            if getattr(args, key) is not None:
                self.sizes[key] = getattr(args, key)
        self.out: dict[str, Any] = {"machine": machine(device), "sizes": jsonable(self.sizes), "error": None}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[dict[str, Any]]:
        """Run one stage: its numbers go into ``out[name]``; any exception becomes :class:`CheckFailed`."""
        record: dict[str, Any] = {}
        self.out[name] = record
        t0 = time.perf_counter()
        try:
            yield record
            sync(self.device)  # an asynchronous CUDA error is this stage's, not the next one's
        except Exception as exc:  # noqa: BLE001 - every error ends the check, named in one line
            message = (str(exc).strip().splitlines() or [""])[0]
            raise CheckFailed(f"{name}: {type(exc).__name__}: {message}") from exc
        record["wall_s"] = round(time.perf_counter() - t0, 3)
        total = time.perf_counter() - self.t0
        print(f"gpu_check: {name} done in {record['wall_s']:.1f} s ({total:.0f} s in all)", flush=True)


def machine(device: torch.device) -> dict[str, Any]:
    """The device's name and the CPU's, as the JSON reports them."""
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    info = {"device": str(device), "device_name": cpu if device.type == "cpu" else "", "cpu": cpu,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "load_average": [round(v, 2) for v in os.getloadavg()]}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=props.name, device_memory_mib=props.total_memory // MIB,
                    cuda=torch.version.cuda, capability=f"{props.major}.{props.minor}")
    return info


def jsonable(value: Any) -> Any:
    """Tuples as lists (for the JSON)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}


# -- every family's step -----------------------------------------------------------------------------

def family_settings(check: Check, family: str, device: torch.device, amp: bool) -> Any:
    """``family``'s training settings at its COCO defaults (``--dry``: small sizes), batch of the check."""
    sizes = {"d": 32, **DRY_SETTINGS.get(family, {})} if check.args.dry else {}
    extra = {"word_length": WORD_LENGTH} if family == "liwe" else {}
    settings = train_settings(family=family, out="gpu-check", batch_size=check.sizes["batch"], amp=amp,
                              device=str(device), **extra, **sizes)
    return with_family_defaults(settings, "coco")


def family_steps(check: Check, family: str, record: dict[str, Any]) -> None:
    """Step ms, captions/s and peak device memory of ``family``: float32, bf16 autocast, and the CPU.

    Each run starts from the same weights and batches. The loss of the first batch in eval mode (no dropout:
    the device's random numbers are not the CPU's) is compared with the CPU's: ``loss_rel_diff_vs_cpu``."""
    shape, dtype = FEATURES[family]
    shape = DRY_FEATURES[family] if check.args.dry else shape
    rng = np.random.default_rng(1)
    n, batch = check.sizes["train_images"], check.sizes["batch"]
    x = torch.from_numpy(random_features(shape, dtype, n, rng))
    counts = torch.full((n,), shape[0], dtype=torch.int64) if len(shape) == 2 else None
    cpu = torch.device("cpu")
    runs = [("cpu", cpu, False, check.sizes["cpu_steps"]),  # first: the reference loss
            ("float32", check.device, False, check.sizes["steps"]),
            ("bf16", check.device, True, check.sizes["steps"])]
    data = pool = None
    losses: dict[str, float] = {}
    for label, device, amp, steps in runs:
        s = family_settings(check, family, device, amp)
        spec = model_spec(s)
        if data is None:
            codec = codec_of(spec.text_input, DRY_WORDS if check.args.dry else WORDS)
            data = caption_set(x, codec, n, rng, counts)
            order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).numpy()
            pool = [data.batch(order[(k * batch) % (len(order) - batch):][:batch]) for k in range(POOL)]
        torch.manual_seed(0)
        model = build_model(s, data.codec.vocab_size, shape, spec)
        reset_peak(device)
        with tempfile.TemporaryDirectory() as run_dir:
            objective = build_objective(s)
            trainer = Trainer(s, model, objective, data, data, Path(run_dir), device, log=lambda _: None)
            if next(model.parameters()).device.type != device.type:
                raise RuntimeError(f"the model is on {next(model.parameters()).device}, not {device}")
            model.eval()
            with torch.no_grad():
                losses[label] = float(objective(model, batch_to(pool[0], device), 0, lambda d=device, a=amp:
                                                autocast(d, a)))
            model.train()
            if not steps:
                continue
            for b in pool[:2]:
                trainer._step(b)  # warm-up: kernels chosen, Adam's moments allocated
            seconds = timed(lambda t=trainer, k=steps, p=pool: [t._step(p[i % POOL]) for i in range(k)],
                            device)
        record[label] = {"step_ms": round(1000 * seconds / steps, 2), "peak_gpu_mib": peak_mib(device),
                         "captions_per_s": round(steps * batch / seconds, 1)}
        if label != "cpu":
            record[label]["loss_rel_diff_vs_cpu"] = relative_difference(
                torch.tensor(losses[label]), torch.tensor(losses["cpu"]))
    record["first_loss"] = {k: round(v, 6) for k, v in losses.items()}
    record["parameters"] = model.parameter_report()["total"]
    record["text_input"], record["features"] = spec.text_input, f"{list(shape)} {dtype}"


# -- evaluation and the loader -------------------------------------------------------------------------

def evaluation(check: Check, record: dict[str, Any]) -> None:
    """Seconds to rank COCO-5k and COCO-1k on the device (order violation and cosine), twice each; on the CPU
    beside it, cosine on every protocol and order on the last (1k; order on 5k took minutes there). Each
    CPU result is compared with the device's (:func:`compare_results`)."""
    n, d = check.sizes["eval_images"], 1024
    gen = torch.Generator().manual_seed(2)
    # like a trained model's (R@1 about 50 on 1k): each caption is its image plus noise, so ranks mean
    # something and CPU/device rounding flips only near-ties (pure noise ties within float32 steps often)
    images = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1).abs()
    caption_image = torch.arange(5 * n) // 5
    captions = torch.nn.functional.normalize(
        images[caption_image] + EVAL_NOISE * torch.randn(5 * n, d, generator=gen), dim=1).abs()
    protocols = check.sizes["eval_protocols"]
    record["embeddings"] = (f"{n} images, {5 * n} captions (image + {EVAL_NOISE} x N(0, 1), normalised, "
                            f"absolute), d {d}; protocols {', '.join(protocols)}")
    cpu = torch.device("cpu")
    for measure in ("order", "cosine"):
        reset_peak(check.device)
        results: list[dict[str, Any]] = []
        seconds = [timed(lambda m=measure, r=results: r.append(evaluate_protocols(
            images, captions, caption_image, m, protocols, device=check.device)), check.device)
            for _ in range(2)]
        record[measure] = {"first_s": round(seconds[0], 3), "second_s": round(seconds[1], 3),
                           "peak_gpu_mib": peak_mib(check.device)}
        on_cpu = protocols if measure == "cosine" else protocols[-1:]
        reference: dict[str, Any] = {}
        cpu_seconds = timed(lambda m=measure, p=on_cpu, r=reference: r.update(
            evaluate_protocols(images, captions, caption_image, m, p, device=cpu)), cpu)
        record[f"{measure}_cpu"] = {"protocols": list(on_cpu), "first_s": round(cpu_seconds, 3)}
        record[measure].update(compare_results(results[-1], reference))
        record[measure]["rsum"] = {p: round(r.metrics.rsum, 2) for p, r in results[-1].items()}


def loader(check: Check, record: dict[str, Any]) -> None:
    """Batches read from a region store per batch and moved to the device, with 0, 2, 4 and 8 worker
    processes (``--dry``: 0 and 1): seconds to the first batch (the workers' start) and captions/s after
    it; the same with the store's ``features recompress --codec lz4`` copy (``lz4_workers_N``: fewest and
    most workers); then clmr's float32 step fed by that loader, against its step on batches already in
    memory (``steps.clmr``): whether the data path keeps the device busy."""
    rng = np.random.default_rng(3)
    n, batch = check.sizes["loader_rows"], check.sizes["batch"]
    pin = check.device.type == "cuda"
    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        shape = DRY_LOADER_ROWS if check.args.dry else FEATURES["clmr"][0]
        store = region_store(Path(folder) / "regions.zarr", n, shape, rng)
        rows, _ = open_rows(store)
        record["store_write_s"] = round(time.perf_counter() - t0, 2)
        counts = torch.full((n,), shape[0], dtype=torch.int64)
        data = caption_set(rows, codec_of("words", DRY_WORDS if check.args.dry else WORDS), n, rng, counts)
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).numpy()
        batches = [order[(k * batch) % (len(order) - batch):][:batch]
                   for k in range(check.sizes["loader_batches"])]
        record["batches"] = f"{len(batches)} of {batch} captions, {n} images of {list(shape)} float16"

        def feed(workers: int, step: Any) -> dict[str, float]:
            sync(check.device)
            t0 = time.perf_counter()
            first = t0
            for k, b in enumerate(batch_loader(data, batches, workers=workers, pin_memory=pin)):
                step(b)
                if k == 0:
                    sync(check.device)
                    first = time.perf_counter()
            sync(check.device)
            seconds = time.perf_counter() - first
            return {"first_batch_s": round(first - t0, 3),
                    "captions_per_s": round((len(batches) - 1) * batch / seconds, 1),
                    "batch_ms": round(1000 * seconds / (len(batches) - 1), 1)}

        for workers in check.sizes["loader_workers"]:
            record[f"workers_{workers}"] = feed(workers, lambda b: batch_to(b, check.device))
        t0 = time.perf_counter()
        recompress_store(store.split(":")[0], Path(folder) / "lz4.zarr", "lz4")
        record["lz4_recompress_s"] = round(time.perf_counter() - t0, 2)
        zstd_images, data.images = data.images, ImageRows(open_rows(f"{folder}/lz4.zarr:regions")[0],
                                                          np.arange(n), counts)
        for workers in sorted({min(check.sizes["loader_workers"]), max(check.sizes["loader_workers"])}):
            record[f"lz4_workers_{workers}"] = feed(workers, lambda b: batch_to(b, check.device))
        data.images = zstd_images
        s = family_settings(check, "clmr", check.device, False)
        torch.manual_seed(0)
        model = build_model(s, data.codec.vocab_size, shape, model_spec(s))
        with tempfile.TemporaryDirectory() as run_dir:
            trainer = Trainer(s, model, build_objective(s), data, data, Path(run_dir), check.device,
                              log=lambda _: None)
            trainer._step(data.batch(batches[0]))  # warm-up
            for workers in check.sizes["loader_workers"]:
                record[f"clmr_step_fed_workers_{workers}"] = feed(workers, trainer._step)


# -- the command ---------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (with --dry)")
    p.add_argument("--dry", action="store_true", help="tiny sizes (a few seconds of work)")
    p.add_argument("--json", metavar="FILE", default="gpu_check.json",
                   help="where the numbers go: a new file in an existing folder (an existing file only with "
                        "--overwrite), checked before any work")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    p.add_argument("--families", nargs="+", default=list(FEATURES), choices=list(FEATURES),
                   help="families to step (default: every one)")
    p.add_argument("--images", type=int, help=f"images to extract, at most {MAX_IMAGES:,} (default 300)")
    p.add_argument("--steps", type=int, help="timed steps per family and precision (default 200; --dry 2)")
    p.add_argument("--cpu-steps", type=int, help="steps on the CPU beside the device's (default 2; 0: none)")
    p.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES),
                   help="stages to run (default: every one)")
    p.add_argument("--keep-going", action="store_true",
                   help="after a stage's error, run the stages after it (each error one line and in the "
                        "JSON's 'errors'; the exit status is still 1): every broken path from one call")
    return p.parse_args(argv)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse, before any work, a count the check cannot use (``--steps -1`` "passed" at -1,471,129
    captions/s), an output the other commands refuse (:func:`vsecore.outputs.check_output_file`), a missing
    folder."""
    counts = (("--images", args.images, 1, MAX_IMAGES), ("--steps", args.steps, 1, 10**6),
              ("--cpu-steps", args.cpu_steps, 0, 10**6))
    for option, value, low, high in counts:
        if value is not None and not low <= value <= high:
            raise UserError(f"{option} {value}: must be {low:,} to {high:,}")
    check_output_file(args.json, overwrite=args.overwrite, option="--json")
    folder = Path(args.json).parent
    if not folder.is_dir():
        raise UserError(f"--json {args.json}: no folder {folder}; create it or write elsewhere")


def run_check(check: Check) -> list[str]:
    """Every stage in turn, the JSON rewritten after each: the stages' errors (with ``--keep-going``; else
    the first ends the check as :class:`CheckFailed`)."""
    stages: list[tuple[str, Any]] = [("extraction", extraction)]
    stages += [(f"steps.{family}", lambda c, r, f=family: family_steps(c, f, r))
               for family in check.args.families]
    stages += [("evaluation", evaluation), ("loader", loader), ("training", training)]
    stages = [(name, stage) for name, stage in stages if name.split(".")[0] in check.args.stages]
    errors: list[str] = []
    for name, stage in stages:
        try:
            with check.stage(name) as record:
                stage(check, record)
        except CheckFailed as failed:
            if not check.args.keep_going:
                raise
            errors.append(str(failed))
            print(f"gpu_check: error: {failed}", file=sys.stderr, flush=True)
            check.out["errors"] = errors
        write(check)
    return errors


def write(check: Check) -> None:
    """The JSON so far, replacing the file whole (a check killed while writing leaves the previous one)."""
    check.out["wall_s"] = round(time.perf_counter() - check.t0, 1)
    write_json_atomic(check.args.json, check.out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_arguments(args)
    except UserError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    try:
        device = resolve_device(args.device)
        if args.device.startswith("cuda") and device.type != "cuda":
            raise RuntimeError(f"--device {args.device} resolved to {device}")
    except Exception as exc:  # noqa: BLE001 - no CUDA is the first error: one line, no CPU fallback
        print(f"gpu_check: error: device: {(str(exc).splitlines() or [''])[0]}", file=sys.stderr)
        return 1
    if device.type != "cuda" and not args.dry:
        print("gpu_check: error: a full check runs on a GPU (--device cuda); use --dry for the CPU",
              file=sys.stderr)
        return 1
    check = Check(args, device)
    try:
        errors = run_check(check)
    except CheckFailed as failed:
        check.out["error"] = str(failed)
        write(check)
        print(f"gpu_check: error: {failed}", file=sys.stderr)
        return 1
    if errors:
        check.out["error"] = errors[0]
        write(check)
        print(f"gpu_check: {len(errors)} stage(s) failed; numbers in {args.json}", file=sys.stderr)
        return 1
    write(check)
    print(f"gpu_check: all stages passed in {check.out['wall_s']:.0f} s; numbers in {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
