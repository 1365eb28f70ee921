"""Caption loading at full COCO size: encoded at every load, against read from the caption cache.

Builds (or reuses) ``bench/bench_scale.py``'s synthetic Karpathy COCO prepared dataset under ``--root``
(616,767 captions; 566,435 train captions kept), and for each family loads its captions as
``train.retrieval.fit`` does (the prepared dataset, the family's codec, the train and val caption sets) in a
fresh process per mode, features aside (a one-column stand-in; ``bench_scale.py``'s ``load`` phase reads
them):

- ``encoded at load (no cache)``: ``VSE_CAPTION_CACHE=0``, every caption encoded by a Python loop;
- ``first load (writes the cache)``: the cache folder removed first, so the loop runs and the file is written;
- ``cached``: the arrays read back from ``data.vse-captions/``.

- ``full``: the run's whole data load as ``train <family>`` does it (``train.retrieval.fit._load_data``:
  codec, features, caption sets, split checks, fingerprints), the cache warm; it needs the family's store
  under ``--root`` (``bench_scale.py`` builds them).

Prints a table of seconds (wall, and the process's CPU: the machine's load moves the first, much less the
second) and resident memory (what the prepared dataset holds, what the caption sets add, the peak), with the
1-minute load average before and after each process.

    PYTHONPATH=. python bench/bench_captions.py                              # full size, chain seam liwe
    PYTHONPATH=. python bench/bench_captions.py --scale 0.002 --families chain   # a quick check
    PYTHONPATH=. python bench/bench_captions.py --families chain liwe --modes cached full   # with the stores
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import FAMILY_FEATURES, GIB, build_dataset, child, peak_rss, settings_of  # noqa: E402

#: the caption loads compared, and the ``VSE_CAPTION_CACHE`` each runs with; ``full``: the run's whole data
#: load (``train.retrieval.fit._load_data``: features and split checks too), the cache warm
MODES = {"encoded at load (no cache)": "0", "first load (writes the cache)": "", "cached": "", "full": ""}


def current_rss() -> int:
    """Resident memory of this process now, bytes (``/proc/self/statm``)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def phase_captions(family: str, root: Path, scale: float) -> dict[str, Any]:
    """The caption half of the run's data loading, in this process, and its seconds and resident memory."""
    from prep.dataset import PreparedDataset
    from train.engine.codecs import codec_for
    from train.engine.data import load_caption_set
    from train.models.family import model_spec

    rss0, t0, cpu0 = current_rss(), time.perf_counter(), time.process_time()
    dataset = PreparedDataset.load(root / "data")
    t1, rss1 = time.perf_counter(), current_rss()
    s = settings_of(family, root, scale, dataset)
    t2 = time.perf_counter()
    codec = codec_for(s, dataset, model_spec(s).text_input)
    x, valid = np.zeros((len(dataset.images), 1), np.float32), np.ones(len(dataset.images), bool)
    train_set = load_caption_set(dataset, x, valid, "train", s.train_langs, s.max_chars, codec=codec)
    val_set = load_caption_set(dataset, x, valid, "val", s.lang, s.max_chars, max_images=s.val_images,
                               codec=codec)
    t3 = time.perf_counter()
    held = sum(c.codes.nbytes + c.offsets.nbytes + c.caption_image.nbytes for c in (train_set, val_set))
    return {"dataset_s": t1 - t0, "captions_s": t3 - t2, "data_load_s": t1 - t0 + t3 - t2,
            "cpu_s": time.process_time() - cpu0, "text_input": codec.kind, "train_captions": len(train_set),
            "val_captions": len(val_set), "rss_dataset": rss1 - rss0, "rss_captions": current_rss() - rss1,
            "arrays_bytes": held, "cache": os.environ.get("VSE_CAPTION_CACHE", "default"),
            "peak_rss": peak_rss()}


