"""Peak memory of training on an int8 FNE store: the ternary array stays int8 (converted per batch).

Builds a synthetic prepared dataset (``--images`` images, 5 captions each) and two feature stores whose
``fne/ternary`` is a random int8 array in {-1, 0, 1}: one ``--width`` wide (12,416 columns: VGG16's
FNE), one 16 wide. Each measurement runs in a fresh Python process and reads its peak resident set
size (``ru_maxrss``):

* ``train W`` / ``train 16``: ``train vse`` (SOE) on ``STORE:fne`` for one epoch (one caption per
  image, batch 128), validation and test evaluation included, through
  :func:`train.retrieval.fit.run_training`.
  Everything but the feature array is the same in both (dataset, captions, evaluation, torch), so
  ``train W - train 16`` is what the features cost;
* ``dense``: ``features.store.read.read_matrix(STORE:fne)`` of the wide store without ``keep_dtype``, i.e.
  one float32 copy (what training must not make), against ``imports`` (the same process, nothing read).

It prints the sizes that bound the difference: the int8 array, the image-side weights ``W_i`` with their
gradients and Adam's two moments (4 x 4 bytes each), and the largest block of rows in flight: the
validation and test embedding gathers 1,024 rows at a time (int8, then float32: 5 bytes per value),
more than a training batch of 128. It compares ``train W - train 16`` with ``int8 + W_i + 2 blocks``.
Nothing is asserted.

    .venv/bin/python bench/bench_fne_memory.py                       # 20,000 x 12,416 (237 MiB int8)
    .venv/bin/python bench/bench_fne_memory.py --images 5000 --width 4096
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 2**20
#: rows per block of train.engine.inference.embed_images (validation and test images)
EMBED_ROWS = 1024
WORDS = ("a man woman dog cat red blue small large sits stands on in near the table street field car bus "
         "with two of grass water plate").split()

#: what each measured child process runs; ``spec`` is the JSON of the settings
CHILD = r"""
import json, resource, sys
sys.path.insert(0, {root!r})
spec = json.loads(sys.argv[1])
import torch
torch.set_num_threads(1)
from features.store.read import read_matrix
from train.models.family import train_settings
from train.retrieval import fit
if spec["mode"] == "train":
    fit.run_training(train_settings(**spec["settings"]), overwrite=True, log=lambda message: None)
elif spec["mode"] == "dense":
    x, valid = read_matrix(spec["settings"]["features"])
    assert x.dtype.name == "float32"
