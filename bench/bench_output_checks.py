"""Cost of the output checks and input hardening on the normal path of ``prep`` and ``features export``.

Two measurements:

* **end to end**: the CPU time (user + system) of ``prep synthetic --num-images N``, ``features export
  --format precomp`` and ``--format hdf5`` of an imported store (``--rows`` x ``--width`` random
  float32), each in a fresh process, under every source tree given (``--trees OLD NEW``: e.g. an
  export of the commit before and this checkout); the trees are alternated ``--repeat`` times and
  the best time of each is kept, so that both see the same machine load;
* **the checks alone**, in this process (this checkout): ``check_output_folder`` / ``check_output_file``
  per call, the caption cleaner's new work (``lone_surrogate`` + ``strip_controls``) per caption next to
  spaCy's tokenization per caption, and ``find_missing_images`` per image (one stat, links followed).

    .venv/bin/python bench/bench_output_checks.py --trees /tmp/base . --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _run(tree: Path, args: list[str]) -> float:
    """CPU seconds (user + system) of the command run under ``tree``: less disturbed than wall time by
    other processes on a shared machine."""
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *args], check=True, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def end_to_end(trees: list[Path], work: Path, images: int, rows: int, width: int, repeat: int) -> None:
    """Best wall time of each command under each tree."""
    from features.interop.imports import import_npy

    data = work / "data"
    subprocess.run([sys.executable, "-m", "prep", "synthetic", "--num-images", str(images),
                    "--out", str(data), "-q"], check=True,
                   env={**os.environ, "PYTHONPATH": str(trees[-1].resolve())})
    big = work / "big"
    big.mkdir()
    entries = [{"imgid": i, "split": "train", "filename": f"{i}.jpg", "sentids": [i],
                "sentences": [{"sentid": i, "imgid": i, "raw": "a", "tokens": ["a"], "lang": "en"}]}
               for i in range(rows)]
    (big / "dataset.json").write_text(json.dumps({"dataset": "b", "languages": ["en"], "pairs": [],
                                                  "images_root": str(big), "images": entries}))
    (big / "chars.json").write_text(json.dumps({"symbols": ["<pad>", "<unk>", "a"]}))
    (big / "words.json").write_text(json.dumps({"tokens": ["<pad>", "<unk>", "a"]}))
    np.save(work / "x.npy", np.random.default_rng(0).random((rows, width), dtype=np.float32))
    import_npy(work / "x.npy", big, "train", work / "s.zarr")
    export = ["-m", "features", "export", "--store", str(work / "s.zarr"), "--data", str(big)]
    commands = {
        f"prep synthetic {images}": lambda k: ["-m", "prep", "synthetic", "--num-images", str(images),
                                               "--out", str(work / f"p{k}"), "-q"],
        f"export precomp {rows}x{width}": lambda k: [*export, "--format", "precomp",
                                                     "--out", str(work / f"e{k}")],
        f"export hdf5 {rows}x{width}": lambda k: [*export, "--format", "hdf5",
                                                  "--out", str(work / f"e{k}.h5")],
    }
    for name, make in commands.items():
        best = {str(t): float("inf") for t in trees}
        k = 0
        for _ in range(repeat):
            for tree in trees:
                k += 1
                best[str(tree)] = min(best[str(tree)], _run(tree, make(k)))
        times = "  ".join(f"{t}: {s:.2f} cpu s" for t, s in best.items())
        ratio = best[str(trees[-1])] / best[str(trees[0])] if len(trees) > 1 else 1.0
        print(f"{name:32s} {times}  last/first {ratio:.3f}  (load {os.getloadavg()[0]:.1f})")


def checks_alone(work: Path, coco_sample: Path | None) -> None:
    """Per-call cost of the checks on the normal path, in this process."""
    from prep.build import find_missing_images
    from prep.tokenize import lone_surrogate, strip_controls, tokenize
    from vsecore.outputs import check_output_file, check_output_folder

    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        check_output_folder(work / "new", ["train_ims.npy", "train_caps.txt", "train_ids.json"],
                            inputs=[work / "s.zarr", work / "big"])
        check_output_file(work / "new.h5", inputs=[work / "s.zarr", work / "big"])
    per_call = (time.perf_counter() - start) / n
    print(f"check_output_folder + check_output_file: {per_call * 1e6:.0f} us per export")
    texts = [f"a {c} {s} on the left of a {c} thing" for c in ("red", "blue", "green") for s in range(3000)]
    if coco_sample is not None:
        texts = [row["caption"] for row in json.loads((coco_sample / "train.json").read_text())] * 3
    start = time.perf_counter()
    for t in texts:  # what prep.build's cleaner adds per caption
        if not t.isprintable():
            lone_surrogate(t)
            strip_controls(t)
    cleaner = (time.perf_counter() - start) / len(texts)
    tokenize(texts[:100], "en")  # load spaCy first
    start = time.perf_counter()
    tokenize(texts, "en")
    spacy = (time.perf_counter() - start) / len(texts)
    print(f"caption cleaner (surrogates + controls): {cleaner * 1e6:.2f} us per caption; spaCy tokenization "
          f"{spacy * 1e6:.1f} us per caption ({cleaner / spacy:.2%})")
    from vsecore.jsonfile import _SURROGATE_ESCAPE

    text = json.dumps({"images": [{"filename": f"COCO_{i:012d}.jpg", "sentences": [
        {"raw": "a man riding a horse on a beach near the water", "tokens": ["a"] * 10}] * 5}
        for i in range(40000)]})
    start = time.perf_counter()
    for _ in range(5):
        "\\" in text and _SURROGATE_ESCAPE.search(text)  # noqa: B015 - what read_json adds
    scan = (time.perf_counter() - start) / 5
    start = time.perf_counter()
    json.loads(text)
    parse = time.perf_counter() - start
    print(f"read_json surrogate pre-check: {scan * 1e3:.1f} ms on {len(text) / 1e6:.0f} MB of JSON "
          f"(json.loads {parse * 1e3:.0f} ms: {scan / parse:.2%})")
    if coco_sample is not None:
        names = sorted(p.name for p in (coco_sample / "images").iterdir())
        dataset = {"images": [{"filename": n} for n in names]}
        start = time.perf_counter()
        for _ in range(20):
            find_missing_images(dataset, coco_sample / "images")
        per_image = (time.perf_counter() - start) / 20 / len(names)
        start = time.perf_counter()
        for _ in range(20):
            for n in names:
                (coco_sample / "images" / n).is_file()
        before = (time.perf_counter() - start) / 20 / len(names)
        print(f"find_missing_images: {per_image * 1e6:.1f} us per image (a bare is_file: "
              f"{before * 1e6:.1f} us)")


def main() -> None:
    """Parse the options and print both measurements."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs="+", type=Path, default=[Path(".")],
                        help="source trees to compare (PYTHONPATH of each run), first = baseline")
    parser.add_argument("--images", type=int, default=300, help="prep synthetic --num-images")
    parser.add_argument("--rows", type=int, default=4000, help="rows of the exported store")
    parser.add_argument("--width", type=int, default=2048, help="features per row of the exported store")
    parser.add_argument("--repeat", type=int, default=3)
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    parser.add_argument("--coco-sample", type=Path, default=shared / "coco_sample")
    args = parser.parse_args()
    os.environ.setdefault("VSE_PROGRESS_SECONDS", "3600")
    with tempfile.TemporaryDirectory() as tmp:
        end_to_end(args.trees, Path(tmp), args.images, args.rows, args.width, args.repeat)
        checks_alone(Path(tmp), args.coco_sample if args.coco_sample.is_dir() else None)


if __name__ == "__main__":
    main()
