"""Benchmark: CHAIN-VSE v1 / v2 and a word-level baseline against real fastText, clean and noisy (CPU).

CHAIN-VSE section 5 (table 5) compares its classifiers with fastText (Joulin et al., "Bag of tricks
for efficient text classification") and claims that character models keep more accuracy under
noise than word models, with about 1.5M parameters, "400x fewer than FastText". Here, on one split
of a prepared classification dataset (by default the sample of ``agnews-sample-chain``: 5,600 train /
500 val / 1,500 test AG News rows), the same train texts train:

- ``chain-v1``, ``chain-v2``: ``train classify`` with the settings of the pipeline's classify section
  (``--pipeline``), only the version changed; ``--seeds`` trains each with several seeds (one row each,
  and a row of the mean and spread);
- ``word-gru``: the word-level baseline: ``train classify --encoder gru`` (a word embedding of the
  train vocabulary + GRU, ``--word-dim`` / ``--gru-units``), the same epochs and early stopping;
- ``fasttext``: real fastText (``pip install 'vse-toolkit[fasttext]'``), its usual AG News settings
  from its ``classification-results.sh``: bigrams (``wordNgrams 2``), ``dim 10``, ``epoch 5``,
  ``minCount 1``, ``bucket 10,000,000``; one thread;
- ``fasttext-char``: the same with character n-grams of 3 to 6 characters (``minn 3``, ``maxn 6``),
  fastText's own answer to misspelt words, the strongest peer under noise.

Both fastText rows take the learning rate of :data:`FASTTEXT_LRS` with the best accuracy on the
validation split (never the test split); the table names it. They read the texts as ``prep`` tokenized
them (lowercased spaCy tokens joined by spaces), which is fastText's own normalisation.

The test texts are evaluated clean and with 10% and 25% of their characters replaced
(:func:`train.engine.noise.add_character_noise`, seeded per ratio as ``train evaluate --noise``), every
row; fastText reads the noisy texts tokenized the same way. Parameters: the toolkit's trainable
parameters; fastText's input matrix (words + hash buckets, ``dim`` wide) plus its output layer, as
allocated. Training time: CPU seconds of this process (``time.process_time``) and wall seconds; on a
shared machine the CPU seconds are what the training itself cost.

    train pipeline agnews-sample-chain --until prep        # the split (once)
    python bench/bench_classify.py --models fasttext fasttext-char chain-v1
    python bench/bench_classify.py --models chain-v1 --seeds 0 1 2 --epochs 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.schema import get_pipeline
from prep.textcls import TextClsDataset
from train.engine.noise import add_character_noise, caption_alphabet
from vsecore import console

MODELS = ("chain-v1", "chain-v2", "word-gru", "fasttext", "fasttext-char")
#: fastText's AG News settings (its classification-results.sh), one thread; the learning rate is tuned
FASTTEXT = {"dim": 10, "wordNgrams": 2, "minCount": 1, "bucket": 10_000_000, "epoch": 5, "thread": 1,
            "verbose": 0}
#: ``fasttext-char``: character n-grams of 3 to 6 characters besides the bigrams
CHAR_NGRAMS = {"minn": 3, "maxn": 6}
#: the learning rates tried, each fastText row keeping the best on the validation split
FASTTEXT_LRS = (0.1, 0.25, 0.5, 1.0)


def noisy_sets(texts: list[str], ratios: list[float], seed: int) -> dict[float, list[str]]:
    """The test texts at each ratio (0: clean), noise seeded per ratio as ``train evaluate --noise``."""
    alphabet = caption_alphabet(texts)
    out = {0.0: list(texts)}
    for ratio in ratios:
        rng = np.random.default_rng([seed, int(round(ratio * 1_000_000))])
        out[ratio] = add_character_noise(texts, ratio, alphabet, rng)
    return out


def run_toolkit(name: str, args: argparse.Namespace, data: Path, sets: dict[float, list[str]],
                seed: int | None = None, train_noise: float = 0.0) -> dict[str, Any]:
    """Train one toolkit model with ``train classify`` (``seed``: instead of the pipeline's; ``train_noise``:
    its ``--train-noise``) and evaluate it on every noise level; ``epochs`` is ``best/last``."""
    import torch

    from train.classification.fit import run_classification
    from train.classification.run import load_classification_run
    from train.models.classifier import encoder_keys

    torch.set_num_threads(args.threads)
    base = get_pipeline(args.pipeline).classify
    label = name + (f" (seed {seed})" if seed is not None else "") + (
        f" (train noise {train_noise:g})" if train_noise else "")
    out = Path(args.out) / f"{name}-seed{seed}-noise{train_noise:g}"
    update: dict[str, Any] = {"data": str(data), "out": str(out), "train_noise": train_noise}
    if seed is not None:
        update["seed"] = seed
    if args.epochs:
        update["epochs"] = args.epochs
    values = {**base.model_dump(exclude_unset=True), **update}
    if name.startswith("chain"):
        values.update(encoder="chain", version=name.split("-")[1])
    else:
        for key, encoders in encoder_keys().items():
            if "gru" not in encoders:
                values.pop(key, None)
        values.update(encoder="gru", word_dim=args.word_dim, gru_units=args.gru_units)
    settings = type(base).model_validate(values)
    cpu, wall = time.process_time(), time.perf_counter()
    run_dir = run_classification(settings, overwrite=True, log=console.detail)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    run = load_classification_run(run_dir, "best", "cpu")
    accuracy = {ratio: run.evaluate("test", texts)["accuracy"] for ratio, texts in sets.items()}
    last = len((run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines())
    return {"model": label, "parameters": run.model.parameter_report()["total"], "train_cpu_s": cpu,
            "train_wall_s": wall, "accuracy": accuracy, "epochs": f"{run.epoch}/{last}"}


def _fasttext_file(dataset: TextClsDataset, split: str, folder: Path) -> Path:
    """The ``split`` texts as fastText's training file: ``__label__K`` and the prepared tokens."""
    path = folder / f"{split}.txt"
    lines = [f"__label__{dataset.targets[k]} {' '.join(dataset.tokens[k])}\n" for k in dataset.rows(split)]
    path.write_text("".join(lines), encoding="utf-8")
    return path


