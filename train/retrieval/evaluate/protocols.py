"""The COCO / Flickr evaluation protocols over the ranking kernel: folds, metrics, warnings.

``1k``: images 0..999 and their captions; ``5cv``: each metric averaged over the five 1k folds (Med r
and Mean r too, as the papers); ``5k``: images 0..4999; ``all``: every given image. Fewer images than
a protocol needs is an error raised before any work. :func:`evaluate_protocols` (embeddings) and
:func:`evaluate_similarities` (a precomputed matrix) prepare their inputs through
:mod:`train.retrieval.evaluate.inputs`, rank every fold with
:func:`train.retrieval.evaluate.ranking.rank_tiles` and log
at most one line per kind of warning per call (tied ground truths, NaN scores, constant embeddings).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import torch

from train.retrieval.evaluate.inputs import EvaluationInputs, prepare_embeddings, prepare_similarities
from train.retrieval.evaluate.layout import RankingLayout
from train.retrieval.evaluate.metrics import Ranks, RetrievalMetrics, average_metrics, metrics_from_ranks
from train.retrieval.evaluate.order_kernel import OrderKernel, TileScorer
from train.retrieval.evaluate.ranking import (
    Log,
    TileHook,
    TileStats,
    embedding_ranks,
    matrix_tiles,
    rank_tiles,
)
from vsecore import console
from vsecore.errors import UserError

T = TypeVar("T")

PROTOCOLS = ("1k", "5cv", "5k", "all")
#: how messages name the protocols (``train.retrieval.evaluate.tables`` labels table rows the same way)
PROTOCOL_NAMES = {"1k": "COCO-1k", "5cv": "COCO-5cv", "5k": "COCO-5k", "all": "all"}
#: a direction warns when more than this share of its queries have a tied ground-truth score
TIE_WARNING_SHARE = 0.01
#: how the tie warning begins (:func:`ties_once` recognises it)
TIE_WARNING = "warning: the ground-truth score is tied by another candidate in "

#: a protocol's folds: ``[(protocol, [(image_start, image_stop), ...]), ...]``
Plan = list[tuple[str, list[tuple[int, int]]]]


@dataclass(frozen=True)
class FoldRanks:
    """The ranks of one fold: images ``start:stop`` and the captions ``caption_index`` (k,) of the input."""

    start: int
    stop: int
    caption_index: np.ndarray
    ranks: Ranks


@dataclass(frozen=True)
class ProtocolResult:
    """Metrics of one protocol (fold-averaged for ``5cv``), each fold's own metrics, and the ranks."""

    protocol: str
    metrics: RetrievalMetrics
    folds: list[RetrievalMetrics] = field(default_factory=list)
    n_images: int = 0
    n_captions: int = 0
    fold_ranks: list[FoldRanks] = field(default_factory=list)


def protocol_folds(protocol: str, n_images: int, fold_size: int = 1000,
                   have: str = "the embeddings have") -> list[tuple[int, int]]:
    """Image row ranges ``[(start, stop), ...]`` a protocol evaluates.

    ``1k``: the first fold; ``5cv``: the five folds of ``fold_size`` images; ``5k``: the first
    ``5 * fold_size`` images as one set; ``all``: every image. ``have`` words the error when there
    are too few images (e.g. ``"the test split has"``).
    """
    if protocol == "all":
        return [(0, n_images)]
    need = {"1k": fold_size, "5cv": 5 * fold_size, "5k": 5 * fold_size}.get(protocol)
    if need is None:
        raise UserError(f"unknown protocol {protocol!r} (expected one of {', '.join(PROTOCOLS)})")
    if fold_size < 1:
        raise UserError(f"--fold-size must be at least 1, got {fold_size}")
    if n_images < need:
        raise UserError(f"protocol {protocol} needs at least {need} images, {have} "
                        f"{n_images} (use --protocol all for a smaller test set)")
    if protocol == "5cv":
        return [(k * fold_size, (k + 1) * fold_size) for k in range(5)]
    return [(0, need)]


