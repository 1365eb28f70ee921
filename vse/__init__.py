"""The toolkit's Python API: each stage and each use of a run as one function, for notebooks and scripts.

::

    import vse
    data = vse.prep("synthetic", "work/data", num_images=48)
    store = vse.extract("cnn", data, "work/feats.zarr", cnn="efficientnet_lite0", crops=1)
    run = vse.train("chain", data, f"{store}:global", "runs/chain", epochs=2, on_epoch=print)
    results = vse.evaluate(run)
    hits = vse.query(run, text="a red circle", top=3)

Every function builds the settings its command builds (the same pydantic classes, the same merging of a
``pipeline=``'s section under the arguments given) and calls the library function its command calls, so a
notebook, a pipeline and the command line run the same code: ``prep`` -> :func:`prep.run.run_prep`,
``extract`` -> :func:`features.run.run_features`, ``train`` -> :func:`train.retrieval.fit.run_training`,
``evaluate`` -> :func:`train.retrieval.evaluate.run.evaluate_run`, ``load_run`` ->
:func:`train.retrieval.open.load_run`, ``query`` -> :func:`train.retrieval.query.search`. Bad input is a
:class:`vsecore.errors.UserError` whose message is the command's one line; messages go through
:mod:`vsecore.console` (``quiet=True``: results and warnings only). A walk-through: ``docs/api.md``.
"""

from __future__ import annotations

from vse.runs import evaluate, format_hits, load_run, query
from vse.stages import extract, prep, train
from vsecore.errors import UserError

__all__ = ["UserError", "evaluate", "extract", "format_hits", "load_run", "prep", "query", "train"]
