"""Side-by-side tables of finished runs: test retrieval, and robustness to character noise.

Reads what the run directories already hold (nothing is trained or embedded here):
``config.json``, ``metrics.jsonl``, ``eval/test.json`` (written by ``train <family>``) and
``eval/noise_test.json`` (written by ``train evaluate --run RUN --noise START:STOP:STEP``).

    .venv/bin/python bench/report_runs.py runs/coco-sample-vse-fne runs/coco-sample-vse-pooled
    .venv/bin/python bench/report_runs.py --noise runs/coco-sample-chain runs/coco-sample-vse-pooled

The first form answers "FNE vs the last layer on the same pipeline"; the second "a character model vs a
word model under character noise" (R@1 and R@10 of both directions per noise ratio, and the share of
the clean R@1 that is kept).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from train.run.layout import RunDir


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        sys.exit(f"report_runs: {path} is missing (train the run / run `train evaluate --noise` first)")


def _describe(run: Path) -> str:
    config = _read(RunDir(run).config)
    s = config["settings"]
    features = Path(s["features"].rsplit(":", 1)[0]).name + ":" + s["features"].rsplit(":", 1)[-1]
    model = {"chain": f"chain {s.get('version')} p={s.get('p')}", "oecc": f"oecc {s.get('arch')}",
             "seam": f"seam {s.get('variant')} h={s.get('hops')} l={s.get('penalty')}",
             "vse": f"vse {s.get('kind')} d={s['d']} w={s.get('word_dim')}"}.get(s["family"], s["family"])
    shape = "x".join(map(str, config["feature_shape"]))
    return f"{model}, {features} ({shape})"


def retrieval_table(runs: list[Path]) -> str:
    """Test split, best checkpoint: R@1/5/10 both directions and rsum, with the epochs trained."""
    lines = [f"{'run':<26} {'epochs':>6} {'best':>4} | {'i2t R@1':>7} {'R@5':>5} {'R@10':>5} | "
             f"{'t2i R@1':>7} {'R@5':>5} {'R@10':>5} | {'rsum':>6}  model, features"]
    for run in runs:
        test = _read(RunDir(run).test_eval)
        records = [json.loads(x) for x in RunDir(run).metrics.read_text().splitlines()]
        m = test["protocols"]["all"] if "all" in test["protocols"] else next(iter(test["protocols"].values()))
        i, t = m["i2t"], m["t2i"]
        lines.append(f"{run.name:<26} {len(records):>6} {test['epoch']:>4} | {i['r1']:>7.1f} "
                     f"{i['r5']:>5.1f} {i['r10']:>5.1f} | {t['r1']:>7.1f} {t['r5']:>5.1f} {t['r10']:>5.1f} | "
                     f"{m['rsum']:>6.1f}  {_describe(run)}")
    return "\n".join(lines)


def noise_table(runs: list[Path]) -> str:
    """R@1 / R@10 per noise ratio (``eval/noise_test.json``) and the kept share of the clean R@1."""
    lines = [f"{'run':<26} {'noise':>6} | {'i2t R@1':>7} {'R@10':>5} | {'t2i R@1':>7} {'R@10':>5} | "
             f"{'kept i2t':>8} {'kept t2i':>8}"]
    for run in runs:
        noise = _read(RunDir(run).eval_dir / "noise_test.json")
        clean = noise["clean"]
        rows = [{"ratio": 0.0, **clean}] + noise["ratios"]
        for row in rows:
            kept = [100 * row[d]["r1"] / clean[d]["r1"] if clean[d]["r1"] else float("nan")
                    for d in ("i2t", "t2i")]
            lines.append(f"{run.name:<26} {100 * row['ratio']:>5.0f}% | {row['i2t']['r1']:>7.1f} "
                         f"{row['i2t']['r10']:>5.1f} | {row['t2i']['r1']:>7.1f} {row['t2i']['r10']:>5.1f} | "
                         f"{kept[0]:>7.0f}% {kept[1]:>7.0f}%")
        lines.append(f"{'':<26} ({_describe(run)}; protocol {noise['protocol']}, seed {noise['seed']})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--noise", action="store_true", help="the noise table (eval/noise_test.json)")
    args = parser.parse_args()
    print(noise_table(args.runs) if args.noise else retrieval_table(args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
