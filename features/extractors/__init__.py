"""The extractors: one file per kind of extractor, registered like the model families, and the building
blocks they share.

``cnn`` (10-crop global features), ``fne`` (the Full-Network Embedding), ``grid`` and ``fasterrcnn`` (the
two detectors of ``features regions``) are declared in their files (:mod:`features.extractors.registry`
says what a declaration holds) and registered below, in the order ``features --help`` lists them. The
declarations import no torch (``features --help`` and ``pipelines.yaml`` read their settings); their
mappers live beside them (``crop_mapper``, ``full_network``, ``grid_mapper``, ``detector_mapper``) with the
blocks they share: ``backbones``, ``weights``, ``crops``, ``images`` (robust image loading), ``mapper`` (the
mapper base), ``regions`` (what the region extractors share) and ``recipe`` (one builder for a store's
mapper). An extractor of one's own: ``register_extractor(module.EXTRACTOR)``.
"""

from features.extractors import cnn, detector, fne, grid
from features.extractors.registry import Extractor, register_extractor

#: the extractors that ship with the toolkit, in ``features --help`` order
BUILTIN_EXTRACTORS: tuple[Extractor, ...] = (cnn.EXTRACTOR, fne.EXTRACTOR, grid.EXTRACTOR, detector.EXTRACTOR)
for _extractor in BUILTIN_EXTRACTORS:
    register_extractor(_extractor)
