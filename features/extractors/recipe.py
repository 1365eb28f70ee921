"""One builder for a store's mapper: extraction and query-time featurisation both go through it.

A store records what its rows depend on (``config``: network, weights, crops, sizes, region
detector settings, ...). :func:`mapper_config` turns such a record into the plain config a mapper is
built from, adding only what changes speed (:data:`SPEED_KEYS`). Extraction builds its record from
the command's settings (the extractor's ``recipe``, :mod:`features.extractors.registry`) and query-time
featurisation (:class:`features.featurize.Featurizer`) reads it from the finished store, so an option that
reaches the extraction's mapper reaches the query's mapper too (``tests/test_features_recipe.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from features.extractors.registry import SPEED_KEYS, get_extractor_of, get_extractor_of_config
from vsecore.device import resolve_device
from vsecore.errors import UserError

if TYPE_CHECKING:
    from features.executors.extract import Mapper
    from features.settings import FeaturesSection

#: keys of a store's config that describe the store, not the mapper (see ``features.run.store_config``)
STORE_KEYS = ("weights_sha256", "block_size", "images_sha256", "dataset_sha256", "n_rows", "outputs",
              "thresholds")


def mapper_config(recorded: Mapping[str, Any], *, device: str = "cpu", batch_size: int | None = None,
                  threads: int | None = None, allow_download: bool = False) -> dict[str, Any]:
    """The plain mapper config of a store's recorded ``config`` (or of an extractor's recipe).

    Everything recorded that is not about the store itself (:data:`STORE_KEYS`) goes to the mapper, the
    store's ``kind`` (and selector) saying which extractor builds it; the speed settings
    (:data:`SPEED_KEYS`) are the caller's.
    """
    config = {k: v for k, v in recorded.items() if k not in STORE_KEYS and k not in SPEED_KEYS}
    return {**config, "batch_size": batch_size, "device": device, "threads": threads,
            "allow_download": allow_download}


def rows_description(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """What the rows of a store whose recorded ``config`` this is mean: the extractor and every setting its
    mapper is rebuilt from (:func:`mapper_config`), the weights' SHA-256 and the row shapes; two stores whose
    descriptions are equal hold rows of one space (another collection searched with a run's model). ``amp``
    and ``decoder`` are left out, as such stores were always compared: bf16 and another JPEG decoder change
    the rows' rounding, not their space."""
    described = {k: v for k, v in recorded.items() if k not in STORE_KEYS and k not in SPEED_KEYS}
    described.pop("amp", None)
    described.pop("decoder", None)
    return {**described, "weights_sha256": recorded.get("weights_sha256"), "outputs": recorded.get("outputs")}


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
        config = mapper_config(get_extractor_of(settings).recipe(settings), device=device or settings.device,
                               batch_size=settings.batch_size, threads=torch_threads(settings),
                               allow_download=settings.allow_download)
        return cls(json.dumps(config, sort_keys=True))

    @classmethod
    def from_store(cls, recorded: Mapping[str, Any], device: str = "cpu", batch_size: int | None = None,
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
        """Load the network and build the mapper (once per process, see ``cached_mapper``): the extractor
        that the config's ``kind`` (and selector) names builds it."""
        config = self.config
        config["device"] = str(resolve_device(config["device"]))
        return get_extractor_of_config(config).build(config)
