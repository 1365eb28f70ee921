"""The evaluation of a classification run: the metrics of a checkpoint on a split, the accuracy under
character noise and its figure. :func:`evaluate_run` is the one evaluation of a run: ``train evaluate --run``
of a classification run, the pipeline runner and the test evaluation after training
(:func:`train.classification.fit.run_classification`, into ``eval/test.json``) all call it; the metrics
come from :func:`train.classification.model.evaluate_texts`, which the validation during training
computes too."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from train.classification.metrics import format_metrics
from train.classification.run import ClassificationRun, load_classification_run
from train.engine.noise import add_character_noise, caption_alphabet, parse_ratio_range
from train.engine.plots import new_figure, save_figure
from train.engine.trainer import write_evaluation
from train.run.layout import RunDir, evaluation_name, noise_name
from vsecore import console


def noise_accuracy(run: ClassificationRun, ratios: Sequence[float], split: str = "test", seed: int = 0
                   ) -> dict[str, Any]:
    """Accuracy of ``split`` with ``ratio`` of each text's characters replaced (the retrieval analysis's
    :func:`train.retrieval.evaluate.analysis.add_character_noise`, same seeding per ratio), for each ratio.

    Returns ``{"split", "seed", "clean": {accuracy, macro_f1}, "ratios": [{"ratio", "accuracy",
    "macro_f1"}]}``.
    """
    texts = run.split_texts(split).texts
    alphabet = caption_alphabet(texts)
    clean = run.evaluate(split)
    rows = []
    for ratio in ratios:
        rng = np.random.default_rng([seed, int(round(ratio * 1_000_000))])
        m = run.evaluate(split, add_character_noise(texts, ratio, alphabet, rng))
        rows.append({"ratio": ratio, "accuracy": m["accuracy"], "macro_f1": m["macro_f1"]})
        console.info(f"noise {100 * ratio:.0f}%: accuracy {m['accuracy']:.2f}%")
    return {"split": split, "seed": seed, "texts": len(texts),
            "clean": {"accuracy": clean["accuracy"], "macro_f1": clean["macro_f1"]}, "ratios": rows}


def plot_noise_accuracy(result: dict[str, Any], path: str | Path, title: str) -> Path:
    """PNG of the accuracy against the noise ratio (clean at 0%)."""
    fig, ax = new_figure(1, width=6.0, height=4.0)
    x = [0.0] + [100 * r["ratio"] for r in result["ratios"]]
    y = [result["clean"]["accuracy"]] + [r["accuracy"] for r in result["ratios"]]
    ax.plot(x, y, marker="o", markersize=3)
    ax.set_xlabel("noise ratio (% of characters replaced)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return save_figure(fig, path)


def evaluate_run(run_dir: Path, split: str = "test", checkpoint: str = "best", device: str = "auto",
                 noise: str | None = None, noise_seed: int = 0, json_path: Path | None = None,
                 out: Path | None = None) -> dict[str, Any]:
    """Evaluate a classification run: the metrics of ``split`` (``eval/<split>_<checkpoint>.json``, or
    ``json_path``) and, with ``noise`` (``START:STOP:STEP``), the accuracy per character-noise ratio
    (``eval/noise_<split>.json`` and its PNG); ``out`` replaces ``eval/``. Returns the metrics."""
    run = load_classification_run(run_dir, checkpoint, device)
    out = out or RunDir(run_dir).eval_dir
    metrics = run.evaluate(split)
    console.result(format_metrics(metrics, f"{run_dir.name}: {split} split, {checkpoint} checkpoint "
                                           f"(epoch {run.epoch})"))
    write_evaluation(json_path or out / evaluation_name(split, checkpoint),
                     {"split": split, "checkpoint": checkpoint, "epoch": run.epoch, **metrics})
    if noise:
        result = noise_accuracy(run, parse_ratio_range(noise), split, noise_seed)
        lines = [f"noise robustness ({split}, {result['texts']:,} texts, seed {result['seed']}): accuracy",
                 f"  clean {result['clean']['accuracy']:6.2f}%"]
        lines += [f"  {100 * r['ratio']:4.0f}% {r['accuracy']:6.2f}%" for r in result["ratios"]]
        console.result("\n".join(lines))
        write_evaluation(out / noise_name(split), result)
        png = plot_noise_accuracy(result, out / noise_name(split, "png"),
                                  f"{run_dir.name}: accuracy under character noise ({split})")
        console.info(f"wrote {png}")
    return metrics
