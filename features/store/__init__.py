"""The feature store: one Zarr v3 group per dataset and extractor.

``core`` (:class:`~features.store.core.FeatureStore`, the writer), ``layout`` (what the writer makes and the
check of a store's record before any read), ``codecs`` (the row codecs and the one check of a codec's name)
and ``codec_bounds`` (decompression bounded by a chunk's size), ``array`` (damaged chunks as one-line
errors), ``state`` (one consistent version of the rows), ``read`` / ``chunk_read`` / ``rows`` (the readers),
``spec`` (``STORE:key``), ``ternary`` (the FNE's stored code), ``verify`` and ``recompress``. Importing this
package loads nothing: its modules are imported by name.
"""
