"""How long the commands take to start: ``--help``, an argument error and ``import train.cli``.

Each case runs in a fresh Python process (``python -m prep|features|train ...``, the same modules as the
console scripts) ``--repeat`` times; the table shows the best and the median wall time, and whether the
process loaded torch (one more run under ``-X importtime``, which lists every module imported). The best
of several runs is the start-up itself; the median shows how much a busy machine adds. Nothing is asserted
(a test that fails on time would fail on a busy machine): ``tests/test_startup.py`` checks only which
modules load.

    .venv/bin/python bench/bench_startup.py [--repeat 7] [--root PATH]

``--root`` times another checkout with this interpreter (e.g. a ``git worktree`` of an older commit, to
compare before and after a change on one machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: (what the table calls it, the command line after ``python``); ``train chain --bogus`` and ``--d
#: notanumber`` are the argument errors of issue 43.4 (argparse ends both with exit status 2)
CASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("prep --help", ("-m", "prep", "--help")),
    ("features --help", ("-m", "features", "--help")),
    ("train --help", ("-m", "train", "--help")),
    ("train chain --help", ("-m", "train", "chain", "--help")),
    ("train evaluate --help", ("-m", "train", "evaluate", "--help")),
    ("train chain --bogus", ("-m", "train", "chain", "--bogus")),
    ("train chain --d notanumber", ("-m", "train", "chain", "--d", "notanumber")),
    ("import train.cli", ("-c", "import train.cli")),
)


def _run(argv: tuple[str, ...], root: Path, flags: tuple[str, ...] = ()) -> tuple[float, str]:
    """One fresh process: its wall time in seconds and its standard error."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *flags, *argv], cwd=root, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(argv)}: exit status {done.returncode}\n{done.stderr[-2000:]}")
    return seconds, done.stderr


def loads_torch(argv: tuple[str, ...], root: Path) -> bool:
    """Whether the command imports torch (one more process, under ``-X importtime``, not timed)."""
    _, stderr = _run(argv, root, ("-X", "importtime"))
    return any(line.rpartition("|")[2].strip() == "torch" for line in stderr.splitlines())


def main() -> None:
    """Print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="fresh processes per case (default 7)")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout to time (default: this one)")
    args = parser.parse_args()
    root = args.root.resolve()
    print(f"{root} ({os.cpu_count()} CPUs visible, best and median of {args.repeat} fresh processes)")
    print(f"| {'command':28s} | best (s) | median (s) | torch |")
    print(f"| {'-' * 28} | -------- | ---------- | ----- |")
    for name, argv in CASES:
        times = [_run(argv, root)[0] for _ in range(args.repeat)]
        torch = "yes" if loads_torch(argv, root) else "no"
        best, median = min(times), statistics.median(times)
        print(f"| {name:28s} | {best:8.2f} | {median:10.2f} | {torch:5s} |", flush=True)


if __name__ == "__main__":
    main()
