"""The one retrieval evaluation entry, :func:`evaluate_retrieval`: what every caller outside the evaluator
calls (validation during training, :func:`train.retrieval.validation.retrieval_scorer`; the test evaluation
after it, :func:`train.retrieval.fit.evaluate_after_training`; ``train evaluate`` of a run,
:func:`train.retrieval.evaluate.run.evaluate_run`, which ``train compare`` and the pipeline runner call too;
and ``train evaluate`` of saved embeddings or of a similarity matrix).

What is ranked is an :class:`Embedded` pair of embedding matrices under a measure, or a :class:`Scored`
similarity matrix; the protocols rank it through :func:`train.retrieval.evaluate.protocols.evaluate_protocols`
or :func:`~train.retrieval.evaluate.protocols.evaluate_similarities`. With a :class:`Report`, a progress bar
runs while it ranks, then the table is printed (with chance rows when asked), the warnings under it, a
summary line, and the JSON and the ranks CSV are written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from train.retrieval.evaluate.metrics import RetrievalMetrics, chance_metrics
from train.retrieval.evaluate.protocols import (
    ProtocolResult,
    evaluate_protocols,
    evaluate_similarities,
    protocol_folds,
)
from train.retrieval.evaluate.ranking import Log, TileHook
from train.retrieval.evaluate.tables import format_results, protocol_label, results_json, write_ranks_csv
from vsecore import console
from vsecore.console import progress
from vsecore.io import write_json_atomic


@dataclass(frozen=True)
class Embedded:
    """Embeddings ranked under ``measure``: ``images`` (N, d), ``captions`` (M, d) (tensors or arrays)."""

    images: torch.Tensor | np.ndarray
    captions: torch.Tensor | np.ndarray
    measure: str
    order_sqrt: bool = False

    @property
    def n_images(self) -> int:
        """N, the images ranked."""
        return int(self.images.shape[0])

    def describe(self) -> str:
        """What was ranked, for the summary line: ``d = 1024, order sqrt``."""
        sqrt = " sqrt" if self.measure == "order" and self.order_sqrt else ""
        return f"d = {self.images.shape[1]}, {self.measure}{sqrt}"


@dataclass(frozen=True)
class Scored:
    """A precomputed similarity matrix ``sims`` (N images, M captions), larger = more similar; with
    ``transposed`` it is stored as (M, N). Read tile by tile (a memory map is never copied whole)."""

    sims: np.ndarray
    transposed: bool = False

    @property
    def n_images(self) -> int:
        """N, the images ranked."""
        return int(self.sims.shape[1] if self.transposed else self.sims.shape[0])

    def describe(self) -> str:
        """What was ranked, for the summary line."""
        return f"precomputed {self.sims.dtype} similarities{', transposed' if self.transposed else ''}"


@dataclass(frozen=True)
class Report:
    """What an evaluation shows and writes: the table's ``title`` (and ``chance`` rows), the protocol JSON
    (``json_path``) and the per-query CSV (``ranks_path``)."""

    title: str | None = None
    chance: bool = False
    json_path: Path | None = None
    ranks_path: Path | None = None


def evaluate_retrieval(source: Embedded | Scored, caption_image: np.ndarray | torch.Tensor,
                       protocols: Sequence[str], fold_size: int = 1000,
                       device: str | torch.device | None = None, *, block_images: int | None = None,
                       block_captions: int | None = None, topk: int = 0, report: Report | None = None,
                       log: Log | None = None) -> dict[str, ProtocolResult]:
    """Evaluate ``source`` under each of ``protocols`` (checked against its size before any work).

    Args:
        source: :class:`Embedded` (images (N, d), captions (M, d), measure) or :class:`Scored` ((N, M)).
        caption_image: (M,) the image row of each caption.
        protocols, fold_size, device, block_images, block_captions, topk: as in
            :func:`train.retrieval.evaluate.protocols.evaluate_protocols`.
        report: None ranks silently (validation; the warnings still go to ``log``); a :class:`Report` shows
            a progress bar and prints the table, the warnings and a summary line to ``log``, and writes the
            outputs it names.
        log: where the messages go (default: warnings to stderr, the report to stdout).

    Returns:
        ``{protocol: ProtocolResult}``.
    """
    def evaluate(on_tile: TileHook | None, log: Log | None) -> dict[str, ProtocolResult]:
        if isinstance(source, Scored):
            return evaluate_similarities(source.sims, caption_image, protocols, fold_size, device,
                                         block_images, block_captions, on_tile, topk, source.transposed, log)
        return evaluate_protocols(source.images, source.captions, caption_image, source.measure, protocols,
                                  source.order_sqrt, fold_size, device, block_images, block_captions,
                                  on_tile=on_tile, topk=topk, log=log)

    if report is None:
        return evaluate(None, log)
    have = "the similarity matrix has" if isinstance(source, Scored) else "the embeddings have"
    return _reported(evaluate, source, torch.as_tensor(caption_image), protocols, fold_size, report,
                     log or console.result, have)


def _reported(evaluate: Callable[[TileHook, Log], dict[str, ProtocolResult]], source: Embedded | Scored,
              caption_image: torch.Tensor, protocols: Sequence[str], fold_size: int, report: Report, log: Log,
              have: str) -> dict[str, ProtocolResult]:
    """``evaluate(on_tile, log)`` under a progress bar; then the table, the JSON and the ranks CSV."""
    t0 = time.perf_counter()
    n_images = source.n_images
    bar = progress(total=_pairs_total(n_images, caption_image, protocols, fold_size, have), unit="pair",
                   unit_scale=True, desc="ranking")
    warnings: list[str] = []

    def log_now_warn_later(line: str) -> None:
        # warnings qualify the numbers: print them under the table; notes (compiling) right away
        (warnings.append if line.startswith("warning:") else log)(line)

    try:
        results = evaluate(bar.update, log_now_warn_later)
    finally:
        bar.close()
    log(format_results(results, _chance_rows(n_images, caption_image, protocols, fold_size)
                       if report.chance else None, report.title))
    for line in warnings:
        log(line)
    summary = (f"evaluated {n_images} images x {caption_image.numel()} captions ({source.describe()}) under "
               f"{', '.join(protocol_label(p) for p in protocols)} in {time.perf_counter() - t0:.1f}s")
    if report.json_path is not None:
        write_json_atomic(report.json_path, results_json(results))
        summary += f"; wrote {report.json_path}"
    if report.ranks_path is not None:
        rows = write_ranks_csv(report.ranks_path, results, caption_image.numpy())
        summary += f"; wrote {rows} query rows to {report.ranks_path}"
    log(summary)
    return results


def _pairs_total(n_images: int, caption_image: torch.Tensor, protocols: Sequence[str], fold_size: int,
                 have: str) -> int:
    """The (image, caption) pairs the protocols rank: the progress bar's total."""
    total = 0
    for protocol in protocols:
        for start, stop in protocol_folds(protocol, n_images, fold_size, have):
            total += (stop - start) * int(((caption_image >= start) & (caption_image < stop)).sum())
    return total


def _chance_rows(n_images: int, caption_image: torch.Tensor, protocols: Sequence[str], fold_size: int
                 ) -> dict[str, RetrievalMetrics]:
    """The expected metrics of a random ranking on each protocol's first fold."""
    rows = {}
    for protocol in protocols:
        start, stop = protocol_folds(protocol, n_images, fold_size)[0]
        f_ci = caption_image[(caption_image >= start) & (caption_image < stop)] - start
        rows[protocol] = chance_metrics(f_ci.numpy(), stop - start)
    return rows
