"""Benchmark: CHAIN-VSE v1 / v2 and a word-level baseline against real fastText, clean and noisy (CPU).

CHAIN-VSE section 5 (table 5) compares its classifiers with fastText (Joulin et al., "Bag of tricks
for efficient text classification") and claims that character models keep more accuracy under
noise than word models, with about 1.5M parameters, "400x fewer than FastText". Here, on one split
of a prepared classification dataset (by default the sample of ``agnews-sample-chain``: 5,600 train /
500 val / 1,500 test AG News rows), the same train texts train:

- ``chain-v1``, ``chain-v2``: ``train classify`` with the settings of the pipeline's classify section
  (``--pipeline``), only the version changed;
- ``word-gru``: the word-level baseline: ``train classify --encoder gru`` (a word embedding of the
  train vocabulary + GRU, ``--word-dim`` / ``--gru-units``), the same epochs and early stopping;
- ``fasttext``: real fastText (``pip install 'vse-toolkit[fasttext]'``), its usual AG News settings
  from its ``classification-results.sh``: bigrams (``wordNgrams 2``), ``dim 10``, ``lr 0.25``,
  ``epoch 5``, ``minCount 1``, ``bucket 10,000,000``; one thread. It reads the texts as ``prep``
  tokenized them (lowercased spaCy tokens joined by spaces), which is fastText's own normalisation.

The test texts are evaluated clean and with 10% and 25% of their characters replaced
(:func:`train.retrieval.evaluate.analysis.add_character_noise`, seeded per ratio as the retrieval analysis);
fastText
reads the noisy texts tokenized the same way. Parameters: the toolkit's trainable parameters;
fastText's input matrix (words + hash buckets, ``dim`` wide) plus its output layer, as allocated.
Training time: CPU seconds of this process (``time.process_time``) and wall seconds; on a shared
machine the CPU seconds are what the training itself cost.

    train pipeline agnews-sample-chain --until prep        # the split (once)
    python bench/bench_classify.py                         # about 20 minutes on 2 CPU cores
    python bench/bench_classify.py --models fasttext chain-v1 --epochs 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.schema import get_pipeline
from prep.textcls import TextClsDataset
from train.retrieval.evaluate.analysis import add_character_noise, caption_alphabet
from vsecore import console

MODELS = ("chain-v1", "chain-v2", "word-gru", "fasttext")
#: fastText's AG News settings (its classification-results.sh), one thread
FASTTEXT = {"dim": 10, "lr": 0.25, "wordNgrams": 2, "minCount": 1, "bucket": 10_000_000, "epoch": 5,
            "thread": 1, "verbose": 0}


def noisy_sets(texts: list[str], ratios: list[float], seed: int) -> dict[float, list[str]]:
    """The test texts at each ratio (0: clean), noise seeded per ratio as ``train evaluate --noise``."""
    alphabet = caption_alphabet(texts)
    out = {0.0: list(texts)}
    for ratio in ratios:
        rng = np.random.default_rng([seed, int(round(ratio * 1_000_000))])
        out[ratio] = add_character_noise(texts, ratio, alphabet, rng)
    return out


def run_toolkit(name: str, args: argparse.Namespace, data: Path, sets: dict[float, list[str]]
                ) -> dict[str, Any]:
    """Train one toolkit model with ``train classify`` and evaluate it on every noise level."""
    from train.classification.fit import run_classification
    from train.classification.run import load_classification_run

    base = get_pipeline(args.pipeline).classify
    update: dict[str, Any] = {"data": str(data), "out": str(Path(args.out) / name)}
    if args.epochs:
        update["epochs"] = args.epochs
    values = {**base.model_dump(exclude_unset=True), **update}
    if name.startswith("chain"):
        values.update(encoder="chain", version=name.split("-")[1])
    else:
        for key in ("version", "p", "arch", "variant", "hops", "penalty"):
            values.pop(key, None)
        values.update(encoder="gru", word_dim=args.word_dim, gru_units=args.gru_units)
    settings = type(base).model_validate(values)
    cpu, wall = time.process_time(), time.perf_counter()
    run_dir = run_classification(settings, overwrite=True, log=console.detail)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    run = load_classification_run(run_dir, "best", "cpu")
    accuracy = {ratio: run.evaluate("test", texts)["accuracy"] for ratio, texts in sets.items()}
    return {"model": name, "parameters": run.model.parameter_report()["total"], "train_cpu_s": cpu,
            "train_wall_s": wall, "accuracy": accuracy, "epochs": run.epoch}


def run_fasttext(dataset: TextClsDataset, sets: dict[float, list[str]], lang: str) -> dict[str, Any]:
    """Train real fastText on the train split's prepared tokens; accuracy on every noise level."""
    try:
        import fasttext
    except ImportError:
        raise SystemExit("fastText is not installed: pip install 'vse-toolkit[fasttext]' (fasttext-numpy2)"
                         ) from None
    from prep.tokenize import tokenize

    rows = dataset.rows("train")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.txt"
        lines = [f"__label__{dataset.targets[k]} {' '.join(dataset.tokens[k])}\n" for k in rows]
        path.write_text("".join(lines), encoding="utf-8")
        cpu, wall = time.process_time(), time.perf_counter()
        model = fasttext.train_supervised(input=str(path), seed=0, **FASTTEXT)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    truth = dataset.targets[dataset.rows("test")]
    accuracy = {}
    for ratio, texts in sets.items():
        lines = [" ".join(t) for t in tokenize(texts, lang, True)]
        labels, _ = model.predict(lines, k=1)
        predicted = np.array([int(lab[0].removeprefix("__label__")) for lab in labels])
        accuracy[ratio] = 100.0 * float((predicted == truth).mean())
    rows_in, dim = model.get_input_matrix().shape
    parameters = rows_in * dim + int(np.prod(model.get_output_matrix().shape))
    return {"model": "fasttext", "parameters": parameters, "train_cpu_s": cpu, "train_wall_s": wall,
            "accuracy": accuracy, "epochs": FASTTEXT["epoch"], "words": len(model.words)}


def cpu_name() -> str:
    """The CPU's model name (``lscpu``), else the platform's."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def table(results: list[dict[str, Any]], ratios: list[float]) -> str:
    """The markdown table the README shows."""
    levels = [0.0, *ratios]
    head = ["model", "parameters", *[("clean" if r == 0 else f"{100 * r:.0f}% noise") for r in levels],
            "train CPU s", "train wall s", "epochs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        acc = [f"{r['accuracy'][lv]:.2f}" for lv in levels]
        lines.append(f"| {r['model']} | {r['parameters']:,} | " + " | ".join(acc)
                     + f" | {r['train_cpu_s']:.0f} | {r['train_wall_s']:.0f} | {r['epochs']} |")
    return "\n".join(lines)


def main() -> None:
    """Parse the options, train every model, print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeline", default="agnews-sample-chain",
                   help="pipeline whose prepared data and classify settings are used")
    p.add_argument("--data", default=None, help="prepared classification dataset (default: the pipeline's)")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
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
          f"{__import__('torch').get_num_threads()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for name in args.models:
        result = (run_fasttext(dataset, sets, pipe.classify.lang) if name == "fasttext"
                  else run_toolkit(name, args, data, sets))
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in result["accuracy"].items())
              + f" ({result['train_cpu_s']:.0f} CPU s)", flush=True)
        results.append(result)
    print(table(results, args.noise))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()
