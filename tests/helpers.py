"""What several test files build, in one place: a tiny prepared caption dataset and its feature store
(:func:`make_prepared`, :func:`make_store`: written with the real vocabulary builder and the real
feature-store writer, in the documented formats) for the training and evaluation tests, and for the
``test_features_*`` files a prepared dataset over ``coco_sample`` images (:func:`make_image_dataset`) with a
small deterministic mapper (:class:`ColourMapper`: per-image colour statistics of a 16x16 thumbnail,
standing in for a CNN, so those tests pin the store and the runner, not a network), a feature-extraction
run killed after its first block, a held store lock, region files in the formats of the peers
(:func:`write_butd_tsv`) and a synthetic region store (:func:`make_region_store`)."""

from __future__ import annotations

import base64
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from features.store.core import FeatureStore
from prep.dataset import PreparedDataset
from prep.vocab import build_char_vocabulary, build_word_vocabulary

COLOURS = ("red", "green", "blue", "yellow")
THINGS = ("dog", "cat", "bus", "kite", "man", "boat")


def make_prepared(root: Path, n_train: int = 24, n_val: int = 8, n_test: int = 8, seed: int = 0) -> Path:
    """A prepared dataset folder: 2-3 English captions per image naming the image's colour class."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    images, sentid = [], 0
    splits = ["train"] * n_train + ["val"] * n_val + ["test"] * n_test
    for imgid, split in enumerate(splits):
        colour = COLOURS[imgid % len(COLOURS)]
        sentences = []
        for _ in range(2 + imgid % 2):
            thing, other = (THINGS[int(k)] for k in rng.integers(len(THINGS), size=2))
            raw = f"A {colour} {thing} next to a {other} in the {colour} light."
            sentences.append({"sentid": sentid, "imgid": imgid, "raw": raw, "lang": "en",
                              "tokens": raw.lower().rstrip(".").split()})
            sentid += 1
        images.append({"imgid": imgid, "split": split, "filename": f"{imgid:04d}.jpg",
                       "sentids": [s["sentid"] for s in sentences], "sentences": sentences})
    data = {"dataset": "tiny", "languages": ["en"], "pairs": [], "images_root": str(root / "images"),
            "images": images}
    (root / "dataset.json").write_text(json.dumps(data))
    train = [s for im in images if im["split"] == "train" for s in im["sentences"]]
    (root / "chars.json").write_text(json.dumps(build_char_vocabulary(s["raw"] for s in train)))
    (root / "words.json").write_text(json.dumps(build_word_vocabulary(s["tokens"] for s in train)))
    return root


def make_store(path: Path, dataset: Path, dim: int = 16, invalid: tuple[int, ...] = (),
               seed: int = 0) -> Path:
    """A complete ``global`` feature store for ``dataset``: class signal plus noise; ``invalid`` rows fail."""
    from features.store.core import FeatureStore

    n = len(json.loads((dataset / "dataset.json").read_text())["images"])
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 0.3, (n, dim)).astype(np.float32)
    x[np.arange(n), np.arange(n) % len(COLOURS)] += 2.0
    valid = np.ones(n, dtype=bool)
    valid[list(invalid)] = False
    x[~valid] = np.nan
    store = FeatureStore.create(path, np.arange(n), {"global": dim}, block_size=n, config={"test": True},
                                provenance={"network": "synthetic"})
    failures = [{"imgid": int(i), "reason": "synthetic failure"} for i in invalid]
    store.write_block(0, {"global": x}, valid, failures)
    store.set_attrs(complete=True)
    return path


def make_image_dataset(root: Path, coco_sample: Path, n: int, splits: list[str] | None = None,
                  extra: dict[int, Path] | None = None) -> Path:
    """A prepared dataset folder of ``n`` coco_sample images (``extra`` replaces rows by other files)."""
    names = sorted(p.name for p in (coco_sample / "images").iterdir())[:n]
    splits = splits or ["train" if i < n * 2 // 3 else ("val" if i % 2 else "test") for i in range(n)]
    images = []
    for i, name in enumerate(names):
        path = (extra or {}).get(i)
        images.append({"imgid": i, "split": splits[i], "filename": path.name if path else name,
                       "filepath": str(path.parent) if path else "images",
                       "sentids": [i], "sentences": [{"sentid": i, "imgid": i, "raw": "a photo",
                                                      "tokens": ["a", "photo"], "lang": "en"}]})
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset.json").write_text(json.dumps({"dataset": "coco", "languages": ["en"], "pairs": [],
                                                   "images_root": str(coco_sample), "images": images}))
    (root / "chars.json").write_text(json.dumps({"symbols": ["<pad>", "<unk>", "a"]}))
    (root / "words.json").write_text(json.dumps({"tokens": ["<pad>", "<unk>", "a"]}))
    return root


class ColourMapper:
    """Per-image colour statistics (mean, std, min, max of R, G, B on a 16x16 thumbnail), float32."""

    def __init__(self, name: str = "global") -> None:
        self.outputs = {name: 12}
        self.provenance = {"network": "colour-statistics", "weights_sha256": None}

    def __call__(self, images: list[Image.Image]) -> dict[str, np.ndarray]:
        rows = []
        for img in images:
            x = np.asarray(img.resize((16, 16), Image.BILINEAR), dtype=np.float32).reshape(-1, 3) / 255
            rows.append(np.concatenate([x.mean(0), x.std(0), x.min(0), x.max(0)]))
        name, = self.outputs
        return {name: np.stack(rows).astype(np.float32)}


class ColourFactory:
    """Picklable recipe for :class:`ColourMapper`; ``log`` (optional) gets one line per build."""

    def __init__(self, name: str = "global", log: str | None = None) -> None:
        self.name, self.log = name, log
        self.key = f"colour:{name}"

    def build(self) -> ColourMapper:
        if self.log:
            import os

            with open(self.log, "a") as fh:
                fh.write(f"{os.getpid()}\n")
        return ColourMapper(self.name)


def new_store(path: Path, n: int, block: int, name: str = "global", overwrite: bool = False,
              config: dict | None = None) -> FeatureStore:
    return FeatureStore.open_or_create(path, np.arange(n), {name: 12}, block, config or {"cnn": "colour"},
                                       {"network": "colour"}, overwrite=overwrite)


def paths_of(data: Path) -> list[str]:
    from prep.dataset import PreparedDataset

    return [str(p) for p in PreparedDataset.load(data).image_paths()]


ROOT = Path(__file__).resolve().parents[1]
#: the region stores of the clmr/liwe tests: regions per image and their size
REGION_K, REGION_DIM = 6, 16


BASE = ["--cnn", "efficientnet_lite0", "--weights", "none", "--crops", "1", "--input-size", "64",
        "--block-size", "4", "--device", "cpu", "--no-progress"]


def kill_after_first_block(args: list[str], out: Path) -> np.ndarray:
    """Run ``features ARGS`` in a subprocess (one torch thread), SIGKILL it as soon as its first block
    of the store ``out`` is marked done, and return the store's ``blocks_done`` flags (checked to be
    neither none nor all, so the caller's resume has work left)."""
    cmd = [sys.executable, "-m", "features", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    flags = out / "blocks_done" / "c"
    deadline = time.monotonic() + 120
    while not (flags.is_dir() and any(flags.iterdir())):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no block finished in 120 s"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = FeatureStore(out).blocks_done()
    assert 1 <= done.sum() < done.size, f"kill came too late to test resumption: {done}"
    return done


def hold_lock(target: Path) -> subprocess.Popen:
    code = ("import time; from vsecore.io import exclusive_lock\n"
            f"with exclusive_lock({str(target)!r}, 'the feature store'):\n"
            "    print('held', flush=True); time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.readline().strip() == "held"
    return proc


def annotated_dataset(tmp_path: Path, names: list[str], splits: list[str], cocoids: list[int] | None = None
                      ) -> PreparedDataset:
    """A prepared dataset of the images ``names`` (one caption each, ``cocoids`` when given), for the region
    readers."""
    images = []
    for i, (name, split) in enumerate(zip(names, splits, strict=True)):
        entry = {"imgid": i, "split": split, "filename": name, "sentids": [i],
                 "sentences": [{"sentid": i, "imgid": i, "raw": "a", "tokens": ["a"], "lang": "en"}]}
        if cocoids:
            entry["cocoid"] = cocoids[i]
        images.append(entry)
    root = tmp_path / "prep"
    root.mkdir(exist_ok=True)
    (root / "dataset.json").write_text(json.dumps({"dataset": "coco", "languages": ["en"], "pairs": [],
                                                   "images_root": str(tmp_path), "images": images}))
    (root / "chars.json").write_text(json.dumps({"symbols": ["<pad>", "<unk>", "a"]}))
    (root / "words.json").write_text(json.dumps({"tokens": ["<pad>", "<unk>", "a"]}))
    return PreparedDataset.load(root)


def write_butd_tsv(path: Path, rows: list[tuple[object, int, int, np.ndarray, np.ndarray]],
               python3_bytes: bool = False) -> None:
    """A TSV as bottom-up-attention's generate_tsv.py writes it (csv.DictWriter, tab, no header)."""
    fields = ["image_id", "image_w", "image_h", "num_boxes", "boxes", "features"]

    def enc(a: np.ndarray) -> str:
        raw = base64.b64encode(np.ascontiguousarray(a, dtype=np.float32))
        return str(raw) if python3_bytes else raw.decode("ascii")

    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, delimiter="\t", fieldnames=fields)
        for image_id, w, h, boxes, feats in rows:
            writer.writerow({"image_id": image_id, "image_w": w, "image_h": h, "num_boxes": len(boxes),
                             "boxes": enc(boxes), "features": enc(feats)})


def random_regions(rng: np.random.Generator, n: int, dim: int, w: int = 640, h: int = 480):
    xy = rng.uniform(0, [w / 2, h / 2], size=(n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(1, [w / 2, h / 2], size=(n, 2))], axis=1)
    return boxes.astype(np.float32), rng.standard_normal((n, dim)).astype(np.float32)


def make_region_store(path: Path, dataset: Path, with_counts: bool = True, seed: int = 0) -> Path:
    """A complete ``regions`` store ``(N, REGION_K, REGION_DIM)`` (and ``counts``) for a prepared dataset,
    written with the real store writer: region ``j`` is the vector of the ``j``-th word (> 2 letters) of the
    image's first English caption; rows after ``counts`` are zero padding."""

    data = json.loads((dataset / "dataset.json").read_text())
    rng = np.random.default_rng(seed)
    vectors: dict[str, np.ndarray] = {}
    n = len(data["images"])
    x = np.zeros((n, REGION_K, REGION_DIM), np.float32)
    counts = np.full(n, REGION_K, np.int32)
    for im in data["images"]:
        tokens = next(s["tokens"] for s in im["sentences"] if s["lang"] == "en")
        words = [w for w in tokens if len(w) > 2][:REGION_K]
        for j, w in enumerate(words):
            x[im["imgid"], j] = vectors.setdefault(w, rng.normal(0, 1, REGION_DIM).astype(np.float32))
            x[im["imgid"], j] += rng.normal(0, 0.1, REGION_DIM).astype(np.float32)
        if with_counts:
            counts[im["imgid"]] = max(1, len(words))
    outputs = {"regions": (REGION_K, REGION_DIM), **({"counts": ()} if with_counts else {})}
    store = FeatureStore.create(path, np.arange(n), outputs, block_size=n, config={"test": True},
                                provenance={"network": "synthetic regions"}, dtypes={"counts": "int32"})
    rows = {"regions": x, **({"counts": counts} if with_counts else {})}
    store.write_block(0, rows, np.ones(n, dtype=bool), [])
    store.set_attrs(complete=True)
    return path


# -- training runs: shared by the trainer, checkpoint, compare and fault tests -------------------------------
#: the per-epoch timing fields of metrics.jsonl (they differ between two identical runs)
TIMING_KEYS = {"time_s", "train_time_s", "val_time_s", "captions_per_s"}
#: a tiny retrieval model for `train <family>` (CHAIN-VSE with 1/8 of its filters, d 32)
TINY = ["--p", "0.125", "--d", "32", "--batch-size", "4", "--seed", "3", "--device", "cpu"]
#: a tiny classifier: CHAIN-VSE v1 with 16 filters per stream, short texts
CLASSIFY_TINY = ["--encoder", "chain", "--p", "0.0625", "--max-chars", "48", "--batch-size", "8", "--dropout",
                 "0.1", "--device", "cpu"]


def train_cli(argv: list[str]) -> int:
    """``train <family> ...`` in process, through the same error wrapper as the console command."""
    import argparse

    from train.cli import fit as fit_cli
    from vsecore.errors import run_cli

    def main(a: list[str]) -> int:
        parser = argparse.ArgumentParser(prog="train")
        fit_cli.register(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(a)
        return args.func(args)

    return run_cli(main, argv, "train")


#: runs ``train`` with only the family subcommands of train.retrieval.fit, in a subprocess
TRAIN_RUNNER = """
import argparse, sys
from vsecore.errors import run_cli
from train.cli import fit as fit_cli
def main(argv):
    parser = argparse.ArgumentParser(prog="train")
    fit_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
sys.exit(run_cli(main, sys.argv[1:], "train"))
"""
#: small VSE settings (the seam/vse tests and a checkpoint test)
VSE_SMALL = ["--word-dim", "16", "--d", "32", "--batch-size", "8", "--seed", "1", "--device", "cpu"]


def train_subprocess(argv: list[str]) -> subprocess.Popen:
    """``train <family> ...`` (:data:`TRAIN_RUNNER`) in a subprocess of one thread, stderr piped."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", TRAIN_RUNNER, *argv], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def metrics_without_timings(run: Path) -> list[dict]:
    """The run's metrics.jsonl records without their timing fields (:data:`TIMING_KEYS`)."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in lines]


def assert_same_weights(a: Path, b: Path) -> None:
    """The model tensors of checkpoints ``a`` and ``b`` are equal, bit for bit."""
    import torch

    from train.run.checkpoint import load_checkpoint

    sa, sb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def copy_run(run: Path, to: Path) -> Path:
    """A copy of run directory ``run`` at ``to``."""
    import shutil

    shutil.copytree(run, to)
    return to


def safety_inputs(root: Path) -> tuple[Path, str]:
    """``(prepared dataset, STORE:global)``: 100 train images, one invalid store row (imgid 3)."""
    prepared = make_prepared(root / "prepared", n_train=100, n_val=8, n_test=8)
    store = make_store(root / "feats.zarr", prepared, invalid=(3,))
    return prepared, f"{store}:global"


def train_tiny_chain(data: tuple[Path, str], run: Path) -> Path:
    """One epoch of :data:`TINY` CHAIN-VSE on ``data`` (:func:`safety_inputs`) into ``run``."""
    prepared, features = data
    assert train_cli(["chain", "--data", str(prepared), "--features", features, *TINY, "--epochs", "1",
                      "--out", str(run)]) == 0
    return run


def legacy_copy(state: dict) -> dict:
    """Checkpoint ``state`` as the code before format 2 wrote it: numpy and Python RNG tuples, no format
    key."""
    old = {k: v for k, v in state.items() if k != "format"}
    rng = state["rng"]
    n, p = rng["numpy"], rng["python"]
    old["rng"] = {"torch": rng["torch"], "cuda": rng["cuda"],
                  "numpy": ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                            n["cached_gaussian"]),
                  "python": (p["version"], tuple(p["state"].tolist()), p["gauss_next"])}
    return old


class FullDisk:
    """A file whose disk fills up after ``room`` bytes: ``write`` raises the ``OSError`` (ENOSPC) the
    kernel gives, and torch's writer turns it into its own ``RuntimeError: ... unexpected pos``."""

    def __init__(self, fh, room: int) -> None:
        self.fh, self.room = fh, room

    def write(self, data) -> int:
        import errno

        size = memoryview(data).nbytes
        if size > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= size
        return self.fh.write(data)

    def __getattr__(self, name: str):
        return getattr(self.fh, name)


# -- text classification -------------------------------------------------------------------------------------
ZHANG_CLASSES = "World\nSports\n"


def write_zhang(folder: Path, rows: list[str], name: str = "train.csv") -> Path:
    """A Zhang-format CSV ``folder/name`` of ``rows`` (and its classes.txt: World, Sports)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "classes.txt").write_text(ZHANG_CLASSES, encoding="utf-8")
    path = folder / name
    path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return path


def tiny_zhang_rows(n: int, seed: int = 0) -> list[str]:
    """``n`` rows of two separable classes: world news about capitals, sports about scores."""
    rng = np.random.default_rng(seed)
    world = ["paris", "berlin", "summit", "minister", "election", "treaty"]
    sport = ["goal", "match", "league", "coach", "score", "cup"]
    rows = []
    for k in range(n):
        cls = k % 2
        words = rng.choice(world if cls == 0 else sport, size=4)
        rows.append(f'"{cls + 1}","{words[0]} {words[1]}","{words[2]} and {words[3]}"')
    return rows


def prepare_tiny_textcls(root: Path) -> Path:
    """A prepared classification dataset under ``root``: 64 train rows (a quarter for validation), 16
    test rows of :func:`tiny_zhang_rows`."""
    from prep.cli import main as prep_main

    write_zhang(root / "raw", tiny_zhang_rows(64), "train.csv")
    write_zhang(root / "raw", tiny_zhang_rows(16, seed=1), "test.csv")
    out = root / "data"
    assert prep_main(["textcls", "--train", str(root / "raw" / "train.csv"), "--test",
                      str(root / "raw" / "test.csv"), "--val-fraction", "0.25", "-q", "--out", str(out)]) == 0
    return out


# -- feature export: a minimal marked prepared dataset and an imported store ---------------------------------
def minimal_prepared(root: Path, n_train: int = 8, n_test: int = 4) -> Path:
    """A prepared dataset (marked, with prep.json) of ``n_train`` + ``n_test`` images, one caption each."""
    root.mkdir(parents=True)
    splits = ["train"] * n_train + ["test"] * n_test
    images = [{"imgid": i, "split": s, "filename": f"{i}.jpg", "sentids": [i],
               "sentences": [{"sentid": i, "imgid": i, "raw": f"caption {i}", "tokens": ["caption"],
                              "lang": "en"}]} for i, s in enumerate(splits)]
    (root / "dataset.json").write_text(json.dumps({"dataset": "t", "languages": ["en"], "pairs": [],
                                                   "images_root": str(root), "images": images}))
    (root / "chars.json").write_text(json.dumps({"symbols": ["<pad>", "<unk>", "a"]}))
    (root / "words.json").write_text(json.dumps({"tokens": ["<pad>", "<unk>", "a"]}))
    (root / "prep.json").write_text(json.dumps({"format_version": 1, "prep_version": "0"}))
    (root / ".vse-prepared").write_text("{}")
    return root


def imported_store(data: Path, out: Path, width: int = 16, seed: int = 0) -> Path:
    """An imported store of ``data`` (``features import``): every split filled with random rows."""
    from features.interop.imports import import_npy

    rng = np.random.default_rng(seed)
    images = json.loads((data / "dataset.json").read_text())["images"]
    for split in ("train", "test"):
        npy = out.parent / f"{out.stem}-{split}.npy"
        np.save(npy, rng.random((sum(im["split"] == split for im in images), width), dtype=np.float32))
        import_npy(npy, data, split, out)
        npy.unlink()
    return out


# -- train compare and the query/gallery pipeline ------------------------------------------------------------
#: pipeline entries that shrink every compared family (d = 16), so a comparison takes seconds
COMPARE_PIPELINES = """
pipelines:
  tiny-chain:
    description: tiny chain
    prep: {dataset: synthetic, out: unused}
    train: {family: chain, p: 0.125, d: 16, batch_size: 8, device: cpu, out: unused}
  tiny-vse:
    description: tiny vse
    prep: {dataset: synthetic, out: unused}
    train: {family: vse, kind: SOE, d: 16, word_dim: 8, batch_size: 8, device: cpu, out: unused}
  tiny-clmr:
    description: tiny clmr
    prep: {dataset: synthetic, out: unused}
    train: {family: clmr, d: 16, batch_size: 8, device: cpu, out: unused}
"""


def make_compare_inputs(root: Path) -> dict[str, str]:
    """The inputs of a tiny ``train compare`` under ``root``: a synthetic dataset of 96 images, its global
    and region stores, and :data:`COMPARE_PIPELINES`."""
    from prep.cli import main as prep_main

    prepared = root / "prepared"
    assert prep_main(["synthetic", "--out", str(prepared), "--num-images", "96", "--image-size", "32",
                      "--captions-per-image", "2", "--languages", "en", "-q"]) == 0
    store = make_store(root / "global.zarr", prepared)
    regions = make_region_store(root / "regions.zarr", prepared)
    pipelines = root / "pipelines.yaml"
    pipelines.write_text(COMPARE_PIPELINES)
    return {"data": str(prepared), "features": f"{store}:global", "regions": f"{regions}:regions",
            "pipelines": str(pipelines)}


#: a tiny pipeline (48 synthetic images, a random-weights CNN store of kind ``{kind}``, one epoch of chain)
QUERY_PIPELINE = """
pipelines:
  tiny:
    description: tiny
    prep: {{dataset: synthetic, out: data, num_images: 48, image_size: 64, languages: [en], seed: 2}}
    features:
      {{kind: {kind}, cnn: efficientnet_lite0, weights: none, crops: 1, resize: 96, input_size: 96,
        batch_size: 8, block_size: 16, out: feats.zarr}}
    train: {{family: chain, p: 0.125, d: 16, epochs: 1, batch_size: 16, max_chars: 60, out: run,
             device: cpu}}
"""
