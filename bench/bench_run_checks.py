"""What the run-directory checks cost a reader of a run: ``train evaluate --run`` with and without them.

Times :func:`train.retrieval.evaluate.run.evaluate_run` on a run (its default outputs in ``RUN/eval``)
``--repeat``
times with every check of ``docs/safety.md`` (output paths, the dataset files' fingerprints, the
feature matrix's fingerprint), then as many times with those checks replaced by no-ops, alternating,
and prints the medians, their difference, and each check timed alone (the dataset check both on its
recorded size and mtime and by re-hashing). Nothing is asserted.

    .venv/bin/python bench/bench_run_checks.py --run runs/chain [--repeat 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train.config import run as runs  # noqa: E402
from train.retrieval import loaded  # noqa: E402
from train.retrieval.evaluate import run as evaluate_cli  # noqa: E402
from train.retrieval.open import load_run  # noqa: E402


def _timed(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    """Print the timings (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a run directory")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    run_dir = Path(args.run)
    quiet = lambda *a, **k: None  # noqa: E731

    def evaluate() -> None:
        evaluate_cli.evaluate_run(run_dir, device=args.device, log=quiet)

    real = (evaluate_cli.check_run_outputs, loaded.changed_dataset_files, loaded.features_fingerprint)
    config = runs.read_config(run_dir)
    recorded = config["fingerprints"]["features"]

    def checks_off() -> None:
        evaluate_cli.check_run_outputs = lambda *a, **k: None
        loaded.changed_dataset_files = lambda *a, **k: []
        loaded.features_fingerprint = lambda *a, **k: recorded

    def checks_on() -> None:
        evaluate_cli.check_run_outputs, loaded.changed_dataset_files, loaded.features_fingerprint = real

    evaluate()  # warm-up: imports, page cache
    with_checks, without = [], []
    for _ in range(args.repeat):
        checks_on()
        with_checks.append(_timed(evaluate, 1))
        checks_off()
        without.append(_timed(evaluate, 1))
    checks_on()
    on, off = statistics.median(with_checks), statistics.median(without)
    print(f"train evaluate --run {run_dir}: median {on:.3f}s with the checks, {off:.3f}s without "
          f"({100 * (on - off) / off:+.2f}%, {args.repeat} alternating runs each)")

    data = config["settings"]["data"]
    outputs = evaluate_cli.run_outputs(run_dir, "test", "best", None, False, False, None, None, None, None)
    t_out = _timed(lambda: evaluate_cli.check_run_outputs(run_dir, outputs, False, list(outputs)), 20)
    t_stat = _timed(lambda: runs.changed_dataset_files(config, data), 20)
    no_stats = {k: v for k, v in config.items() if k != "fingerprint_stats"}
    t_hash = _timed(lambda: runs.changed_dataset_files(no_stats, data), 3)
    opened = load_run(run_dir, "best", args.device)
    x, valid = opened.features
    t_feat = _timed(lambda: runs.features_fingerprint(x, valid), 5)
    print(f"alone: output paths {1e3 * t_out:.2f} ms; dataset files {1e3 * t_stat:.2f} ms by size and "
          f"mtime, {1e3 * t_hash:.1f} ms re-hashed; feature fingerprint of the {x.shape} matrix "
          f"{1e3 * t_feat:.1f} ms")


if __name__ == "__main__":
    main()