def phase_full(family: str, root: Path, scale: float) -> dict[str, Any]:
    """The run's whole data load, as ``train <family>`` does it: the prepared dataset, then
    ``train.retrieval.fit._load_data`` (codec, features, train and val caption sets, split checks,
    fingerprints); seconds (wall and this process's CPU) and resident memory."""
    import torch

    from prep.dataset import PreparedDataset
    from train.models.family import model_spec
    from train.retrieval.fit import _load_data

    rss0, t0, cpu0 = current_rss(), time.perf_counter(), time.process_time()
    dataset = PreparedDataset.load(root / "data")
    t1, rss1, cpu1 = time.perf_counter(), current_rss(), time.process_time()
    s = settings_of(family, root, scale, dataset)
    t2, cpu2 = time.perf_counter(), time.process_time()
    train_set, val_set, _ = _load_data(s, model_spec(s), dataset)
    t3, cpu3 = time.perf_counter(), time.process_time()
    held = sum(c.codes.nbytes + c.offsets.nbytes + c.caption_image.nbytes for c in (train_set, val_set))
    return {"dataset_s": t1 - t0, "load_data_s": t3 - t2, "data_load_s": t1 - t0 + t3 - t2,
            "cpu_s": cpu1 - cpu0 + cpu3 - cpu2,
            "features": s.features, "features_in_memory": isinstance(train_set.images.features, torch.Tensor),
            "text_input": train_set.codec.kind, "train_captions": len(train_set),
            "val_captions": len(val_set),
            "rss_dataset": rss1 - rss0, "rss_after_load": current_rss(), "arrays_bytes": held,
            "peak_rss": peak_rss()}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Each family in each mode, each in a fresh process."""
    root = Path(args.root)
    record = root / "bench_captions.json"
    if not (record.is_file() and json.loads(record.read_text())["scale"] == args.scale):
        root.mkdir(parents=True, exist_ok=True)
        sizes, _ = build_dataset(root, args.scale, args.seed)
        record.write_text(json.dumps({"scale": args.scale, "sizes": sizes}))
    base = [sys.executable, str(Path(__file__).resolve()), "--root", args.root, "--scale", str(args.scale),
            "--families"]
    results: dict[str, Any] = {}
    for family in args.families:
        for mode in args.modes:
            if mode.startswith("first"):
                shutil.rmtree(root / "data.vse-captions", ignore_errors=True)
            before = os.getloadavg()[0]
            out = child([*base, family, "--phase", "full" if mode == "full" else "captions"],
                        env={"VSE_CAPTION_CACHE": MODES[mode]})
            out["load_average"] = [before, os.getloadavg()[0]]
            results.setdefault(family, {})[mode] = out
            print(f"  {family} {mode}: {json.dumps(out)}", flush=True)
    return results


def table(results: dict[str, Any]) -> str:
    """The Markdown tables: one row per family and caption mode; one per family of the full data load."""
    rows = ["| family | text input | captions loaded | dataset.json read s | captions s | data load s "
            "| CPU s | RSS of the dataset GiB | RSS of the captions GiB | peak RSS GiB | load average |",
            "|" + "|".join([" --- "] * 11) + "|"]
    full = ["| family | features | in RAM | dataset.json read s | rest of the load s | data load s | CPU s "
            "| RSS of the dataset GiB | RSS after the load GiB | peak RSS GiB | load average |",
            "|" + "|".join([" --- "] * 11) + "|"]
    for family, modes in results.items():
        for mode, r in modes.items():
            load = "{:.1f} to {:.1f}".format(*sorted(r["load_average"]))
            if mode == "full":
                in_ram = "yes" if r["features_in_memory"] else "no"
                full.append(f"| {family} | {Path(r['features']).name} | {in_ram} | {r['dataset_s']:.1f} "
                            f"| {r['load_data_s']:.1f} | {r['data_load_s']:.1f} | {r['cpu_s']:.1f} "
                            f"| {r['rss_dataset'] / GIB:.2f} | {r['rss_after_load'] / GIB:.2f} "
                            f"| {r['peak_rss'] / GIB:.2f} | {load} |")
                continue
            rows.append(f"| {family} | {r['text_input']} | {mode} | {r['dataset_s']:.1f} "
                        f"| {r['captions_s']:.1f} | {r['data_load_s']:.1f} | {r['cpu_s']:.1f} "
                        f"| {r['rss_dataset'] / GIB:.2f} | {r['rss_captions'] / GIB:.2f} "
                        f"| {r['peak_rss'] / GIB:.2f} | {load} |")
    return "\n".join(rows) + "\n\nfull data load:\n" + "\n".join(full)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="/work/scale-data", help="the synthetic data (default %(default)s)")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of COCO's size (default 1: full size)")
    p.add_argument("--families", nargs="+", default=["chain", "seam", "liwe"], choices=list(FAMILY_FEATURES),
                   help="default: one family per text input (chars, words, word_chars)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), metavar="MODE",
                   help=f"what to load (default: all): {', '.join(repr(m) for m in MODES)}")
    p.add_argument("--json", metavar="FILE", help="also write every number into FILE")
    p.add_argument("--phase", choices=("captions", "full"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.phase:
        phase = phase_full if args.phase == "full" else phase_captions
        print("RESULT " + json.dumps(phase(args.families[0], Path(args.root), args.scale)), flush=True)
        return 0
    results = measure(args)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
