"""Full-COCO scale on synthetic stores: data loading, the model step, memory, disk and the 5k test evaluation.

Builds, under ``--root`` (default ``/work/scale-data``), a prepared dataset and feature stores of Karpathy
COCO's size from random numbers, with no CNN:

- ``source/dataset_coco.json``: a Karpathy split file (113,287 train images of which 30,504 restval, 5,000
  val, 5,000 test; 616,767 captions, up to 7 per image as in the real file), captions of random words drawn
  from a Zipf law over 20,000 invented words (6 to 25 words, about 11 on average, as COCO's). ``prep coco
  --karpathy`` turns it into ``data/`` (the toolkit's own prep: tokenizer, train-only vocabularies, 5
  captions per image kept);
- ``vgg19-global.zarr`` (N, 4096) float32 and ``resnet152-global.zarr`` (N, 2048) float32: rectified normal
  values (about half zeros, like ReLU features);
- ``vgg16-fne.zarr``: ``fne/ternary`` (N, 12,416) int8 in {-1, 0, 1} with the frequencies a standardized
  feature gets at thresholds -0.25 / 0.15, its ``fne/mean`` and ``fne/std`` (no ``fne/raw``: training
  reads the ternary array only);
- ``grid-regions.zarr``: ``regions`` (N, 49, 1280) float16 (rectified normal) and ``counts`` (all 49).

Every store is written block by block with :class:`features.store.core.FeatureStore` (block size 256, as
``features``), records the dataset's ``images_sha256`` and is complete, so the readers' checks run as for
a real one. Then, in one subprocess per family and phase (so peak memories do not mix):

- ``load``: the run's data loading (``train.retrieval.fit``'s own: dataset, codec, features, train and val
caption
  sets), then one epoch's batches with the model step stubbed out (``--load-seconds`` at most);
- ``train``: the same data, the family's model, objective and :class:`train.engine.trainer.Trainer`, and
  ``--steps`` real optimisation steps; one step's FLOPs are counted (``torch.utils.flop_counter``);
- ``eval``: the test split read as ``train evaluate`` reads it, embedded, and ranked under every protocol.

Peak resident memory is ``ru_maxrss`` of each subprocess. Prints a table; ``--json FILE`` keeps the numbers.

    PYTHONPATH=. python bench/bench_scale.py                      # full size (about 20 GB under --root)
    PYTHONPATH=. python bench/bench_scale.py --scale 0.01 --steps 3 --load-seconds 5   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Karpathy COCO: images per split of dataset_coco.json, and its number of captions
COCO_SPLITS = {"train": 82_783, "restval": 30_504, "val": 5_000, "test": 5_000}
COCO_CAPTIONS = 616_767
WORDS, ZIPF = 20_000, 1.15
#: family -> (store file, key): the features each family's COCO pipeline reads
FAMILY_FEATURES = {
    "chain": ("vgg19-global.zarr", "global"), "oecc": ("vgg19-global.zarr", "global"),
    "seam": ("vgg19-global.zarr", "global"), "vse": ("vgg16-fne.zarr", "fne"),
    "clmr": ("grid-regions.zarr", "regions"), "liwe": ("grid-regions.zarr", "regions"),
}
PHASES = ("load", "train", "eval")
#: ``--codec lz4``: the region families read this copy of ``grid-regions.zarr`` (``features recompress``)
LZ4_REGIONS = "grid-regions-lz4.zarr"
FNE_WIDTH = 12_416  # VGG16: 13 conv layers + fc6 + fc7 (features/extractors/full_network.py)
BLOCK = 256
GIB = 2**30


# -- the synthetic dataset and stores ----------------------------------------------------------------

def split_sizes(scale: float) -> dict[str, int]:
    """Images per Karpathy split at ``scale`` (at least 2 each)."""
    return {k: max(2, round(v * scale)) for k, v in COCO_SPLITS.items()}


def random_words(rng: np.random.Generator) -> np.ndarray:
    """:data:`WORDS` distinct lowercase invented words, 1 to 12 letters, with English letter frequencies."""
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    freq = np.array([12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0,
                     2.0, 1.9, 1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07])
    out: dict[str, None] = {}
    while len(out) < WORDS:
        length = int(np.clip(rng.poisson(4.5), 1, 12))
        out["".join(rng.choice(letters, length, p=freq / freq.sum()))] = None
    return np.array(list(out))


def write_karpathy(path: Path, scale: float, seed: int) -> dict[str, int]:
    """The Karpathy split file of the synthetic COCO; returns the images per split."""
    rng = np.random.default_rng(seed)
    words = random_words(rng)
    sizes = split_sizes(scale)
    n = sum(sizes.values())
    per_image = np.full(n, 5)
    extra = round((COCO_CAPTIONS - 5 * sum(COCO_SPLITS.values())) * scale)
    per_image[rng.choice(n, extra, replace=False)] += rng.integers(1, 3, extra)
    splits = np.repeat(list(sizes), list(sizes.values()))
    images, sentid = [], 0
    for imgid in range(n):
        sentences = []
        for _ in range(per_image[imgid]):
            length = int(np.clip(rng.normal(11, 2.5), 6, 25))
            tokens = words[np.minimum(rng.zipf(ZIPF, length), WORDS) - 1].tolist()
            sentences.append({"raw": " ".join(tokens).capitalize() + ".", "sentid": sentid})
            sentid += 1
        folder = "val2014" if splits[imgid] in ("val", "test", "restval") else "train2014"
        images.append({"filepath": folder, "filename": f"COCO_{folder}_{imgid:012d}.jpg", "imgid": imgid,
                       "cocoid": imgid, "split": str(splits[imgid]), "sentences": sentences,
                       "sentids": [s["sentid"] for s in sentences]})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"dataset": "coco", "images": images}), encoding="utf-8")
    return sizes


def write_store(path: Path, dataset: Any, outputs: dict[str, Any], dtypes: dict[str, str], kind: str,
                fill: Any, seed: int) -> None:
    """A complete store of ``dataset``'s images, block by block: ``fill(rng, rows) -> {name: values}``."""
    from features.store.core import FeatureStore

    fingerprint = dataset.images_fingerprint()
    n = len(dataset.images)
    store = FeatureStore.create(path, np.arange(n), outputs, block_size=BLOCK, overwrite=True,
                                config={"kind": kind, "images_sha256": fingerprint, "random": seed},
                                provenance={"network": "random numbers (bench/bench_scale.py)",
                                            "dataset": str(dataset.root), "images_sha256": fingerprint},
                                dtypes=dtypes)
    rng = np.random.default_rng(seed)
    for b in range(store.n_blocks):
        start, stop = store.block_rows(b)
        store.write_block(b, fill(rng, stop - start), np.ones(stop - start, dtype=bool), [])
    store.set_attrs(complete=True)


