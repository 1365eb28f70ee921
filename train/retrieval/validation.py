"""How a retrieval run scores its validation embeddings while it trains: :func:`retrieval_scorer`, the
validation score the :class:`train.engine.trainer.Trainer` is given (the rsum of ``val_protocol``), ranked
by the one evaluation entry (:func:`train.retrieval.evaluate.entry.evaluate_retrieval`) under the run's
measure."""

from __future__ import annotations

from typing import Any

import torch

from train.engine.settings import TrainSection
from train.engine.trainer import Scorer, jsonable
from train.retrieval.evaluate.entry import Embedded, evaluate_retrieval
from train.retrieval.evaluate.protocols import ties_once
from train.retrieval.evaluate.tables import results_json
from vsecore import console


def retrieval_scorer(settings: TrainSection, device: torch.device | None = None) -> Scorer:
    """The trainer's validation score: ``(rsum of val_protocol, metrics JSON of the validation split)`` of
    images (N, d), captions (M, d) and caption_image (M,) (the image row of each caption). The tie warning
    is said at the first validation only (issue 43.6)."""
    log = ties_once(console.warning)

    def score(images: torch.Tensor, captions: torch.Tensor, caption_image: Any
              ) -> tuple[float, dict[str, Any]]:
        results = evaluate_retrieval(Embedded(images, captions, settings.measure, settings.order_sqrt),
                                     torch.as_tensor(caption_image), (settings.val_protocol,), device=device,
                                     log=log)
        return float(results[settings.val_protocol].metrics.rsum), jsonable(results_json(results))

    return score
