"""Evaluation of image-text retrieval, one concept per module.

* :mod:`~train.retrieval.evaluate.metrics`: R@K, Med r, Mean r from ranks; fold averages; chance.
* :mod:`~train.retrieval.evaluate.ranking`: the blocked counting kernel (tiles -> ranks, top-K), the tie rule.
* :mod:`~train.retrieval.evaluate.order_kernel`: :class:`OrderKernel`, the evaluator's order-violation kernel
  choice and its compiled state.
* :mod:`~train.retrieval.evaluate.inputs`: embeddings, similarity matrices and the caption-image map, checked
  through one preparation path.
* :mod:`~train.retrieval.evaluate.protocols`: COCO-1k / 5cv / 5k and ``all``; :func:`evaluate_protocols`,
  :func:`evaluate_similarities`, :func:`ground_truth_ranks`.
* :mod:`~train.retrieval.evaluate.files`: the ``.npy`` inputs of ``train evaluate``.
* :mod:`~train.retrieval.evaluate.tables`: the papers' tables, the JSON and the per-query CSV.
* :mod:`~train.retrieval.evaluate.analysis`: the CHAIN-VSE noise and caption-length analyses.
* :mod:`~train.retrieval.evaluate.gallery`: the HTML page of sampled queries and their top-K.
* :mod:`~train.retrieval.evaluate.run`: ``train evaluate``.

The library API below is importable from the package; the others from their modules (they pull in
runs, plotting and the command line, which the library does not need).
"""

from train.retrieval.evaluate.inputs import (
    MEASURES,
    SIMILARITY_DTYPES,
    UNIT_NORM_TOLERANCE,
    EvaluationInputs,
    check_similarity_matrix,
    prepare_embeddings,
    prepare_similarities,
    unit_rows,
)
from train.retrieval.evaluate.metrics import (
    RECALL_KS,
    DirectionMetrics,
    Ranks,
    RetrievalMetrics,
    average_metrics,
    chance_metrics,
    direction_metrics,
    metrics_from_ranks,
)
from train.retrieval.evaluate.order_kernel import COMPILE_MIN_WORK, ORDER_KERNELS, OrderKernel, TileScorer
from train.retrieval.evaluate.protocols import (
    PROTOCOL_NAMES,
    PROTOCOLS,
    TIE_WARNING_SHARE,
    FoldRanks,
    ProtocolResult,
    evaluate_protocols,
    evaluate_similarities,
    ground_truth_ranks,
    protocol_folds,
    select_image_rows,
    select_images,
    vsepp_caption_image,
)
from train.retrieval.evaluate.ranking import (
    BlockSizes,
    Log,
    TileHook,
    TileSource,
    TileStats,
    default_block_sizes,
    rank_tiles,
)

__all__ = [
    "COMPILE_MIN_WORK", "MEASURES", "ORDER_KERNELS", "PROTOCOLS", "PROTOCOL_NAMES", "RECALL_KS",
    "SIMILARITY_DTYPES", "TIE_WARNING_SHARE", "UNIT_NORM_TOLERANCE", "BlockSizes", "DirectionMetrics",
    "EvaluationInputs", "FoldRanks", "Log", "OrderKernel", "ProtocolResult", "Ranks", "RetrievalMetrics",
    "TileHook", "TileScorer", "TileSource", "TileStats", "average_metrics", "chance_metrics",
    "check_similarity_matrix", "default_block_sizes", "direction_metrics", "evaluate_protocols",
    "evaluate_similarities", "ground_truth_ranks", "metrics_from_ranks",
    "prepare_embeddings", "prepare_similarities", "protocol_folds", "rank_tiles", "select_image_rows",
    "select_images", "unit_rows", "vsepp_caption_image",
]
