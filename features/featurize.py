"""Features of new images, computed exactly as a finished store computed its rows: the one featurizer of
queries.

A trained run knows its feature store; to embed an image that is not in the store (a query, a user's
photo), the same network, weights, crops and sizes must run again, and for the Full-Network Embedding the
store's own train-split statistics and thresholds must discretise the result. :class:`Featurizer` rebuilds
that extractor from the store's recorded configuration (with :func:`features.extractors.recipe.mapper_config`,
as extraction does), loads images as extraction loads them (with the same bound on an image's work), and
checks that the weights it loads are the ones the store was made with (their SHA-256). A run reads the
configuration and the FNE code from its store (:meth:`Featurizer.from_store`), a model folder from its own
files (``train.retrieval.model_folder``): the same featurizer either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from features.executors.block import MAPPER_FAILURES, load_resize
from features.extractors.images import ImageError, load_image
from features.extractors.recipe import ImageMapperFactory
from features.extractors.registry import extractors, extractors_of_kind, get_extractor_of_config
from features.store.core import FeatureStore
from features.store.spec import SPEC_ARRAYS, FeatureSpec
from features.store.ternary import ternarize
from vsecore.errors import UserError

#: the ternary code of a Full-Network Embedding: ``(mean (F,), std (F,), (low, high))``
FneCode = tuple[np.ndarray, np.ndarray, tuple[float, float]]


class Featurizer:
    """``featurizer(paths) -> (rows (B, *shape) float32, failures)`` like the rows of a store.

    Args:
        config: the store's recorded ``config`` (its ``kind`` names the extractor that made it).
        key: the ``STORE:key`` the rows are read by (``global``, ``fne`` ternary, ``fne_raw``, ...).
        shape: the shape of one row (that of an empty result).
        device: where the network runs (``cpu``, ``cuda``, ``auto``).
        code: for ``key`` ``fne``, the ternary code that discretises a row (the store's own statistics and
            thresholds).
        source: what messages name (the store, or a model folder's record of it).

    Raises a :class:`UserError` for rows that cannot be recomputed (imported features, an extractor whose
    rows are not one vector per image), a configuration out of bounds, or weights that are no longer the
    same file.
    """

    def __init__(self, config: Mapping[str, Any], key: str, shape: Sequence[int], device: str = "cpu",
                 code: FneCode | None = None, source: str = "the store") -> None:
        kind = config.get("kind")
        queryable = [e.kind for e in extractors() if e.queryable]
        use = f"extract the store with `features {'|'.join(dict.fromkeys(queryable))}` to query with images"
        if not any(e.queryable for e in extractors_of_kind(str(kind))):
            origin = "imported" if kind == "import" else f"made by {kind}"
            raise UserError(f"{source}: its rows were {origin}, so new images cannot be featurized the same "
                            f"way ({use})")
        if key not in get_extractor_of_config(config).keys:
            raise UserError(f"{source}: has no '{key}' features")
        self.key, self.shape, self.code = key, tuple(shape), code
        #: the store read (set by :meth:`from_store`)
        self.store: FeatureStore | None = None
        # the mapper the store was made with, built from its recorded config as extraction builds it
        self.recipe = ImageMapperFactory.from_store(config, device=device)
        try:
            self.mapper = self.recipe.build()
        except UserError as exc:  # a record out of the extractor's own bounds, said of where it was read
            raise UserError(f"{source}: {exc}") from None
        recorded, loaded = config.get("weights_sha256"), self.mapper.provenance.get("weights_sha256")
        if recorded != loaded:
            raise UserError(f"{source}: made with network weights {str(recorded)[:12]}..., the weights found "
                            f"here are {str(loaded)[:12]}...: new images would not be comparable")
        if key == "fne" and code is None:
            raise ValueError("a Full-Network Embedding featurizer needs the store's ternary code")

    @classmethod
    def from_store(cls, spec: str, device: str = "cpu") -> Featurizer:
        """The featurizer of the finished store ``STORE[:key]`` (the run's ``--features``): its recorded
        configuration, and for the ternary FNE its own statistics and thresholds."""
        parsed = FeatureSpec.parse(spec)
        store = FeatureStore(parsed.store)
        store.require_complete()
        config = store.attrs.get("config", {})
        key = parsed.key_in(store.has)
        code = None
        if key == "fne":
            # the ternary array carries the thresholds it was made with (see FeatureStore.replace_ternary)
            thresholds = store.array("fne/ternary").attrs.get("thresholds") or config.get("thresholds")
            code = (np.asarray(store.array("fne/mean")[:]), np.asarray(store.array("fne/std")[:]),
                    (float(thresholds[0]), float(thresholds[1])))
        shape = store.array(SPEC_ARRAYS[key]).shape[1:] if store.has(SPEC_ARRAYS[key]) else ()
        featurizer = cls(config, key, shape, device, code, str(parsed.store))
        featurizer.store = store
        return featurizer

    @property
    def mean(self) -> np.ndarray:
        """The FNE's per-feature train mean (F,) (``key`` ``fne``)."""
        assert self.code is not None
        return self.code[0]

    @property
    def std(self) -> np.ndarray:
        """The FNE's per-feature train standard deviation (F,) (``key`` ``fne``)."""
        assert self.code is not None
        return self.code[1]

    def __call__(self, paths: Sequence[str | Path]) -> tuple[np.ndarray, list[dict[str, str]]]:
        """Rows of the images at ``paths`` (unusable images are left out and listed as failures), read as the
        extraction's decode threads read them (the mapper's own ``load``, e.g. with its JPEG decoder)."""
        load = getattr(self.mapper, "load", None) or load_image
        images, names, failures = [], [], []
        for p in paths:
            try:
                images.append(load(str(p), resize=load_resize(self.mapper)))
                names.append(str(p))
            except ImageError as exc:
                failures.append({"path": str(p), "reason": str(getattr(exc, "reason", None) or exc)})
        if not images:
            return np.zeros((0, *self.shape), np.float32), failures
        mapped = dict(self.mapper(images))
        unusable = mapped.pop(MAPPER_FAILURES, None) or []
        failures += [{"path": names[k], "reason": reason} for k, reason in unusable]
        (raw,) = mapped.values()
        raw = np.delete(raw, [k for k, _ in unusable], axis=0)
        if self.key == "fne":  # the store's own train statistics and thresholds
            mean, std, (low, high) = self.code
            raw = ternarize(raw, mean, std, low, high).astype(np.float32)
        return np.asarray(raw, dtype=np.float32), failures
