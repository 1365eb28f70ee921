"""The extraction stage of ``bench/gpu_check.py`` (its JSON's ``extraction``): the 10-crop mapper on images in
memory, then ``features cnn`` end to end from JPEG files, each checked against the CPU's rows.

- ``global_float32``, ``global_amp``, ``fne_float32``, ``fne_amp`` (and ``*_cpu``): the mapper alone on
  ``--images`` synthetic 640 x 480 images, 16 images (160 crops) a pass, images/s, and as ``features`` runs it
  (``prepared_images_per_s``: pixels resized beforehand in 4 threads); rows of the first few images against
  the CPU's (``rel_diff_vs_cpu``); ``crops_equal_cpu``: the device's normalised crops are the CPU's bits.
- ``jpeg``: ``features cnn`` (10-crop VGG19, random weights, default batch and decode threads, block 256) on
  JPEG files written here, with the host's PIL decoding (``pil``) and the device's (``torchvision``: nvjpeg
  on CUDA), in float32 (TF32 convolutions, torch's default) and bf16 autocast (``--amp``): images/s of a
  second run (the first, ``first_run_images_per_s``, includes cuDNN's kernel search), against the targets of
  issue 44 (1,000 images/s in bf16, 500 in float32); each run's rows of the first images against the CPU's
  with the same decoder (``rel_diff_vs_cpu``), and the device decoder's rows against the host decoder's on
  the device (``decoder_rel_diff``).
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_features import make_dataset
from gpu_check_data import peak_mib, relative_difference, reset_peak, timed

from features.extractors.backbones import load_backbone
from features.extractors.crop_mapper import ImageMapper
from features.extractors.crops import normalization_table, pixel_crops, resized_pixels
from features.run import run_features
from features.settings import features_settings
from features.store.core import FeatureStore

#: ``features cnn`` from JPEG files: how many, the network and crop size, CPU reference images
JPEG_SIZES = {"real": {"files": 2048, "cnn": "vgg19", "input_size": None, "reference": 4, "runs": 2},
              "dry": {"files": 4, "cnn": "resnet18", "input_size": 32, "reference": 2, "runs": 1}}
#: issue 44's targets for 10-crop VGG19 from JPEG files, images/s
TARGETS = {"bf16": 1000, "float32": 500}
#: images per pass of the mapper alone (160 crops, as the check always ran it)
PASS_IMAGES = 16


def extraction(check: Any, record: dict[str, Any]) -> None:
    """The whole stage (see the module docstring); an error is the stage's (``gpu_check.Check.stage``)."""
    mapper_rates(check, record)
    record["jpeg"] = jpeg_extraction(check)


def mapper_rates(check: Any, record: dict[str, Any]) -> None:
    """Images/s of the mapper (10 crops) for global features and the FNE, float32 and AMP, and on the CPU;
    each device's rows of the first few images against the CPU's. The crops the device normalises and cuts
    must be the CPU's bit for bit (an error otherwise)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8))
              for _ in range(check.sizes["images"])]
    few = images[: max(1, min(8, len(images)))]
    backbone = load_backbone(check.sizes["cnn"], "none", input_size=check.sizes["input_size"])
    record["cnn"] = f"{check.sizes['cnn']} (random weights), {len(images)} images of 640 x 480, 10 crops"
    for kind in ("global", "fne"):
        # the CPU beside it, on a few images: the reference of the device's rows
        mapper = ImageMapper(backbone, kind=kind, crops=10, device="cpu")
        cpu_seconds = timed(lambda m=mapper: m(few), check.device)
        (reference,) = mapper(few).values()
        record[f"{kind}_cpu"] = {"images_per_s": round(len(few) / cpu_seconds, 2)}
        for amp in (False, True):
            record[f"{kind}_{'amp' if amp else 'float32'}"] = device_rates(check, backbone, kind, amp, images,
                                                                           reference)
    backbone.model.to("cpu")
    pixels = resized_pixels(few[0], backbone.resize, backbone.interpolation)
    on_cpu = pixel_crops(pixels, normalization_table(backbone.mean, backbone.std), backbone.input_size)
    table = normalization_table(backbone.mean, backbone.std, check.device)
    on_device = pixel_crops(pixels.to(check.device), table, backbone.input_size).cpu()
    record["crops_equal_cpu"] = torch.equal(on_device, on_cpu)
    if not record["crops_equal_cpu"]:
        raise RuntimeError("the crops normalised and cut on the device differ from the CPU's")


def device_rates(check: Any, backbone: Any, kind: str, amp: bool, images: list[Any],
                 reference: np.ndarray) -> dict[str, Any]:
    """The mapper on the device: on images, on pixels prepared in 4 threads; its rows against the CPU's."""
    reset_peak(check.device)
    mapper = ImageMapper(backbone, kind=kind, crops=10, batch_size=PASS_IMAGES, device=check.device, amp=amp)
    mapper(images[:1])  # warm-up: cuDNN picks its kernels
    rows: dict[str, np.ndarray] = {}
    seconds = timed(lambda: rows.update(mapper(images)), check.device)
    with ThreadPoolExecutor(4) as pool:  # as `features` runs it: the resize in the decode threads
        t0 = time.perf_counter()
        items = list(pool.map(mapper.prepare, images))
        prepare_s = time.perf_counter() - t0
    prepared_s = timed(lambda: mapper(items), check.device)
    return {"images_per_s": round(len(images) / seconds, 2), "peak_gpu_mib": peak_mib(check.device),
            "prepared_images_per_s": round(len(images) / prepared_s, 2),
            "prepare_4_threads_images_per_s": round(len(images) / prepare_s, 2),
            "rel_diff_vs_cpu": relative_difference(rows[next(iter(mapper.outputs))][: len(reference)],
                                                   reference)}