print(json.dumps({{"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}}))
"""


def make_dataset(root: Path, images: int, seed: int = 0) -> Path:
    """A prepared dataset of ``images`` images (80% train, 10% val, 10% test), 5 short captions each."""
    from prep.vocab import build_char_vocabulary, build_word_vocabulary

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    n_val = n_test = max(images // 10, 1)
    splits = ["train"] * (images - n_val - n_test) + ["val"] * n_val + ["test"] * n_test
    entries, sentid, train_tokens = [], 0, []
    for imgid, split in enumerate(splits):
        sentences = []
        for _ in range(5):
            tokens = [WORDS[int(k)] for k in rng.integers(len(WORDS), size=int(rng.integers(8, 16)))]
            sentences.append({"sentid": sentid, "imgid": imgid, "raw": " ".join(tokens), "lang": "en",
                              "tokens": tokens})
            sentid += 1
            if split == "train":
                train_tokens.append(tokens)
        entries.append({"imgid": imgid, "split": split, "filename": f"{imgid:06d}.jpg",
                        "sentids": [s["sentid"] for s in sentences], "sentences": sentences})
    data = {"dataset": "synthetic-fne", "languages": ["en"], "pairs": [], "images_root": str(root / "images"),
            "images": entries}
    (root / "dataset.json").write_text(json.dumps(data))
    (root / "chars.json").write_text(json.dumps(build_char_vocabulary(" ".join(t) for t in train_tokens)))
    (root / "words.json").write_text(json.dumps(build_word_vocabulary(train_tokens)))
    return root


def make_fne_store(path: Path, images: int, width: int, block: int = 1000, seed: int = 0) -> Path:
    """A complete store whose ``fne/ternary`` is a random int8 array in {-1, 0, 1}, written by blocks."""
    from features.store.core import FeatureStore

    store = FeatureStore.create(path, np.arange(images), {"fne/ternary": width}, block_size=block,
                                config={"bench": True}, provenance={"network": "synthetic FNE"},
                                dtypes={"fne/ternary": "int8"})
    rng = np.random.default_rng(seed)
    for b in range(store.n_blocks):
        start, stop = b * block, min(images, (b + 1) * block)
        # the FNE's thresholds leave most features at 0: P(-1) = P(1) = 0.3 roughly
        codes = rng.choice(np.array([-1, 0, 1], dtype=np.int8), size=(stop - start, width), p=[0.3, 0.4, 0.3])
        store.write_block(b, {"fne/ternary": codes}, np.ones(stop - start, dtype=bool), [])
    store.set_attrs(complete=True)
    return path


def measure(mode: str, settings: dict) -> int:
    """Peak RSS in bytes of a fresh process running ``mode``."""
    env_code = CHILD.format(root=str(ROOT))
    out = subprocess.run([sys.executable, "-c", env_code, json.dumps({"mode": mode, "settings": settings})],
                         check=True, capture_output=True, text=True,
                         env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                              "VSE_PROGRESS_SECONDS": "3600"})
    return json.loads(out.stdout.strip().splitlines()[-1])["maxrss_kib"] * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000, help="rows of the FNE array (default 20,000)")
    parser.add_argument("--width", type=int, default=12_416, help="FNE features (default 12,416: VGG16)")
    parser.add_argument("--d", type=int, default=256, help="joint space = GRU units (default 256)")
    parser.add_argument("--word-dim", type=int, default=64, help="word embedding size (default 64)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--work", default=None, help="folder for the dataset and store (default: a temp dir)")
    args = parser.parse_args()

    import torch

    from train.models.family import model_spec, train_settings, with_family_defaults
    from train.models.joint import build_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        data = make_dataset(work / "data", args.images)
        store = make_fne_store(work / "fne.zarr", args.images, args.width)
        settings = {"family": "vse", "kind": "SOE", "data": str(data), "features": f"{store}:fne",
                    "out": str(work / "run"), "d": args.d, "word_dim": args.word_dim, "epochs": 1,
                    "batch_size": args.batch_size, "device": "cpu", "val_images": 500}
        resolved = with_family_defaults(train_settings(**settings), "synthetic")
        from prep.dataset import PreparedDataset

        vocab = len(PreparedDataset.load(data).words)
        model = build_model(resolved, vocab, (args.width,), model_spec(resolved))
        params = sum(p.numel() for p in model.parameters())
        image_side = args.width * args.d * 4 * 4  # W_i: weights, gradients, Adam's two moments
        int8 = args.images * args.width
        batch = args.batch_size * args.width * 4
        block = EMBED_ROWS * args.width * 5  # embed_images: int8 rows, then their float32 copy
        print(f"torch {torch.__version__}; FNE {args.images:,} x {args.width:,} int8 = {int8 / MIB:,.0f} MiB "
              f"(float32: {4 * int8 / MIB:,.0f} MiB); vse SOE d {args.d}, word_dim {args.word_dim}: "
              f"{params:,} parameters; W_i x 16 bytes = {image_side / MIB:,.0f} MiB; one float32 batch "
              f"{batch / MIB:,.1f} MiB; one {EMBED_ROWS}-row embedding block {block / MIB:,.1f} MiB")
        narrow = make_fne_store(work / "fne16.zarr", args.images, 16)
        imports = measure("baseline", settings)
        train = measure("train", settings)
        train16 = measure("train", {**settings, "features": f"{narrow}:fne", "out": str(work / "run16")})
        dense = measure("dense", settings)
        bound = int8 + image_side + 2 * block
        print(f"peak RSS: imports {imports / MIB:,.0f} MiB; read_matrix as float32 {dense / MIB:,.0f} MiB "
              f"(+{(dense - imports) / MIB:,.0f}); train 1 epoch on width 16 {train16 / MIB:,.0f} MiB, on "
              f"width {args.width:,} {train / MIB:,.0f} MiB")
        verdict = "within" if train - train16 <= bound else "ABOVE"
        print(f"train {args.width:,} - train 16 = {(train - train16) / MIB:,.0f} MiB: {verdict} int8 + W_i + "
              f"2 blocks = {bound / MIB:,.0f} MiB (a float32 copy alone would be {4 * int8 / MIB:,.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