def _fasttext_accuracy(model: Any, lines: list[str], truth: np.ndarray) -> float:
    labels, _ = model.predict(lines, k=1)
    predicted = np.array([int(lab[0].removeprefix("__label__")) for lab in labels])
    return 100.0 * float((predicted == truth).mean())


def run_fasttext(name: str, dataset: TextClsDataset, sets: dict[float, list[str]], lang: str
                 ) -> dict[str, Any]:
    """Train real fastText (``name``: ``fasttext`` or ``fasttext-char``) on the train split's prepared tokens
    at each of :data:`FASTTEXT_LRS`, keep the best on the val split; its accuracy on every noise level."""
    try:
        import fasttext
    except ImportError:
        raise SystemExit("fastText is not installed: pip install 'vse-toolkit[fasttext]' (fasttext-numpy2)"
                         ) from None
    from prep.tokenize import tokenize

    options = {**FASTTEXT, **(CHAR_NGRAMS if name == "fasttext-char" else {})}
    val_lines = [" ".join(dataset.tokens[k]) for k in dataset.rows("val")]
    val_truth = dataset.targets[dataset.rows("val")]
    best: tuple[float, float, Any, float, float] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        path = _fasttext_file(dataset, "train", Path(tmp))
        for lr in FASTTEXT_LRS:
            cpu, wall = time.process_time(), time.perf_counter()
            model = fasttext.train_supervised(input=str(path), seed=0, lr=lr, **options)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            val = _fasttext_accuracy(model, val_lines, val_truth)
            if best is None or val > best[0]:
                best = (val, lr, model, cpu, wall)
    assert best is not None
    val, lr, model, cpu, wall = best
    truth = dataset.targets[dataset.rows("test")]
    accuracy = {ratio: _fasttext_accuracy(model, [" ".join(t) for t in tokenize(texts, lang, True)], truth)
                for ratio, texts in sets.items()}
    rows_in, dim = model.get_input_matrix().shape
    parameters = rows_in * dim + int(np.prod(model.get_output_matrix().shape))
    return {"model": f"{name} (lr {lr:g})", "parameters": parameters, "train_cpu_s": cpu,
            "train_wall_s": wall, "accuracy": accuracy, "epochs": options["epoch"], "words": len(model.words),
            "lr": lr, "val_accuracy": val}


