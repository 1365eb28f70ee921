"""What a trained run does, as Python functions: :func:`load_run` (:func:`train.retrieval.open.load_run`),
:func:`evaluate` (:func:`train.retrieval.evaluate.run.evaluate_run`, what ``train evaluate --run`` calls) and
:func:`query` (:func:`train.retrieval.query.search`, what ``train query`` calls). The library loads (with
torch) when a function runs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vse._common import verbosity

if TYPE_CHECKING:  # only annotations: the library (and torch) loads when a function runs
    from train.retrieval.evaluate.protocols import ProtocolResult
    from train.retrieval.loaded import LoadedRun
    from train.retrieval.query import Hit

PathArg = str | os.PathLike


def load_run(run: PathArg, checkpoint: str = "best", device: str = "auto", *,
             accept_changed: bool = False) -> LoadedRun:
    """The model of a run directory (or of a model folder of ``train export-model``), ready to embed.

    Args:
        run: the run directory.
        checkpoint: ``best`` or ``last``.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N``.
        accept_changed: use the run even when its dataset or features changed since it was trained (a
            warning instead of a :class:`vsecore.errors.UserError`; ``--accept-changed``).

    Returns:
        A :class:`train.retrieval.loaded.LoadedRun`: ``settings``, ``config``, ``model``, ``epoch``,
        ``encode_text(texts) -> (M, d)``, ``encode_images(paths) -> (N, d)``; ``embed_split`` of
        :mod:`train.retrieval.loaded` gives a split's embeddings.
    """
    from train.retrieval.open import load_run as open_run  # start-up: the library (torch) when it runs

    loaded = open_run(Path(run), checkpoint, device)
    loaded.accept_changed = accept_changed
    return loaded


def evaluate(run: PathArg, split: str = "test", protocols: str | Sequence[str] = ("all",), *,
             checkpoint: str = "best", device: str = "auto", lang: str | None = None,
             noise: str | None = None, length_analysis: bool = False, fold_size: int = 1000,
             chance: bool = False, json_path: PathArg | None = None, out: PathArg | None = None,
             ranks: PathArg | None = None, topk: int | None = None, gallery: PathArg | None = None,
             overwrite: bool = False, accept_changed: bool = False, quiet: bool | None = None
             ) -> dict[str, ProtocolResult]:
    """R@1/5/10, median and mean rank of a run on ``split``, as ``train evaluate --run RUN``: the table is
    printed and written to ``RUN/eval/<split>_<checkpoint>.json`` (or ``json_path``).

    Args:
        run: the run directory.
        split: ``train``, ``val`` or ``test``.
        protocols: ``all``, ``1k``, ``5cv``, ``5k`` (a list, or a comma list as ``--protocol`` takes).
        checkpoint, device, accept_changed: as for :func:`load_run`.
        lang: the captions of this language (a multilingual run).
        noise: ``START:STOP:STEP`` ratios of replaced characters (the CHAIN-VSE noise analysis).
        length_analysis: the CHAIN-VSE text-length analysis; ``fold_size``: images per COCO fold;
            ``chance``: add the metrics of a random ranking.
        out: folder of the outputs (default ``RUN/eval``); ``ranks``: a per-query CSV, with ``topk`` each
            query's best candidates; ``gallery``: an HTML page of sampled queries; ``overwrite``: replace
            existing output files.
        quiet: as for :func:`vse.prep`.

    Returns:
        ``{protocol: ProtocolResult}``: ``result.metrics.i2t.r1`` ... ``result.metrics.rsum``,
        ``result.metrics.to_dict()`` (the JSON written), each fold's metrics in ``result.folds``.
    """
    from train.retrieval.evaluate.run import check_topk, evaluate_run, parse_protocols  # start-up: (as above)

    paths = {name: None if p is None else Path(p) for name, p in
             (("json", json_path), ("out", out), ("ranks", ranks), ("gallery", gallery))}
    names = parse_protocols([protocols] if isinstance(protocols, str) else protocols)
    with verbosity(quiet):
        return evaluate_run(
            Path(run), split, names, noise=noise, length_analysis=length_analysis, checkpoint=checkpoint,
            device=device, json_path=paths["json"], out_dir=paths["out"], chance=chance, fold_size=fold_size,
            ranks_path=paths["ranks"], topk=check_topk(topk, paths["ranks"], gallery is not None),
            gallery_path=paths["gallery"], lang=lang, overwrite=overwrite, accept_changed=accept_changed)


def query(run: PathArg | LoadedRun, text: str | Sequence[str] | None = None,
          image: PathArg | Sequence[PathArg] | None = None, top: int = 5, *, split: str | None = None,
          data: PathArg | None = None, features: str | None = None, checkpoint: str = "best",
          device: str = "auto", accept_changed: bool = False, quiet: bool | None = None) -> list[list[Hit]]:
    """The ``top`` images for each text, or the ``top`` captions for each image, as ``train query``.

    Args:
        run: a run directory, or a run already loaded (:func:`load_run`: loaded once, queried often).
        text: one query text or a list (text -> image); ``image``: one image file or a list (image ->
            text, featurized as the run's store was). Give one of them.
        top: hits per query.
        split: the candidates: ``train``, ``val``, ``test`` or ``all``; default the test split of the
            run's dataset, or every image of ``data``.
        data, features: search this prepared dataset and its feature store (``STORE.zarr[:KEY]``)
            instead of the run's.
        checkpoint, device, accept_changed: as for :func:`load_run` (when ``run`` is a path).
        quiet: as for :func:`vse.prep`.

    Returns:
        One list per query of :class:`train.retrieval.query.Hit` (``rank``, ``score``, ``imgid``, ``path``,
        ``text`` of a caption hit, ``captions`` of an image hit), best first; ``vse.format_hits(query,
        hits)`` is the command's table of them.
    """
    from train.retrieval.query import search  # start-up: (as above)

    if split is None:  # the command's default: the run's test split, or every image of another collection
        split = "all" if data is not None else "test"
    with verbosity(quiet):
        loaded = run if not isinstance(run, str | os.PathLike) else load_run(
            run, checkpoint, device, accept_changed=accept_changed)
        return search(loaded, text=text, image=image, top=top, split=None if split == "all" else split,
                      data=data, features=features)


def format_hits(query: str, hits: Sequence[Hit]) -> str:
    """The table ``train query`` prints of one query's hits (:func:`train.retrieval.query.format_hits`)."""
    from train.retrieval.query import format_hits as table  # start-up: (as above)

    return table(query, hits)
