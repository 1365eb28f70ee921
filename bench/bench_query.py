"""Time of ``train query``: the first query of a run (cold: the candidates embedded, then kept in the query
cache) and a later one (warm: the candidates read back from the cache), text -> image and image -> text.

Each query is the whole command in a fresh process (``python -m train query``, Python's start and the
imports included), under every source tree given (``--trees OLD NEW``: e.g. a worktree of the commit before
the cache and this checkout; a tree without the cache embeds at every call, so its cold and warm are the
same work). Each repetition gets a new, empty cache folder (``VSE_QUERY_CACHE``): cold is its first query,
warm the best of the ``--warm`` queries after it; the trees are alternated so both see the same load. Then,
in this process with this checkout, the parts of one query: loading the run, the first search (cold) and a
search by a second run object (warm: what a new process does after loading).

    .venv/bin/python bench/bench_query.py --run runs/coco-sample-chain --trees /tmp/wt-before . --split all
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _command(tree: Path, run: str, option: str, query: str, split: str, cache: Path) -> float:
    """Wall seconds of one ``train query`` under ``tree`` with the query cache in ``cache``."""
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "VSE_QUERY_CACHE": str(cache)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "train", "query", "--run", run, option, query, "--split", split,
                    "--top", "5", "--device", "cpu", "-q"], check=True, env=env, cwd=tree,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def end_to_end(trees: list[Path], run: str, queries: dict[str, tuple[str, str]], split: str, repeat: int,
               warm: int) -> None:
    """Best cold and warm command times of each direction under each tree."""
    print(f"{'tree':40s} {'query':6s} {'split':5s} {'cold s':>7s} {'warm s':>7s}  (best of {repeat}; "
          f"warm: best of {warm} after each cold)")
    for direction, (option, query) in queries.items():
        best = {t: [float("inf"), float("inf")] for t in trees}
        for _ in range(repeat):
            for tree in trees:
                with tempfile.TemporaryDirectory(prefix="bench-query-") as cache:
                    cold = _command(tree, run, option, query, split, Path(cache))
                    again = min(_command(tree, run, option, query, split, Path(cache)) for _ in range(warm))
                best[tree] = [min(best[tree][0], cold), min(best[tree][1], again)]
        for tree, (cold, again) in best.items():
            print(f"{str(tree)[-40:]:40s} {direction:6s} {split:5s} {cold:7.2f} {again:7.2f}  "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)


def in_process(run_dir: str, queries: dict[str, tuple[str, str]], split: str) -> None:
    """The parts of one query in this process (this checkout): load, cold search, warm search."""
    from train.retrieval.open import load_run

    wanted = None if split == "all" else split
    with tempfile.TemporaryDirectory(prefix="bench-query-") as cache:
        os.environ["VSE_QUERY_CACHE"] = cache
        for direction, (option, query) in queries.items():
            kwargs = {"text": query} if option == "--text" else {"image": query}
            times = []
            for _ in range(2):
                start = time.perf_counter()
                run = load_run(run_dir, device="cpu")
                loaded = time.perf_counter()
                run.search(top=5, split=wanted, **kwargs)
                times.append((loaded - start, time.perf_counter() - loaded))
            (load, cold), (_, warm) = times
            print(f"in process, {direction:5s} {split:5s}: load_run {load:.2f} s, search cold {cold:.2f} s, "
                  f"search warm {warm:.2f} s (a new run object, candidates from the cache)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a run directory or model folder")
    parser.add_argument("--trees", nargs="+", default=[str(ROOT)],
                        help="source trees to time (default: this checkout)")
    parser.add_argument("--text", default="a dog on a beach")
    parser.add_argument("--image", default=None, help="default: the first image of the run's test split")
    parser.add_argument("--split", default="test", choices=("train", "val", "test", "all"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warm", type=int, default=2, help="warm queries after each cold one")
    args = parser.parse_args()
    image = args.image
    if image is None:
        from train.retrieval.open import load_run

        dataset = load_run(args.run, device="cpu").dataset
        image = str(dataset.images_of("test")[0].path)
    queries = {"text": ("--text", args.text), "image": ("--image", image)}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; torch threads: the default")
    end_to_end([Path(t) for t in args.trees], str(Path(args.run).resolve()), queries, args.split, args.repeat,
               args.warm)
    in_process(args.run, queries, args.split)


if __name__ == "__main__":
    main()
