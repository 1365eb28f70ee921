"""Evaluation results as the papers lay them out (text tables), as JSON, and per query as CSV.

The retrieval table has one row per protocol and the columns of the CHAIN-VSE / VSE++ tables:
``Image-to-text R@1 R@5 R@10 Med r Mean r | Text-to-image R@1 R@5 R@10 Med r Mean r | rsum``.
The JSON is ``{protocol: {"i2t": {"r1", "r5", "r10", "medr", "meanr", "ties"}, "t2i": {...}, "rsum"}}``
(``ties``: queries whose ground-truth score is tied by a candidate counted against it).
The ranks CSV is described at :func:`write_ranks_csv`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from train.retrieval.evaluate.metrics import DirectionMetrics, RetrievalMetrics
from train.retrieval.evaluate.protocols import PROTOCOL_NAMES, ProtocolResult
from vsecore.io import atomic_file

#: columns of the ranks CSV (the last two only with top-K candidates)
RANKS_COLUMNS = ("protocol", "fold", "direction", "query", "rank", "ties", "ground_truth", "topk",
                 "topk_scores")

PROTOCOL_LABELS = PROTOCOL_NAMES

_DIRECTION_COLUMNS = ("R@1", "R@5", "R@10", "Med r", "Mean r")
_WIDTH = 7


def protocol_label(protocol: str, result: ProtocolResult | None = None) -> str:
    """Display name of a protocol, e.g. ``COCO-5cv`` or ``all (1000 images)``."""
    label = PROTOCOL_LABELS.get(protocol, protocol)
    if protocol == "all" and result is not None:
        label = f"all ({result.n_images} img)"
    return label


def _number(value: float) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1f}"


def _direction_cells(d: DirectionMetrics) -> list[str]:
    return [_number(v) for v in (d.r1, d.r5, d.r10, d.medr, d.meanr)]


def format_retrieval_table(rows: Mapping[str, RetrievalMetrics], title: str | None = None) -> str:
    """A fixed-width table, one row per label (protocol or method), laid out like the papers."""
    label_width = max([len("Protocol")] + [len(k) for k in rows])
    block = len(_DIRECTION_COLUMNS) * _WIDTH
    lines = []
    if title:
        lines.append(title)
    lines.append(" " * label_width + " | " + "Image-to-text".center(block) + " | "
                 + "Text-to-image".center(block) + " |")
    header_cells = "".join(c.rjust(_WIDTH) for c in _DIRECTION_COLUMNS)
    lines.append("Protocol".ljust(label_width) + " | " + header_cells + " | " + header_cells + " | "
                 + "rsum".rjust(_WIDTH))
    lines.append("-" * len(lines[-1]))
    for label, m in rows.items():
        i2t = "".join(c.rjust(_WIDTH) for c in _direction_cells(m.i2t))
        t2i = "".join(c.rjust(_WIDTH) for c in _direction_cells(m.t2i))
        lines.append(label.ljust(label_width) + " | " + i2t + " | " + t2i + " | "
                     + _number(m.rsum).rjust(_WIDTH))
    return "\n".join(lines)


def metrics_from_dict(record: Mapping[str, object]) -> RetrievalMetrics:
    """A :class:`RetrievalMetrics` from ``{"i2t": {...}, "t2i": {...}[, "rsum"]}`` (the JSON shape)."""
    fields = ("r1", "r5", "r10", "medr", "meanr")

    def direction(d: Mapping[str, object]) -> DirectionMetrics:
        # records written before ties were counted have no "ties"
        return DirectionMetrics(**{k: float(d[k]) for k in fields}, ties=int(d.get("ties", 0)))  # type: ignore[arg-type]

    return RetrievalMetrics(i2t=direction(record["i2t"]), t2i=direction(record["t2i"]))  # type: ignore[arg-type]


def format_table(metrics: RetrievalMetrics | Mapping[str, object], title: str | None = None,
                 label: str = "result") -> str:
    """A one-row retrieval table of one evaluation (a :class:`RetrievalMetrics` or its dict form)."""
    m = metrics if isinstance(metrics, RetrievalMetrics) else metrics_from_dict(metrics)
    return format_retrieval_table({label: m}, title)


def format_results(results: Mapping[str, ProtocolResult],
                   chance: Mapping[str, RetrievalMetrics] | None = None, title: str | None = None) -> str:
    """The retrieval table of :func:`train.retrieval.evaluate.evaluate_protocols` results.

    ``chance`` adds, under each protocol, a row with the expected metrics of a random ranking.
    """
    rows: dict[str, RetrievalMetrics] = {}
    for protocol, result in results.items():
        rows[protocol_label(protocol, result)] = result.metrics
        if chance is not None and protocol in chance:
            rows[f"  chance ({protocol})"] = chance[protocol]
    return format_retrieval_table(rows, title)


def results_json(results: Mapping[str, ProtocolResult | RetrievalMetrics]) -> dict[str, object]:
    """``{protocol: {"i2t": {...}, "t2i": {...}, "rsum"}}`` (recalls in percent, ranks from 1)."""
    out: dict[str, object] = {}
    for protocol, r in results.items():
        metrics = r.metrics if isinstance(r, ProtocolResult) else r
        out[protocol] = metrics.to_dict()
    return out


def format_length_table(rows: Mapping[str, RetrievalMetrics], title: str | None = None) -> str:
    """The CHAIN-VSE table 4 layout: ``Image to text R@1, Mean r | Text to image R@1, Mean r``."""
    label_width = max([len("Images")] + [len(k) for k in rows])
    lines = [title] if title else []
    lines.append(" " * label_width + " | " + "Image-to-text".center(2 * _WIDTH) + " | "
                 + "Text-to-image".center(2 * _WIDTH))
    cells = "R@1".rjust(_WIDTH) + "Mean r".rjust(_WIDTH)
    lines.append("Images".ljust(label_width) + " | " + cells + " | " + cells)
    lines.append("-" * len(lines[-1]))
    for label, m in rows.items():
        lines.append(label.ljust(label_width) + " | " + _number(m.i2t.r1).rjust(_WIDTH)
                     + _number(m.i2t.meanr).rjust(_WIDTH) + " | " + _number(m.t2i.r1).rjust(_WIDTH)
                     + _number(m.t2i.meanr).rjust(_WIDTH))
    return "\n".join(lines)


def format_noise_table(ratios: list[float], metrics: list[RetrievalMetrics], title: str | None = None) -> str:
    """R@1 and R@10 both ways per noise ratio (the data of CHAIN-VSE figure 5)."""
    lines = [title] if title else []
    lines.append("noise".rjust(6) + " | " + "i2t R@1".rjust(8) + "i2t R@10".rjust(9) + " | "
                 + "t2i R@1".rjust(8) + "t2i R@10".rjust(9))
    lines.append("-" * len(lines[-1]))
    for ratio, m in zip(ratios, metrics, strict=True):
        lines.append(f"{100 * ratio:5.1f}%" + " | " + _number(m.i2t.r1).rjust(8) + _number(m.i2t.r10).rjust(9)
                     + " | " + _number(m.t2i.r1).rjust(8) + _number(m.t2i.r10).rjust(9))
    return "\n".join(lines)


def _joined(values: np.ndarray) -> str:
    # numpy scalars print the shortest text that reads back to the same float32 / float64 / int
    return " ".join(str(v) for v in values)


def write_ranks_csv(path: str | Path, results: Mapping[str, ProtocolResult],
                    caption_image: np.ndarray) -> int:
    """Write one CSV row per query of every protocol fold; returns the number of rows.

    Columns (:data:`RANKS_COLUMNS`): ``protocol``, ``fold`` (0-based, 0 unless ``5cv``), ``direction``
    (``i2t`` or ``t2i``), ``query`` (image row for i2t, caption row for t2i), ``rank`` (1-based,
    candidates tied with the ground truth counted against it), ``ties`` (how many of those tie:
    ``rank - ties`` is the optimistic rank), ``ground_truth`` (the image's caption rows for i2t,
    space-separated; the caption's image row for t2i) and, when the results hold top-K candidates,
    ``topk`` (candidate rows, best first, lower row first among equal scores) and ``topk_scores``.
    Rows and indices are those of the evaluated inputs (``caption_image`` (M,): their image of each
    caption), whatever the fold. Written atomically.
    """
    caption_image = np.asarray(caption_image, dtype=np.int64)
    with_topk = any(f.ranks.i2t_topk is not None for r in results.values() for f in r.fold_ranks)
    columns = RANKS_COLUMNS if with_topk else RANKS_COLUMNS[:-2]
    rows = 0
    with atomic_file(path, "w") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(columns)
        for protocol, result in results.items():
            for fold, fr in enumerate(result.fold_ranks):
                r, captions = fr.ranks, fr.caption_index
                images = np.arange(fr.start, fr.stop)
                local_image = caption_image[captions] - fr.start  # (k,) the fold's image of each caption
                by_image = np.argsort(local_image, kind="stable")
                bounds = np.searchsorted(local_image[by_image], np.arange(len(images) + 1))
                for q, image in enumerate(images):
                    row = [protocol, fold, "i2t", image, r.i2t[q], r.i2t_ties[q],
                           _joined(captions[by_image[bounds[q]:bounds[q + 1]]])]
                    if with_topk:
                        row += [_joined(captions[r.i2t_topk[q]]), _joined(r.i2t_topk_scores[q])]
                    writer.writerow(row)
                for q, caption in enumerate(captions):
                    row = [protocol, fold, "t2i", caption, r.t2i[q], r.t2i_ties[q], images[local_image[q]]]
                    if with_topk:
                        row += [_joined(images[r.t2i_topk[q]]), _joined(r.t2i_topk_scores[q])]
                    writer.writerow(row)
                rows += len(images) + len(captions)
    return rows
