"""Benchmark: what the safety checks of issues 16/22 cost on the normal path (prints numbers; not a test).

Two measurements, each of the added work alone against the work it is added to, so that the ratio does
not depend on how busy the machine is:

- **reader**: ``read_matrix`` of a finished synthetic ``global`` store (``--rows`` x ``--width`` float32,
  blocks of ``--block-size``) against the checks it gained: :func:`features.store.read.check_row_records`
  (``imgid``, ``blocks_done``, ``failures``) and the two ``zarr.json`` reads of the generation check.
- **extraction**: per image, ``load_image`` of real COCO JPEGs (what every block does before the network)
  against :func:`features.extractors.images.check_work` (the work bound) and, per block,
  :func:`features.executors.extract.check_images_available` over a block's (empty) failures; plus the one-off
  ``probe_writable`` of a run.

    .venv/bin/python bench/bench_store_safety.py --rows 50000 --width 2048
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from features.executors.extract import check_images_available  # noqa: E402
from features.extractors.images import check_work, load_image  # noqa: E402
from features.run import probe_writable  # noqa: E402
from features.store.core import FeatureStore  # noqa: E402
from features.store.read import check_row_records, read_matrix  # noqa: E402


def best(fn, repeat: int) -> float:
    """Best wall time of ``repeat`` calls of ``fn`` (seconds)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def reader(rows: int, width: int, block: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.zarr"
        store = FeatureStore.create(path, np.arange(rows), {"global": width}, block, {"cnn": "bench"},
                                    {"network": "bench"})
        rng = np.random.default_rng(0)
        for b in range(store.n_blocks):
            start, stop = store.block_rows(b)
            store.write_block(b, {"global": rng.normal(size=(stop - start, width)).astype(np.float32)},
                              np.ones(stop - start, dtype=bool), [])
        store.set_attrs(complete=True)
        total = best(lambda: read_matrix(str(path)), repeat)
        opened = FeatureStore(path)
        valid = np.asarray(opened.array("valid")[:], dtype=bool)
        records = best(lambda: check_row_records(opened, valid), repeat)
        state = best(lambda: (opened.state(), opened.state()), repeat)
        size = rows * width * 4 / 2**20
        print(f"reader: {rows} x {width} float32 ({size:.0f} MiB, {store.n_blocks} blocks): read_matrix "
              f"{total:.3f} s, of which row-record checks {records * 1e3:.2f} ms and generation "
              f"reads {state * 1e3:.2f} ms = {100 * (records + state) / total:.2f}%")


def extraction(images: Path, n: int, block: int, repeat: int) -> None:
    files = sorted(images.iterdir())[:n]
    load = best(lambda: [load_image(f) for f in files], repeat) / len(files)
    bound = best(lambda: [check_work(640, 480, 256) for _ in files], repeat) / len(files)
    per_block = best(lambda: check_images_available([]), repeat)
    with tempfile.TemporaryDirectory() as tmp:
        probe = best(lambda: probe_writable(Path(tmp)), repeat)
    print(f"extraction: load_image {load * 1e3:.2f} ms per image (decode only, before the network); work "
          f"bound {bound * 1e6:.2f} us per image ({100 * bound / load:.4f}%); folder check "
          f"{per_block * 1e6:.2f} us per block of {block}; write probe {probe * 1e3:.2f} ms per run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--images-dir", type=Path,
                        default=ROOT.parent / "shared" / "data" / "coco_sample" / "images")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    reader(args.rows, args.width, args.block_size, args.repeat)
    extraction(args.images_dir, args.images, args.block_size, args.repeat)


if __name__ == "__main__":
    main()
