"""Metrics of a text classifier: accuracy, macro-F1, per-class precision / recall / F1, confusion matrix.

``confusion[i][j]`` counts the texts of true class ``i`` predicted as class ``j``. A class that is
never predicted has precision 0 (and one without texts recall 0), the convention of most toolkits,
so that macro-F1 stays defined; such a class is flagged in its ``warning`` field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def confusion_matrix(truth: np.ndarray, predicted: np.ndarray, num_classes: int) -> np.ndarray:
    """``(K, K)`` int64 counts: row = true class, column = predicted class."""
    truth = np.asarray(truth, dtype=np.int64)
    predicted = np.asarray(predicted, dtype=np.int64)
    if truth.shape != predicted.shape:
        raise ValueError(f"{truth.shape[0]} true labels but {predicted.shape[0]} predictions")
    flat = np.bincount(truth * num_classes + predicted, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes)


def classification_metrics(truth: np.ndarray, predicted: np.ndarray, labels: Sequence[str]) -> dict[str, Any]:
    """All metrics of predictions ``predicted`` (N,) against ``truth`` (N,), classes named ``labels``.

    Returns ``{"texts", "accuracy", "macro_f1", "per_class": [{"label", "precision", "recall", "f1",
    "support", "predicted"}], "confusion": [[...]], "labels"}``; rates are percentages.
    """
    k = len(labels)
    cm = confusion_matrix(truth, predicted, k)
    correct = np.diag(cm).astype(np.float64)
    support = cm.sum(axis=1)
    predicted_n = cm.sum(axis=0)
    per_class = []
    f1s = []
    for c in range(k):
        precision = correct[c] / predicted_n[c] if predicted_n[c] else 0.0
        recall = correct[c] / support[c] if support[c] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
        f1s.append(f1)
        entry: dict[str, Any] = {"label": labels[c], "precision": 100 * precision, "recall": 100 * recall,
                                 "f1": 100 * f1, "support": int(support[c]), "predicted": int(predicted_n[c])}
        if not predicted_n[c] or not support[c]:
            entry["warning"] = "never predicted" if not predicted_n[c] else "no texts of this class"
        per_class.append(entry)
    n = int(cm.sum())
    return {"texts": n, "accuracy": 100 * float(correct.sum()) / n if n else 0.0,
            "macro_f1": 100 * float(np.mean(f1s)) if k else 0.0, "per_class": per_class,
            "confusion": cm.tolist(), "labels": list(labels)}


def format_metrics(metrics: dict[str, Any], title: str) -> str:
    """A plain-text table: accuracy and macro-F1, then one line per class, then the confusion matrix."""
    width = max(8, *(len(name) for name in metrics["labels"]))
    lines = [title, f"accuracy {metrics['accuracy']:.2f}%  macro-F1 {metrics['macro_f1']:.2f}%  "
             f"({metrics['texts']:,} texts)",
             f"{'class':<{width}} {'precision':>9} {'recall':>7} {'F1':>7} {'support':>8}"]
    for c in metrics["per_class"]:
        lines.append(f"{c['label']:<{width}} {c['precision']:>9.2f} {c['recall']:>7.2f} {c['f1']:>7.2f} "
                     f"{c['support']:>8,}")
    lines.append("confusion (rows: true class, columns: predicted, in the order above)")
    for name, row in zip(metrics["labels"], metrics["confusion"], strict=True):
        lines.append(f"{name:<{width}} " + " ".join(f"{v:>6}" for v in row))
    return "\n".join(lines)