def cpu_name() -> str:
    """The CPU's model name (``lscpu``), else the platform's."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def spread_row(runs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The mean of several seeds' rows, each accuracy written ``mean ± (max - min) / 2``."""
    levels = runs[0]["accuracy"]

    def half_range(lv: float) -> float:
        return (max(r["accuracy"][lv] for r in runs) - min(r["accuracy"][lv] for r in runs)) / 2

    return {"model": f"{name} (mean of {len(runs)} seeds)", "parameters": runs[0]["parameters"],
            "train_cpu_s": float(np.mean([r["train_cpu_s"] for r in runs])),
            "train_wall_s": float(np.mean([r["train_wall_s"] for r in runs])),
            "accuracy": {lv: float(np.mean([r["accuracy"][lv] for r in runs])) for lv in levels},
            "half_range": {lv: half_range(lv) for lv in levels},
            "epochs": "/".join(str(r["epochs"]) for r in runs)}


def table(results: list[dict[str, Any]], ratios: list[float]) -> str:
    """The markdown table the README shows."""
    levels = [0.0, *ratios]
    head = ["model", "parameters", *[("clean" if r == 0 else f"{100 * r:.0f}% noise") for r in levels],
            "train CPU s", "train wall s", "epochs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        spread = r.get("half_range")
        acc = [f"{r['accuracy'][lv]:.2f}" + (f" ± {spread[lv]:.2f}" if spread else "") for lv in levels]
        lines.append(f"| {r['model']} | {r['parameters']:,} | " + " | ".join(acc)
                     + f" | {r['train_cpu_s']:.0f} | {r['train_wall_s']:.0f} | {r['epochs']} |")
    return "\n".join(lines)


def run_models(args: argparse.Namespace, dataset: TextClsDataset, data: Path, sets: dict[float, list[str]],
               lang: str) -> list[dict[str, Any]]:
    """Every model of ``args.models`` (toolkit models once per seed and train noise, ``args.jobs`` at a
    time, each in its own process), in the order asked."""
    results: list[dict[str, Any]] = []
    toolkit = [(name, seed, noise) for name in args.models if not name.startswith("fasttext")
               for noise in args.train_noise for seed in (args.seeds or [None])]
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn")) as pool:
        futures = {job: pool.submit(run_toolkit, job[0], args, data, sets, job[1], job[2]) for job in toolkit}
        for name in args.models:
            if name.startswith("fasttext"):
                runs = [run_fasttext(name, dataset, sets, lang)]
            else:
                for noise in args.train_noise:
                    runs = [futures[(name, seed, noise)].result() for seed in (args.seeds or [None])]
                    results.extend(_report(runs, f"{name}" + (f" (train noise {noise:g})" if noise else "")))
                continue
            results.extend(_report(runs, name))
    return results


def _report(runs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Print each run's accuracies; the runs, and their spread row when there are several seeds."""
    for result in runs:
        print(f"{result['model']}: " + ", ".join(f"{k} {v:.2f}" for k, v in result["accuracy"].items())
              + f" ({result['train_cpu_s']:.0f} CPU s)", flush=True)
    return runs + ([spread_row(runs, name)] if len(runs) > 1 else [])


def main() -> None:
    """Parse the options, train every model, print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeline", default="agnews-sample-chain",
                   help="pipeline whose prepared data and classify settings are used")
    p.add_argument("--data", default=None, help="prepared classification dataset (default: the pipeline's)")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--seeds", nargs="+", type=int, default=None,
                   help="toolkit models: train once per seed (default: the pipeline's seed, once)")
    p.add_argument("--train-noise", dest="train_noise", nargs="+", type=float, default=[0.0],
                   help="toolkit models: train once per value of `train classify --train-noise` (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="toolkit trainings run at once, one process each")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each toolkit training")
    p.add_argument("--noise", nargs="+", type=float, default=[0.10, 0.25], help="noise ratios")
    p.add_argument("--noise-seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=None, help="override the pipeline's epochs (toolkit models)")
    p.add_argument("--word-dim", type=int, default=100, help="word-gru: word embedding size")
    p.add_argument("--gru-units", type=int, default=128, help="word-gru: GRU units")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "bench_classify"),
                   help="folder of the toolkit's run directories")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    pipe = get_pipeline(args.pipeline)
    data = Path(args.data or pipe.prep.out)
    dataset = TextClsDataset.load(data)
    test_texts = [dataset.texts[k] for k in dataset.rows("test")]
    sets = noisy_sets(test_texts, args.noise, args.noise_seed)
    print(f"{dataset.name}: {len(dataset.rows('train')):,} train / {len(dataset.rows('val')):,} val / "
          f"{len(test_texts):,} test texts; CPU {cpu_name()}, {os.cpu_count()} cores, torch threads "
          f"{args.threads} per training, {args.jobs} at a time, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    results = run_models(args, dataset, data, sets, pipe.classify.lang)
    print(table(results, args.noise))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()
