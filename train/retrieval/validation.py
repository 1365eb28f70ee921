"""How a retrieval run scores embeddings while it trains and at its end: :func:`retrieval_metrics` (the
evaluator under the run's measure) and :func:`retrieval_scorer`, the validation score the
:class:`train.engine.trainer.Trainer` is given (the rsum of ``val_protocol``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from train.engine.settings import TrainSection
from train.engine.trainer import Scorer, jsonable
from train.retrieval.evaluate import evaluate_protocols
from train.retrieval.evaluate.tables import results_json


def retrieval_metrics(images: torch.Tensor, captions: torch.Tensor, caption_image: np.ndarray | torch.Tensor,
                      settings: TrainSection, protocols: tuple[str, ...] | None = None,
                      device: torch.device | None = None) -> dict[str, Any]:
    """Evaluate embeddings with :func:`train.retrieval.evaluate.evaluate_protocols`.

    Args:
        images: (N, d) image embeddings; captions: (M, d); caption_image: (M,) image row of each.
        settings: the run's ``measure`` and ``order_sqrt``; ``protocols`` default to
            ``(settings.val_protocol,)``.

    Returns:
        ``{protocol: ProtocolResult}``; ``result.metrics.rsum`` is the sum of the six recalls.
    """
    return evaluate_protocols(images, captions, torch.as_tensor(caption_image), measure=settings.measure,
                              protocols=protocols or (settings.val_protocol,), order_sqrt=settings.order_sqrt,
                              device=device)


def retrieval_scorer(settings: TrainSection, device: torch.device | None = None) -> Scorer:
    """The trainer's validation score: ``(rsum of val_protocol, metrics JSON of the validation split)``."""
    def score(images: torch.Tensor, captions: torch.Tensor, caption_image: Any
              ) -> tuple[float, dict[str, Any]]:
        results = retrieval_metrics(images, captions, caption_image, settings, device=device)
        return float(results[settings.val_protocol].metrics.rsum), jsonable(results_json(results))

    return score