def _fold_captions(caption_image: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Indices (k,) of the captions of images ``start:stop``, in input order."""
    if caption_image.numel() > 1 and bool((caption_image[1:] >= caption_image[:-1]).all()):
        edges = torch.tensor([start, stop], device=caption_image.device)
        a, b = torch.searchsorted(caption_image, edges).tolist()
        return torch.arange(a, b, device=caption_image.device)
    return torch.nonzero((caption_image >= start) & (caption_image < stop))[:, 0]


def select_images(images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor,
                  start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images ``start:stop`` with their captions (views when the captions are grouped by image).

    Returns (images (n, d), captions (k, d), caption_image (k,)), ``caption_image`` renumbered
    to start at 0.
    """
    if start == 0 and stop == images.shape[0]:
        return images, captions, caption_image
    index = _fold_captions(caption_image, start, stop)
    if index.numel() and int(index[-1]) - int(index[0]) + 1 == index.numel():
        a, b = int(index[0]), int(index[-1]) + 1
        return images[start:stop], captions[a:b], caption_image[a:b] - start
    return images[start:stop], captions[index.to(captions.device)], caption_image[index] - start


def _plan(protocols: Sequence[str], n_images: int, fold_size: int,
          have: str = "the embeddings have") -> Plan:
    """Every protocol's folds, checked before any work starts."""
    return [(p, protocol_folds(p, n_images, fold_size, have)) for p in protocols]


def _fold_work(plan: Plan, caption_image: torch.Tensor) -> int:
    """Sum over the folds of images x captions (the number of scored pairs)."""
    total = 0
    for _, folds in plan:
        for start, stop in folds:
            total += (stop - start) * int(((caption_image >= start) & (caption_image < stop)).sum())
    return total


def _evaluate_plan(plan: Plan, caption_image: torch.Tensor,
                   rank_fold: Callable[[int, int, torch.Tensor], Ranks]) -> dict[str, ProtocolResult]:
    """Rank every fold of every protocol with ``rank_fold(start, stop, caption_index)``."""
    results: dict[str, ProtocolResult] = {}
    for protocol, folds in plan:
        fold_ranks = []
        for start, stop in folds:
            index = _fold_captions(caption_image, start, stop)
            fold_ranks.append(FoldRanks(start, stop, index.cpu().numpy(), rank_fold(start, stop, index)))
        fold_metrics = [metrics_from_ranks(f.ranks) for f in fold_ranks]
        metrics = fold_metrics[0] if len(fold_metrics) == 1 else average_metrics(fold_metrics)
        results[protocol] = ProtocolResult(
            protocol, metrics, fold_metrics if len(fold_metrics) > 1 else [],
            n_images=sum(b - a for a, b in folds), n_captions=sum(f.caption_index.size for f in fold_ranks),
            fold_ranks=fold_ranks)
    return results


def _problems(ranks_by_protocol: dict[str, list[Ranks]]) -> list[str]:
    """At most two warning lines for one evaluation: tied ground truths, NaN scores."""
    lines = []
    tied = []
    for protocol, fold_ranks in ranks_by_protocol.items():
        for direction in ("i2t", "t2i"):
            queries = sum(getattr(r, direction).size for r in fold_ranks)
            ties = sum(int(np.count_nonzero(getattr(r, f"{direction}_ties"))) for r in fold_ranks)
            if queries and ties > TIE_WARNING_SHARE * queries:
                where = f", {PROTOCOL_NAMES.get(protocol, protocol)}" if protocol else ""
                tied.append(f"{direction} {ties} of {queries} queries ({100.0 * ties / queries:.1f}%{where})")
    if tied:
        lines.append(f"{TIE_WARNING}{', '.join(tied)}; "
                     "tied candidates count against the ground truth, so these ranks are pessimistic "
                     "(duplicate or collapsed embeddings?)")
    nan = max((sum(r.nan_scores for r in fold_ranks) for fold_ranks in ranks_by_protocol.values()), default=0)
    if nan:
        lines.append(f"warning: {nan} similarity scores are NaN (e.g. inf - inf in an overflowing product); "
                     "each counts as a tie against the ground truth")
    return lines


def ties_once(log: Log) -> Log:
    """``log`` passing the tie warning only the first time: a run that validates every epoch says once that
    its ground truths are tied (its embeddings barely change from one epoch to the next; every epoch's
    count is in its metrics), and every other line each time."""
    said = False

    def once(line: str) -> None:
        nonlocal said
        if line.startswith(TIE_WARNING):
            if said:
                return
            said = True
        log(line)

    return once


def _report(results: dict[str, ProtocolResult], notes: list[str], log: Log) -> None:
    for line in notes + _problems({p: [f.ranks for f in r.fold_ranks] for p, r in results.items()}):
        log(line)


def _rank_fold(inputs: EvaluationInputs, scorer: TileScorer | None, topk: int, on_tile: TileHook | None,
               start: int, stop: int, index: torch.Tensor) -> Ranks:
    """Ranks of the fold of images ``start:stop`` and their captions ``index`` (k,), from either source."""
    if inputs.sims is None:
        f_img, f_cap, f_ci = select_images(inputs.images, inputs.captions, inputs.caption_image, start, stop)
        # no NaN score: the order violation sums non-negative terms (at worst +inf, never inf - inf) and
        # a cosine of unit rows is at most 1 in magnitude
        return embedding_ranks(f_img, f_cap, f_ci, scorer, inputs.blocks, inputs.device, topk, None, on_tile,
                               nan_possible=False)
    c0 = int(index[0]) if index.numel() else 0  # a matrix's captions are grouped: a fold is a slice
    tiles = matrix_tiles(inputs.sims, inputs.transposed, inputs.device, start, c0)
    layout = RankingLayout.grouped(inputs.caption_image[c0:c0 + index.numel()] - start, stop - start,
                                   inputs.device)
    return rank_tiles(tiles, layout, inputs.blocks, inputs.device, topk, on_tile=on_tile)


def _on_one_kernel(kernel: OrderKernel, scorer: TileScorer, log: Log, rank: Callable[[TileScorer], T]) -> T:
    """``rank(scorer)``, again on the blocked kernel if the compiled one failed part-way through.

    A ground-truth score and the candidates counted against it must come from one kernel: the compiled
    and the blocked kernels round differently, and inductor may fail on a shape it compiles late (seen
    with ``ATEN_CPU_CAPABILITY=default``), after some tiles were scored. Rare, so it simply ranks again.
    """
    result = rank(scorer)
    if isinstance(scorer, TileScorer) and scorer.kernel == "compiled" and kernel.backend != "compiled":
        log("the compiled order-violation kernel failed during the ranking: ranking again with the blocked "
            "kernel, so that every score comes from one kernel")
        result = rank(TileScorer(scorer.measure, scorer.order_sqrt, "blocked"))
    return result


def _evaluate(inputs: EvaluationInputs, plan: Plan, scorer: TileScorer | None, topk: int,
              on_tile: TileHook | None, log: Log) -> dict[str, ProtocolResult]:
    """Every fold of ``plan`` ranked, the metrics, and the warnings logged once."""
    def rank_fold(start: int, stop: int, index: torch.Tensor) -> Ranks:
        return _rank_fold(inputs, scorer, topk, on_tile, start, stop, index)

    results = _evaluate_plan(plan, inputs.caption_image, rank_fold)
    _report(results, list(inputs.notes), log)
    return results


def evaluate_protocols(images: np.ndarray | torch.Tensor, captions: np.ndarray | torch.Tensor,
                       caption_image: np.ndarray | torch.Tensor, measure: str,
                       protocols: Sequence[str] = ("all",), order_sqrt: bool = False,
                       fold_size: int = 1000, device: str | torch.device | None = None,
                       block_images: int | None = None, block_captions: int | None = None,
                       on_tile: TileHook | None = None, topk: int = 0, order_kernel: str = "auto",
                       log: Log | None = None, kernel: OrderKernel | None = None
                       ) -> dict[str, ProtocolResult]:
    """Evaluate embeddings under each protocol.

    Args:
        images: (N, d); captions: (M, d); caption_image: (M,) image row of each caption.
        measure, order_sqrt: the similarity (see :func:`ground_truth_ranks`).
        protocols: names from :data:`PROTOCOLS`, evaluated in the given order (all checked first).
        fold_size: images per fold (1000 for COCO; smaller in tests).
        device, block_images, block_captions, on_tile, topk, order_kernel, kernel: as in
            :func:`ground_truth_ranks` (``on_tile`` gets each tile's number of pairs).
        log: where the warnings go, once per call (default: stderr).

    Returns:
        ``{protocol: ProtocolResult}``.
    """
    log = log or console.warning
    plan: Plan = []
    inputs = prepare_embeddings(
        images, captions, caption_image, measure, device, block_images, block_captions,
        check_size=lambda n: plan.extend(_plan(protocols, n, fold_size)))
    work = _fold_work(plan, inputs.caption_image) * inputs.dim
    kernel = kernel or OrderKernel.shared()
    scorer = kernel.choose(measure, order_sqrt, inputs.device, inputs.dim, work, order_kernel, log)
    return _on_one_kernel(kernel, scorer, log,
                          lambda tile_scorer: _evaluate(inputs, plan, tile_scorer, topk, on_tile, log))


def evaluate_similarities(sims: np.ndarray, caption_image: np.ndarray | torch.Tensor,
                          protocols: Sequence[str] = ("all",), fold_size: int = 1000,
                          device: str | torch.device | None = None, block_images: int | None = None,
                          block_captions: int | None = None, on_tile: TileHook | None = None,
                          topk: int = 0, transposed: bool = False, log: Log | None = None
                          ) -> dict[str, ProtocolResult]:
    """Evaluate a precomputed similarity matrix (another codebase's) under each protocol.

    Args:
        sims: (N images, M captions) float16/32/64 array, larger = more similar, e.g. an
            ``np.load(..., mmap_mode="r")`` memory map: it is read tile by tile, never copied
            whole; with ``transposed``, (M, N).
        caption_image: (M,) image row of each caption, grouped by image (the VSE++/SCAN layout).
        protocols, fold_size, device, block_images, block_captions, on_tile, topk, log: as in
            :func:`evaluate_protocols`; a fold is a row and column slice of the matrix.

    Returns:
        ``{protocol: ProtocolResult}``.
    """
    log = log or console.warning
    plan: Plan = []
    inputs = prepare_similarities(
        sims, caption_image, transposed, device, block_images, block_captions,
        check_size=lambda n: plan.extend(_plan(protocols, n, fold_size, have="the similarity matrix has")))
    return _evaluate(inputs, plan, None, topk, on_tile, log)


@torch.no_grad()
def ground_truth_ranks(images: np.ndarray | torch.Tensor, captions: np.ndarray | torch.Tensor,
                       caption_image: np.ndarray | torch.Tensor, measure: str, order_sqrt: bool = False,
                       device: str | torch.device | None = None, block_images: int | None = None,
                       block_captions: int | None = None, stats: TileStats | None = None,
                       on_tile: TileHook | None = None, topk: int = 0, order_kernel: str = "auto",
                       log: Log | None = None, kernel: OrderKernel | None = None) -> Ranks:
    """1-based ground-truth ranks (pessimistic, see :mod:`train.retrieval.evaluate.ranking`) of every query
    of one set.

    Args:
        images: (N, d) image embeddings.
        captions: (M, d) caption embeddings.
        caption_image: (M,) int, the image row of each caption (any number of captions per image,
            at least one each, in any order).
        measure: ``"order"`` or ``"cosine"``; ``order_sqrt`` takes the square root of the
            violation (rankings are unchanged in exact arithmetic).
        device: where to compute (default: CUDA when available).
        block_images, block_captions: largest tile (default :func:`default_block_sizes`).
        stats: filled with the number and largest shape of the tiles built.
        on_tile: called with the number of (image, caption) pairs of every tile counted.
        topk: K > 0 also returns each query's K best candidates.
        order_kernel: ``auto`` or the order-violation kernel of every tile (see :data:`ORDER_KERNELS`).
        log: where the warnings go (constant embeddings, ties, NaN scores; default: stderr).
        kernel: the evaluator's :class:`OrderKernel` (its compiled state; default
            :meth:`OrderKernel.shared`).

    Returns:
        :class:`Ranks` with ``i2t`` (N,) and ``t2i`` (M,) int64 ranks counted from 1.
    """
    log = log or console.warning
    inputs = prepare_embeddings(images, captions, caption_image, measure, device, block_images,
                                block_captions)
    if stats is not None:
        stats.block_images, stats.block_captions = inputs.blocks.images, inputs.blocks.captions
    n, m, d = inputs.n_images, inputs.caption_image.numel(), inputs.dim
    kernel = kernel or OrderKernel.shared()
    scorer = kernel.choose(measure, order_sqrt, inputs.device, d, n * m * d, order_kernel, log)
    ranks = _on_one_kernel(kernel, scorer, log, lambda tile_scorer: embedding_ranks(
        inputs.images, inputs.captions, inputs.caption_image, tile_scorer, inputs.blocks, inputs.device, topk,
        stats, on_tile, nan_possible=False))
    for line in list(inputs.notes) + _problems({"": [ranks]}):
        log(line)
    return ranks


def vsepp_caption_image(n_images: int, captions_per_image: int = 5) -> np.ndarray:
    """The VSE++ layout: captions ``5i .. 5i+4`` belong to image ``i``; returns (N * k,) int64."""
    return np.repeat(np.arange(n_images, dtype=np.int64), captions_per_image)


def select_image_rows(images: torch.Tensor, captions: torch.Tensor, caption_image: torch.Tensor,
                      rows: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images at ``rows`` (any order, distinct) with their captions, renumbered to ``0..len(rows)-1``.

    Returns (images (R, d), captions (k, d), caption_image (k,)); captions keep their relative order.
    """
    rows_t = torch.as_tensor(np.asarray(rows) if not isinstance(rows, torch.Tensor) else rows,
                             dtype=torch.int64)
    new_index = torch.full((images.shape[0],), -1, dtype=torch.int64)
    new_index[rows_t] = torch.arange(rows_t.numel())
    mapped = new_index[caption_image.cpu()]
    keep = mapped >= 0
    return images[rows_t.to(images.device)], captions[keep.to(captions.device)], mapped[keep]