def jpeg_extraction(check: Any) -> dict[str, Any]:
    """``features cnn`` from JPEG files with each decoder and precision (see the module docstring)."""
    sizes = JPEG_SIZES["dry" if check.args.dry else "real"]
    out: dict[str, Any] = {"sizes": dict(sizes), "targets_images_per_s": TARGETS, "tf32": tf32_flags()}
    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        files = write_jpegs(Path(folder) / "images", sizes["files"])
        out["write_jpegs_s"] = round(time.perf_counter() - t0, 2)
        out["jpeg_kib"] = round(sum(f.stat().st_size for f in files) / len(files) / 1024, 1)
        data = make_dataset(Path(folder) / "prep", files)
        device_rows: dict[str, np.ndarray] = {}
        for decoder in ("pil", "torchvision"):
            reference = cpu_rows(sizes, files[: sizes["reference"]], decoder)
            for precision in ("float32", "bf16"):
                name = f"{decoder}_{precision}"
                out[name], rows = features_run(check, sizes, data, Path(folder) / name, decoder, precision)
                out[name]["rel_diff_vs_cpu"] = relative_difference(rows[: len(reference)], reference)
                out[name]["meets_target"] = out[name]["images_per_s"] >= TARGETS[precision]
                device_rows[name] = rows
        for precision in ("float32", "bf16"):
            on_device, on_host = device_rows[f"torchvision_{precision}"], device_rows[f"pil_{precision}"]
            out[f"decoder_rel_diff_{precision}"] = relative_difference(on_device, on_host)
    return out


def features_run(check: Any, sizes: dict[str, Any], data: Path, folder: Path, decoder: str,
                 precision: str) -> tuple[dict[str, Any], np.ndarray]:
    """``features cnn`` twice into two stores (the first warms cuDNN up; ``--dry``: once); the last one's rate
    and rows."""
    rates = []
    for run in ("first", "second")[: sizes["runs"]]:
        settings = features_settings(kind="cnn", data=str(data), out=str(folder / f"{run}.zarr"),
                                     cnn=sizes["cnn"], weights="none", crops=10,
                                     input_size=sizes["input_size"], device=str(check.device),
                                     amp=precision == "bf16", decoder=decoder)
        reset_peak(check.device)
        run_features(settings, progress=False)
        store = FeatureStore(folder / f"{run}.zarr")
        summary = store.attrs["summary"]
        rates.append(round(summary["rows_written"] / max(summary["seconds"], 1e-9), 1))
    rows = np.asarray(store.array("global")[:])
    return {"images_per_s": rates[-1], "first_run_images_per_s": rates[0],
            "peak_gpu_mib": peak_mib(check.device), "failed": summary["failed"]}, rows


def cpu_rows(sizes: dict[str, Any], files: list[Path], decoder: str) -> np.ndarray:
    """The rows of ``files`` on the CPU, float32, with ``decoder`` (the same random weights: seed 0)."""
    backbone = load_backbone(sizes["cnn"], "none", input_size=sizes["input_size"])
    mapper = ImageMapper(backbone, crops=10, device="cpu", decoder=decoder)
    return mapper([mapper.load(str(f), resize=mapper.resize) for f in files])["global"]


def write_jpegs(folder: Path, n: int) -> list[Path]:
    """``n`` 640 x 480 JPEGs (quality 90) of smooth random colour fields with a little noise: files of the
    size and decoding cost of photos (pure noise would be several times larger)."""
    from PIL import Image

    folder.mkdir(parents=True)

    def one(k: int) -> Path:
        rng = np.random.default_rng(k)
        coarse = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).resize((640, 480),
                                                                                           Image.BICUBIC)
        pixels = np.asarray(coarse, dtype=np.int16) + rng.integers(-12, 13, (480, 640, 3), dtype=np.int16)
        path = folder / f"{k:06d}.jpg"
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=90)
        return path

    with ThreadPoolExecutor() as pool:
        return list(pool.map(one, range(n)))


def tf32_flags() -> dict[str, Any]:
    """Whether float32 convolutions and matrix products may use TF32 (torch's defaults: convolutions yes)."""
    return {"cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}
