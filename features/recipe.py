"""One builder for a store's mapper: extraction and query-time featurisation both go through it.

A store records what its rows depend on (``config``: network, weights, crops, sizes, region
detector settings, ...). :func:`mapper_config` turns such a record into the plain config a mapper is
built from, adding only what changes speed (:data:`SPEED_KEYS`). Extraction builds its record from
the command's settings (:func:`recorded_settings`) and query-time featurisation
(:class:`features.featurize.StoreFeaturizer`) reads it from the finished store, so an option that
reaches the extraction's mapper reaches the query's mapper too (``tests/test_features_recipe.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vsecore.errors import UserError

if TYPE_CHECKING:
    from features.extract import Mapper
    from features.settings import FeaturesSection

#: the network of ``features regions --detector grid`` when no --cnn is given: its ImageNet weights install
#: offline (see README), and its 7 x 7 x 1280 last feature map gives 49 regions
GRID_CNN = "efficientnet_lite0"
#: mapper settings that change speed, not the stored numbers (left out of a store's config)
SPEED_KEYS = ("batch_size", "device", "threads", "allow_download")
#: keys of a store's config that describe the store, not the mapper (see ``features.run.store_config``)
STORE_KEYS = ("weights_sha256", "block_size", "images_sha256", "dataset_sha256", "n_rows", "outputs",
              "thresholds")


def mapper_config(recorded: Mapping[str, Any], *, device: str = "cpu", batch_size: int = 32,
                  threads: int | None = None, allow_download: bool = False) -> dict[str, Any]:
    """The plain mapper config of a store's recorded ``config`` (or of :func:`recorded_settings`).

    Everything recorded that is not about the store itself (:data:`STORE_KEYS`) goes to the mapper;
    the store's ``kind`` ``cnn`` / ``fne`` becomes the mapper's ``global`` / ``fne``; the speed
    settings (:data:`SPEED_KEYS`) are the caller's.
    """
    config = {k: v for k, v in recorded.items() if k not in STORE_KEYS and k not in SPEED_KEYS}
    if config.get("kind") != "regions":
        config["kind"] = "fne" if config.get("kind") == "fne" else "global"
    return {**config, "batch_size": batch_size, "device": device, "threads": threads,
            "allow_download": allow_download}


def recorded_settings(settings: FeaturesSection) -> dict[str, Any]:
    """What ``settings`` ask of the mapper that determines the rows, shaped like a store's ``config``
    (sizes not given stay ``None``: the network's own, which the store records resolved)."""
    if settings.kind == "regions":
        return region_settings(settings)
    return {"kind": settings.kind, "cnn": settings.cnn, "weights": settings.weights, "crops": settings.crops,
            "input_size": settings.input_size, "resize": settings.resize, "amp": settings.amp}


def region_settings(settings: FeaturesSection) -> dict[str, Any]:
    """The region mapper ``settings`` ask for (see :func:`features.regions.build_region_mapper`).

    ``grid``: ``--cnn`` (default :data:`GRID_CNN`), ``--weights``, ``--input-size``. ``fasterrcnn``: weights
    ``coco`` (``imagenet``, the schema default, means the detector's own COCO weights), a file or ``none``;
    ``--input-size`` the shorter side the detector sees (default 800, the longer capped at 1333 / 800 of it);
    ``fixed_boxes`` K gives exactly K regions (``min_boxes = max_boxes = K``), ``null`` the adaptive
    ``min_boxes..max_boxes``; the selection's ``score_threshold`` and ``nms_threshold``.
    """
    from features.regions import DETECTORS, FASTERRCNN_NETWORK

    detector = "fasterrcnn" if settings.detector == FASTERRCNN_NETWORK else settings.detector
    common = {"kind": "regions", "detector": detector, "amp": settings.amp}
    if detector == "grid":
        cnn = settings.cnn if "cnn" in settings.model_fields_set else GRID_CNN
        return {**common, "cnn": cnn, "weights": settings.weights, "input_size": settings.input_size}
    if detector == "fasterrcnn":
        if "cnn" in settings.model_fields_set:
            raise UserError(f"--cnn {settings.cnn}: the network of --detector fasterrcnn is "
                            f"{FASTERRCNN_NETWORK}; --cnn chooses the network of --detector grid")
        low, high = ((settings.fixed_boxes, settings.fixed_boxes) if settings.fixed_boxes
                     else (settings.min_boxes, settings.max_boxes))
        weights = "coco" if settings.weights == "imagenet" else settings.weights
        scale = {} if settings.input_size is None else {
            "min_size": settings.input_size, "max_size": round(settings.input_size * 1333 / 800)}
        return {**common, **scale, "weights": weights, "min_boxes": low, "max_boxes": high,
                "score_threshold": settings.score_threshold, "nms_iou": settings.nms_threshold}
    if detector == "detectron2":
        return common  # build_region_mapper explains the way round it
    raise UserError(f"--detector {settings.detector!r}: use one of {', '.join(DETECTORS)}")


def torch_threads(settings: FeaturesSection) -> int:
    """Intra-op torch threads of every mapper of a run: ``--threads``, else a default per scheduler.

    CPU kernels sum in an order that depends on the thread count (rows differ in the last bits:
    up to 1.4e-6 for EfficientNet-Lite0 between 1 and 2 threads), so the count is fixed per run and
    sent to the workers with the mapper's recipe: the same ``--threads`` gives bit-identical rows
    in-process and on any cluster. Defaults: in-process all of torch's threads; ``local``: the CPU
    cores shared among ``--workers``; a remote cluster: 1 (as ``dask worker`` sets).
    """
    if settings.threads is not None:
        if settings.threads < 1:
            raise UserError(f"--threads must be at least 1, got {settings.threads}")
        return int(settings.threads)
    if settings.scheduler == "none":
        import torch

        return int(torch.get_num_threads())
    if settings.scheduler == "local":
        return max(1, (os.cpu_count() or 1) // max(1, settings.workers))
    return 1


@dataclass(frozen=True)
class ImageMapperFactory:
    """Recipe for a mapper (:func:`mapper_config`): a plain dict, so it pickles to Dask workers.

    ``device`` ``auto`` is resolved where the mapper is built (a worker may have a GPU the
    driver lacks).
    """

    config_json: str

    @classmethod
    def from_settings(cls, settings: FeaturesSection, device: str | None = None) -> ImageMapperFactory:
        """The recipe of the mapper that ``settings`` ask for (``threads`` resolved, see
        :func:`torch_threads`, so the driver and every worker use the same count)."""
        config = mapper_config(recorded_settings(settings), device=device or settings.device,
                               batch_size=settings.batch_size, threads=torch_threads(settings),
                               allow_download=settings.allow_download)
        return cls(json.dumps(config, sort_keys=True))

    @classmethod
    def from_store(cls, recorded: Mapping[str, Any], device: str = "cpu", batch_size: int = 32,
                   threads: int | None = None) -> ImageMapperFactory:
        """The recipe of the mapper that made a store, from its recorded ``config``."""
        config = mapper_config(recorded, device=device, batch_size=batch_size, threads=threads)
        return cls(json.dumps(config, sort_keys=True))

    @property
    def config(self) -> dict[str, Any]:
        """The mapper configuration as a dict."""
        return json.loads(self.config_json)

    @property
    def key(self) -> str:
        """Cache key: the whole configuration."""
        return self.config_json

    def build(self) -> Mapper:
        """Load the backbone and build the mapper (once per process, see ``cached_mapper``)."""
        from features.mapper import ImageMapper
        from vsecore.device import resolve_device

        config = self.config
        config["device"] = str(resolve_device(config["device"]))
        if config.get("kind") == "regions":
            from features.regions import build_region_mapper

            return build_region_mapper(config)
        return ImageMapper.from_config(config)
