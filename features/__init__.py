"""Stage 2: images -> feature store (10-crop CNN globals, Full-Network Embedding, region features).

By layer: ``cli`` (the ``features`` command, parse only; entry point ``entry``), ``run`` (the stage as a
library) and ``settings`` (its settings: the stage's own + the extractors'), ``extractors`` (one file per
kind of extractor, registered, and the blocks they share), ``executors`` (where blocks run: in-process or
Dask, and the block runner), ``store`` (the Zarr store: writer, layout, codecs, readers, verify,
recompress), ``interop`` (export and import of other codebases' formats), ``featurize`` (query images
featurized as a store's rows were).
"""
