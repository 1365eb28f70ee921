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

from features.store import FeatureStore
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
    from features.store import FeatureStore

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