def rectified(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Rectified standard normal values (about half zeros, like ReLU features)."""
    return np.maximum(rng.standard_normal(shape, dtype=np.float32), 0).astype(dtype)


def ternary(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """{-1, 0, 1} int8 with the frequencies of a standard normal cut at -0.25 and 0.15."""
    u = rng.random(shape, dtype=np.float32)
    return (np.int8(1) - (u < 0.5596).astype(np.int8) - (u < 0.4013).astype(np.int8)).astype(np.int8)


def write_fne_statistics(path: Path) -> None:
    """``fne/mean`` and ``fne/std`` as ``features fne`` writes them, and the ternary thresholds."""
    from features.store.core import FeatureStore
    from features.store.layout import ARRAY_CONFIG

    store = FeatureStore(path, mode="r+")
    for name, value in (("fne/mean", 0.0), ("fne/std", 1.0)):
        array = store.group.create_array(name, shape=(FNE_WIDTH,), chunks=(FNE_WIDTH,), dtype="float32",
                                         fill_value=np.nan, config=ARRAY_CONFIG)
        array[:] = np.full(FNE_WIDTH, value, np.float32)
    store.array("fne/ternary").attrs["thresholds"] = [-0.25, 0.15]
    store.set_attrs(complete=True)


def build(root: Path, scale: float, seed: int) -> dict[str, Any]:
    """Prepared dataset and stores under ``root`` (kept and reused when built at the same scale)."""
    record = root / "bench_scale.json"
    if record.is_file() and json.loads(record.read_text())["scale"] == scale:
        return json.loads(record.read_text())
    t0 = time.perf_counter()
    sizes, prep = build_dataset(root, scale, seed)
    t_prep = time.perf_counter()
    from prep.dataset import PreparedDataset

    ds = PreparedDataset.load(root / "data")
    write_store(root / "vgg19-global.zarr", ds, {"global": 4096}, {}, "cnn",
                lambda r, m: {"global": rectified(r, (m, 4096), "float32")}, seed)
    write_store(root / "resnet152-global.zarr", ds, {"global": 2048}, {}, "cnn",
                lambda r, m: {"global": rectified(r, (m, 2048), "float32")}, seed + 1)
    write_store(root / "vgg16-fne.zarr", ds, {"fne/ternary": FNE_WIDTH}, {"fne/ternary": "int8"}, "fne",
                lambda r, m: {"fne/ternary": ternary(r, (m, FNE_WIDTH))}, seed + 2)
    write_fne_statistics(root / "vgg16-fne.zarr")
    write_store(root / "grid-regions.zarr", ds, {"regions": (49, 1280), "counts": ()},
                {"regions": "float16", "counts": "int32"}, "regions",
                lambda r, m: {"regions": rectified(r, (m, 49, 1280), "float16"),
                              "counts": np.full(m, 49, np.int32)}, seed + 3)
    counts = ds.counts()
    out = {"scale": scale, "sizes": sizes, "counts": counts, "prep_s": t_prep - t0,
           "prep_peak_rss": prep["peak_rss"], "stores_s": time.perf_counter() - t_prep,
           "disk": {p.name: du(p) for p in sorted(root.iterdir()) if p.is_dir()}}
    record.write_text(json.dumps(out, indent=1))
    return out


def build_dataset(root: Path, scale: float, seed: int) -> tuple[dict[str, int], dict[str, Any]]:
    """The Karpathy file and ``prep coco``'s prepared dataset under ``root`` (and the caption caches of an
    earlier one removed): ``(images per split, prep's peak RSS)``."""
    for old in ("data", "data.vse-captions"):
        shutil.rmtree(root / old, ignore_errors=True)
    source = root / "source" / "dataset_coco.json"
    sizes = write_karpathy(source, scale, seed)
    prep = child([sys.executable, "-m", "prep", "coco", "--karpathy", str(source),
                  "--out", str(root / "data"), "-q"], measure=True)
    return sizes, prep


def du(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# -- one family, one phase, in its own process --------------------------------------------------------

def peak_rss() -> int:
    """Peak resident memory of this process, bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def features_store(family: str, codec: str = "zstd") -> tuple[str, str]:
    """``(store file, key)`` the family reads: :data:`FAMILY_FEATURES`, the region store's ``lz4`` copy
    with ``codec`` lz4."""
    store, key = FAMILY_FEATURES[family]
    return (LZ4_REGIONS if codec == "lz4" and key == "regions" else store), key


def lz4_regions(root: Path) -> float:
    """Make ``root/``:data:`LZ4_REGIONS` from ``grid-regions.zarr`` with ``features recompress`` (the
    command, as a user runs it) unless it is there; returns the seconds it took (0 when it was there)."""
    out = root / LZ4_REGIONS
    meta = out / "zarr.json"
    if meta.is_file() and json.loads(meta.read_text())["attributes"].get("complete"):
        return 0.0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "features", "recompress", str(root / "grid-regions.zarr"),
                    "--codec", "lz4", "--out", str(out)], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def settings_of(family: str, root: Path, scale: float, dataset: Any = None, codec: str = "zstd") -> Any:
    """The family's train settings on the synthetic data, resolved as ``train <family>`` resolves it
    (``dataset``: the prepared dataset already loaded, else it is read; ``codec``: :func:`features_store`)."""
    from prep.dataset import PreparedDataset
    from train.config.run import absolute_settings
    from train.models.family import train_settings, with_data_defaults, with_family_defaults

    store, key = features_store(family, codec)
    extra = {} if scale >= 1 else {"val_protocol": "all"}  # the 5cv folds need 5,000 test images
    settings = train_settings(family=family, data=str(root / "data"), features=f"{root / store}:{key}",
                              out=str(root / "runs" / family), device="cpu", **extra)
    settings = absolute_settings(with_family_defaults(settings, "coco"))
    return with_data_defaults(settings, dataset or PreparedDataset.load(settings.data))


def phase_load(family: str, root: Path, scale: float, seconds: float, workers: int | None = None,
               codec: str = "zstd") -> dict[str, Any]:
    """Data loading as ``train`` does it, then the epoch's batches with the model step stubbed out, read in
    ``workers`` processes (None: the family's ``--workers``) and moved to the CPU as the step would."""
    import torch

    from prep.dataset import PreparedDataset
    from train.engine.data import batch_loader, epoch_batches
    from train.engine.inference import batch_to
    from train.models.family import model_spec
    from train.retrieval.fit import _load_data

    s = settings_of(family, root, scale, codec=codec)
    if workers is not None:
        s = s.model_copy(update={"workers": workers})
    t0 = time.perf_counter()
    train_set, val_set, _ = _load_data(s, model_spec(s), PreparedDataset.load(s.data))
    load_s = time.perf_counter() - t0
    rss_loaded = peak_rss()
    batches = epoch_batches(train_set, s.batch_size, s.captions_per_epoch, torch.Generator().manual_seed(0))
    captions, t1, done = 0, time.perf_counter(), 0
    device = torch.device("cpu")
    for batch in batch_loader(train_set, batches, workers=s.workers):
        batch_to(batch, device)  # as the trainer's step does: the features become float32 (here, on the CPU)
        captions += int(batch.lengths.shape[0])
        done += 1
        if time.perf_counter() - t1 > seconds:
            break
    rate = captions / (time.perf_counter() - t1)
    return {"load_s": load_s, "train_captions": len(train_set), "train_images": train_set.num_images,
            "val_captions": len(val_set), "epoch_batches": len(batches), "batches_timed": done,
            "epoch_captions": sum(len(b) for b in batches), "stub_captions_per_s": rate, "workers": s.workers,
            "features_in_memory": isinstance(train_set.images.features, torch.Tensor),
            "rss_after_load": rss_loaded, "peak_rss": peak_rss()}


def phase_train(family: str, root: Path, scale: float, steps: int, codec: str = "zstd") -> dict[str, Any]:
    """The real step (forward, loss, backward, Adam) on ``steps`` batches of the epoch's order."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from prep.dataset import PreparedDataset
    from train.engine.data import batch_loader, epoch_batches
    from train.engine.trainer import Trainer
    from train.models.family import build_objective, model_spec
    from train.models.joint import build_model
    from train.retrieval.fit import _load_data

    s = settings_of(family, root, scale, codec=codec)
    train_set, val_set, config = _load_data(s, model_spec(s), PreparedDataset.load(s.data))
    torch.manual_seed(s.seed)
    model = build_model(s, config["vocab_size"], config["feature_shape"], model_spec(s))
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(s, model, build_objective(s), train_set, val_set, Path(run_dir),
                          torch.device("cpu"), log=lambda _: None)
        shuffle = torch.Generator().manual_seed(0)
        batches = epoch_batches(train_set, s.batch_size, s.captions_per_epoch, shuffle)
        loader = iter(batch_loader(train_set, batches[:steps + 2], workers=s.workers))
        trainer._step(next(loader))  # warm-up
        with FlopCounterMode(display=False) as flops:
            trainer._step(next(loader))
        captions, t0 = 0, time.perf_counter()
        for batch in loader:
            trainer._step(batch)
            captions += int(batch.lengths.shape[0])
        elapsed = time.perf_counter() - t0
    timed = min(steps, max(0, len(batches) - 2))
    return {"steps": timed, "step_s": elapsed / max(1, timed),
            "step_captions_per_s": captions / elapsed if elapsed else 0.0,
            "step_flops": flops.get_total_flops(),
            "parameters": model.parameter_report()["total"], "batch_size": s.batch_size,
            "threads": torch.get_num_threads(), "peak_rss": peak_rss()}


def phase_eval(family: str, root: Path, scale: float, eval_captions: int, codec: str = "zstd"
               ) -> dict[str, Any]:
    """The test split as ``train evaluate`` reads it (``LoadedRun.caption_set``), embedded by the family's
    model (random weights: the work does not depend on them) and ranked under every protocol it allows.

    Every image is embedded; the first ``eval_captions`` captions are (their time scaled to all of them),
    and the ranking runs on all M caption rows (those embeddings repeated: ranking time and memory do not
    depend on the values)."""
    import torch

    from prep.dataset import PreparedDataset
    from train.engine.codecs import codec_for
    from train.engine.data import load_caption_set, read_features, read_region_counts
    from train.engine.inference import embed_codes, embed_images
    from train.models.family import model_spec
    from train.models.joint import build_model
    from train.retrieval.evaluate import PROTOCOLS, protocol_folds
    from train.retrieval.evaluate.entry import Embedded, evaluate_retrieval
    from vsecore.errors import UserError

    s = settings_of(family, root, scale, codec=codec)
    t0 = time.perf_counter()
    dataset = PreparedDataset.load(s.data)
    codec = codec_for(s, dataset, model_spec(s).text_input)
    x, valid = read_features(s.features, dataset)
    test = load_caption_set(dataset, x, valid, "test", s.lang, s.max_chars, codec=codec,
                            counts=read_region_counts(s.features))
    t1 = time.perf_counter()
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    model = build_model(s, codec.vocab_size, tuple(x.shape[1:]), model_spec(s))
    images = embed_images(model, test.images, cpu)
    t2 = time.perf_counter()
    k = min(eval_captions, len(test))
    some = embed_codes(model, [test.caption_codes(i) for i in range(k)], codec, cpu)
    captions_s = (time.perf_counter() - t2) * len(test) / k
    captions = some[torch.arange(len(test)) % k]
    protocols = []
    for p in PROTOCOLS:
        try:
            protocol_folds(p, test.num_images)
            protocols.append(p)
        except UserError:
            pass
    t3 = time.perf_counter()
    evaluate_retrieval(Embedded(images, captions, s.measure, s.order_sqrt),
                       torch.as_tensor(test.caption_image), tuple(protocols))
    return {"read_s": t1 - t0, "embed_images_s": t2 - t1, "embed_captions_s": captions_s,
            "captions_embedded": k, "embed_s": t2 - t1 + captions_s, "rank_s": time.perf_counter() - t3,
            "test_images": test.num_images, "test_captions": len(test), "protocols": protocols,
            "peak_rss": peak_rss()}


#: a Python that runs a command and prints the peak resident memory of its children (``RESULT {json}``)
MEASURE_CHILD = ("import json, resource, subprocess, sys\n"
                 "code = subprocess.run(sys.argv[1:]).returncode\n"
                 "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024\n"
                 "print('RESULT ' + json.dumps({'peak_rss': rss}))\n"
                 "sys.exit(code)\n")


def child(cmd: list[str], measure: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd`` (a phase of this script, or with ``measure`` any command) and return its result;
    ``env``: variables set for it."""
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if measure:  # peak RSS of a foreign command: wrap it in a Python that reports its child's usage
        cmd = [sys.executable, "-c", MEASURE_CHILD, *cmd]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def run_phase(args: argparse.Namespace) -> None:
    """``--phase``: one family's phase in this process; prints ``RESULT {json}``."""
    family, root = args.families[0], Path(args.root)
    if args.phase == "load":
        out = phase_load(family, root, args.scale, args.load_seconds, args.workers, args.codec)
    elif args.phase == "train":
        out = phase_train(family, root, args.scale, args.steps, args.codec)
    else:
        out = phase_eval(family, root, args.scale, args.eval_captions, args.codec)
    print("RESULT " + json.dumps(out), flush=True)


# -- the report -------------------------------------------------------------------------------------

def measure(args: argparse.Namespace, family: str) -> dict[str, Any]:
    """The three phases of ``family``, each in a fresh process."""
    base = [sys.executable, str(Path(__file__).resolve()), "--root", args.root, "--scale", str(args.scale),
            "--families", family, "--steps", str(args.steps), "--load-seconds", str(args.load_seconds),
            "--eval-captions", str(args.eval_captions), "--codec", args.codec]
    if args.workers is not None:
        base += ["--workers", str(args.workers)]
    out: dict[str, Any] = {}
    for phase in args.phases:
        t0 = time.perf_counter()
        out[phase] = child([*base, "--phase", phase])
        out[phase]["wall_s"] = time.perf_counter() - t0
        print(f"  {family} {phase}: {json.dumps(out[phase])}", flush=True)
    return out


def table(built: dict[str, Any], results: dict[str, dict[str, Any]], codec: str = "zstd") -> str:
    """The Markdown table of the results (one row per family)."""
    head = ("| family | features | in RAM | data load s | loader captions/s (step stubbed) "
            "| real step s/batch | captions/s (real step) | epoch h (this CPU) | GFLOP/step "
            "| peak RSS loader GB | peak RSS trainer GB | 5k test eval s (read + embed + rank) "
            "| eval peak RSS GB |")
    rows = [head, "|" + "|".join([" --- "] * 13) + "|"]
    for family, r in results.items():
        ld, tr, ev = r["load"], r["train"], r["eval"]
        store, key = features_store(family, codec)
        epoch_h = ld["epoch_captions"] / tr["step_captions_per_s"] / 3600 if tr["step_captions_per_s"] else 0
        rows.append(
            f"| {family} | {store}:{key} | {'yes' if ld['features_in_memory'] else 'no (per batch)'} "
            f"| {ld['load_s']:.0f} | {ld['stub_captions_per_s']:,.0f} | {tr['step_s']:.3f} "
            f"| {tr['step_captions_per_s']:,.0f} | {epoch_h:.2f} | {tr['step_flops'] / 1e9:.1f} "
            f"| {ld['peak_rss'] / GIB:.2f} | {tr['peak_rss'] / GIB:.2f} "
            f"| {ev['read_s'] + ev['embed_s'] + ev['rank_s']:.0f} ({ev['read_s']:.0f} + "
            f"{ev['embed_s']:.0f} + {ev['rank_s']:.0f}) | {ev['peak_rss'] / GIB:.2f} |")
    disk = ", ".join(f"{name} {size / GIB:.2f} GB" for name, size in built["disk"].items())
    return "\n".join(rows) + f"\n\non disk: {disk}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="/work/scale-data",
                   help="where the synthetic data goes (default %(default)s)")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of COCO's size (default 1: full size)")
    p.add_argument("--families", nargs="+", default=list(FAMILY_FEATURES), choices=list(FAMILY_FEATURES))
    p.add_argument("--steps", type=int, default=200, help="real optimisation steps timed per family")
    p.add_argument("--load-seconds", type=float, default=60.0,
                   help="at most this long through the epoch's batches with the step stubbed out")
    p.add_argument("--eval-captions", type=int, default=1280,
                   help="test captions embedded (timed, scaled to all); all of them are ranked")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES,
                   help="the phases run for each family (default: all; the table needs all three)")
    p.add_argument("--workers", type=int, help="processes reading the load phase's batches "
                   "(default: the family's --workers)")
    p.add_argument("--codec", choices=("zstd", "lz4"), default="zstd",
                   help="lz4: the region families read a copy of grid-regions.zarr made by `features "
                        "recompress --codec lz4` (made on first use, timed)")
    p.add_argument("--json", metavar="FILE", help="also write every number into FILE")
    p.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.phase:
        run_phase(args)
        return 0
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    built = build(root, args.scale, args.seed)
    print(f"data: {json.dumps(built)} ({time.perf_counter() - t0:.0f}s)", flush=True)
    if args.codec == "lz4" and any(FAMILY_FEATURES[f][1] == "regions" for f in args.families):
        print(f"{LZ4_REGIONS}: recompressed in {lz4_regions(root):.0f} s (0: it was there)", flush=True)
    results = {family: measure(args, family) for family in args.families}
    if set(args.phases) == set(PHASES):
        print(table(built, results, args.codec))
    if args.json:
        Path(args.json).write_text(json.dumps({"build": built, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
