"""How a store's row arrays may be compressed, and the one check of a codec's name.

Rows stored one inner chunk per row (region features, :func:`features.store.layout.row_layout`) are
compressed by the store's codec, its ``codec`` attribute (a store without one is ``zstd``): ``zstd`` (Zarr's
default, the smallest files) or ``lz4`` (Blosc LZ4HC level 5 with byte shuffle: about 2.6x faster to
decompress, about 1.3x the bytes; ``docs/features.md``). Other arrays (one chunk per block, read whole) are
always zstd. A codec's name is checked here only (:func:`check_codec`), wherever it comes from: the
writer's argument, ``features recompress --codec``, a store's attribute; the settings and the options take
their choices from :data:`ROW_CODECS`. How chunks of each codec are decompressed within bounds:
:mod:`features.store.codec_bounds`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vsecore.errors import UserError

#: the codecs of rows stored one chunk per row
ROW_CODECS = ("zstd", "lz4")


def check_codec(codec: object, what: str) -> str:
    """``codec`` when it is one of :data:`ROW_CODECS`, else a one-line :class:`UserError` naming ``what``
    (the option, the argument or the attribute it came from)."""
    if codec not in ROW_CODECS:
        raise UserError(f"{what} is {str(codec)[:40]!r}, not one of {', '.join(ROW_CODECS)}")
    return str(codec)


def store_codec(attrs: Mapping[str, Any], where: str) -> str:
    """The store's ``codec`` attribute (:data:`ROW_CODECS`; ``zstd`` when absent, as in older stores);
    ``where`` names the store's record in a message."""
    return check_codec(attrs.get("codec", "zstd"), f"{where}: attribute codec")
