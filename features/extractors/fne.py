"""``features fne``: the Full-Network Embedding (FNE paper section 3.1) -> ``fne/raw``, ``fne/mean``,
``fne/std``, ``fne/ternary``.

The average-pooled activations of every layer (:mod:`features.extractors.full_network`), averaged over
the crops as ``features cnn`` averages its global feature; once every block is in, the statistics of the
valid train rows and the ternary code with the thresholds below (:mod:`features.store.ternary`, which
``--rethreshold`` rewrites alone).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from features.extractors.cnn import (
    BATCH_HELP,
    CNN_HELP,
    DECODER_HINT,
    CnnConfig,
    check_crops,
    crop_mapper,
    crops_recipe,
    crops_record,
)
from features.extractors.registry import Extractor
from features.store.ternary import DEFAULT_HIGH, DEFAULT_LOW, check_threshold_options, finish_fne


class FneConfig(CnnConfig):
    """The 10-crop settings and the ternary thresholds."""

    cnn: str = Field("vgg19", description=CNN_HELP + " (FNE: vgg16 in the paper)",
                     json_schema_extra={"metavar": "NAME"})
    threshold_low: float = Field(DEFAULT_LOW, json_schema_extra={"metavar": "X"}, description=(
        f"ternary threshold: standardised values below it map to -1 (default {DEFAULT_LOW})"))
    threshold_high: float = Field(DEFAULT_HIGH, json_schema_extra={"metavar": "Y"}, description=(
        f"ternary threshold: standardised values above it map to 1 (default {DEFAULT_HIGH})"))


def fne_record(settings: Any, mapper: Any, store: dict[str, Any]) -> dict[str, Any]:
    """A 10-crop store's ``config`` and the thresholds of its ternary code."""
    thresholds = [settings.threshold_low, settings.threshold_high]
    return {**crops_record(settings, mapper, store), "thresholds": thresholds}


def check_fne(settings: Any) -> None:
    """The 10-crop checks, and finite thresholds with low below high."""
    check_threshold_options(settings.threshold_low, settings.threshold_high)
    check_crops(settings)


def finish_fne_store(store: Any, dataset: Any, settings: Any) -> None:
    """The statistics of the valid train rows and the ternary code, once every block is in."""
    finish_fne(store, dataset.split_mask("train"), settings.threshold_low, settings.threshold_high)


def build_fne(config: dict[str, Any]) -> Any:
    """The mapper of an ``fne`` store's config: the crop-averaged activations of every layer."""
    return crop_mapper(config, "fne")


EXTRACTOR = Extractor(
    name="fne", kind="fne", summary="Full-Network Embedding -> fne/raw, fne/mean, fne/std, fne/ternary",
    description="Full-Network Embedding (FNE 3.1): average-pooled activations of every conv layer plus "
                "fc6/fc7, averaged over crops, standardised with train-split statistics and discretized to "
                "{-1, 0, 1}.",
    config=FneConfig, recipe=crops_recipe, build=build_fne, keys=("fne", "fne_raw"), record=fne_record,
    check=check_fne, finish=finish_fne_store, option_help=BATCH_HELP,
    hints={"thresholds": "use `features fne --rethreshold` to change only the thresholds, or --overwrite",
           **DECODER_HINT},
    flags={"--rethreshold": "only recompute fne/ternary of the finished store --out with the thresholds"})
