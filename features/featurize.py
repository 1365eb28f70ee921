"""Features of new images, computed exactly as a finished store computed its rows.

A trained run knows its feature store; to embed an image that is not in the store (a query, a
user's photo), the same network, weights, crops and sizes must run again, and for the Full-Network
Embedding the store's own train-split statistics and thresholds must discretise the result.
:class:`StoreFeaturizer` rebuilds that extractor from the store's recorded configuration (with
:func:`features.recipe.mapper_config`, as extraction does) and checks that the weights it loads are
the ones the store was made with (their SHA-256).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from features.recipe import ImageMapperFactory
from features.spec import FeatureSpec
from features.store import FeatureStore
from vsecore.errors import UserError


class StoreFeaturizer:
    """``featurizer(paths) -> (rows (B, *feature_shape) float32, failures)`` like the store's rows.

    Args:
        spec: ``STORE.zarr[:key]`` as training reads it (``global``, ``fne`` ternary, ``fne_raw``).
        device: where the network runs (``cpu``, ``cuda``, ``auto``).

    Raises a :class:`UserError` for stores whose rows cannot be recomputed (imported features) or
    whose weights are no longer the same file.
    """

    def __init__(self, spec: str, device: str = "cpu") -> None:
        parsed = FeatureSpec.parse(spec)
        path = parsed.store
        self.store = FeatureStore(path)
        self.store.require_complete()
        config = self.store.attrs.get("config", {})
        kind = config.get("kind")
        if kind not in ("cnn", "fne"):
            origin = "imported" if kind == "import" else f"made by {kind}"
            raise UserError(f"{path}: its rows were {origin}, so new images cannot be featurized the same "
                            "way (extract the store with `features cnn|fne` to query with images)")
        self.key = parsed.key_in(self.store.has)
        if (self.key == "global") != (kind == "cnn"):
            raise UserError(f"{path}: has no '{self.key}' features")
        # the mapper the store was made with, built from its recorded config as extraction builds it
        self.recipe = ImageMapperFactory.from_store(config, device=device)
        self.mapper = self.recipe.build()
        recorded, loaded = config.get("weights_sha256"), self.mapper.backbone.weights_sha256
        if recorded != loaded:
            raise UserError(f"{path}: the store was made with weights {str(recorded)[:12]}..., the weights "
                            f"found now are {str(loaded)[:12]}...: new images would not be comparable")
        if self.key == "fne":
            self.mean = np.asarray(self.store.array("fne/mean")[:])
            self.std = np.asarray(self.store.array("fne/std")[:])
            # the ternary array carries the thresholds it was made with (see FeatureStore.replace_ternary)
            thresholds = self.store.array("fne/ternary").attrs.get("thresholds") or config.get("thresholds")
            self.thresholds = tuple(float(t) for t in thresholds)

    def __call__(self, paths: Sequence[str | Path]) -> tuple[np.ndarray, list[dict[str, str]]]:
        """Rows of the images at ``paths`` (unusable images are left out and listed as failures)."""
        from features.fne import ternarize
        from features.images import ImageError, load_image

        images, failures = [], []
        for p in paths:
            try:
                images.append(load_image(str(p), resize=self.mapper.backbone.resize))
            except ImageError as exc:
                failures.append({"path": str(p), "reason": str(getattr(exc, "reason", None) or exc)})
        if not images:
            return np.zeros((0, *self.store.array(self._array_name).shape[1:]), np.float32), failures
        (raw,) = self.mapper(images).values()
        if self.key == "fne":  # the store's own train statistics and thresholds
            raw = ternarize(raw, self.mean, self.std, *self.thresholds).astype(np.float32)
        return np.asarray(raw, dtype=np.float32), failures

    @property
    def _array_name(self) -> str:
        return {"global": "global", "fne": "fne/ternary", "fne_raw": "fne/raw"}[self.key]
