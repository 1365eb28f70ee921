"""``features recompress``: a finished store's rows, the same bits, compressed by another codec.

Region rows are stored one chunk per row (:data:`features.store.layout.SHARD_ROW_BYTES`) and read a
batch at a time while training, so their decompression is what a region run's loader spends its time
on (``docs/scale.md``). The codec is a store's choice (:data:`features.store.codecs.ROW_CODECS`):
``zstd`` (the default, the smallest files) or ``lz4`` (Blosc LZ4HC with byte shuffle: faster to
decompress, larger). This command writes a copy of a complete store with those arrays compressed by
``codec``, block by block through the store's own writer, and every other array, attribute, validity
flag and failure record as the source has them; the source is only read. The copy is the same features
to every reader: the same rows bit for bit, the same ``config`` (a run trained on the source accepts the
copy in its place: :func:`features.store.read.layout_digest` names both codecs alike), and its provenance says
where it came from (``recompressed_from``: the source's path, generation, codec and code version).

It holds the copy's lock while writing; a copy that was interrupted is resumed by the same command
(blocks already written are kept) as long as the source is unchanged (same generation), otherwise
``--overwrite`` starts it again.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from features.store.codecs import check_codec, store_codec
from features.store.core import FeatureStore, remove_killed_leftovers
from vsecore.errors import UserError
from vsecore.io import exclusive_lock
from vsecore.jsonfile import parse_json
from vsecore.outputs import check_output_folder

#: the attributes the copy makes for itself (the others are copied from the source)
_OWN_ATTRS = ("generation", "codec", "complete", "provenance", "code_version")


@dataclass
class RecompressSummary:
    """What :func:`recompress_store` wrote: the copy, its codec, the blocks written (others were kept from
    an interrupted copy), and the bytes of the arrays stored one chunk per row before and after."""

    store: Path
    codec: str
    blocks_written: int
    blocks: int
    row_arrays: list[str]
    bytes_before: int
    bytes_after: int
    seconds: float


def row_arrays(store: FeatureStore) -> list[str]:
    """The arrays of ``store``'s outputs stored one chunk per row (the ones a codec applies to)."""
    return [name for name in store.attrs["outputs"] if store.array(name).zarr.shards is not None]


def recompress_store(source: str | Path, out: str | Path, codec: str, overwrite: bool = False
                     ) -> RecompressSummary:
    """Write a copy of the complete store ``source`` at ``out`` with its row arrays compressed by ``codec``.

    A :class:`UserError` (one line) for an incomplete source, a source with no array stored one chunk per
    row, an ``out`` that is an input or inside another artifact, or an existing ``out`` that is not an
    interrupted copy of this source in this codec (without ``overwrite``).
    """
    check_codec(codec, "--codec")
    src = FeatureStore(source)
    src.require_complete()
    names = row_arrays(src)
    if not names:
        raise UserError(f"{src.path}: no array of this store is stored one chunk per row (region features "
                        "are); its other arrays are always zstd, so there is nothing to recompress")
    out = Path(out)
    check_output_folder(out, (), inputs=[src.path], owner=out)
    t0 = time.perf_counter()
    with exclusive_lock(out, "the feature store"):
        remove_killed_leftovers(out)  # a copy killed while created leaves its .NAME.XXXXXXXX.partial
        dst = _open_copy(src, out, codec, overwrite)
        todo = [b for b in range(src.n_blocks) if not dst.block_done(b)]
        try:
            for block in todo:
                _copy_block(src, dst, block)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line saying what is kept, as extraction's
            with contextlib.suppress(UserError, OSError):
                kept = f"{int(dst.blocks_done().sum())} of {dst.n_blocks} blocks kept"
                exc.args = (f"interrupted: {kept}, re-run the same command to resume",)
            raise
        src.check_unchanged(src.opened_state)  # the source was not rewritten while copied
        extra = {k: v for k, v in src.attrs.items() if k not in _OWN_ATTRS}
        dst.set_attrs(**extra, complete=True)
    before, after = (sum(_array_bytes(store, n) for n in names) for store in (src, dst))
    return RecompressSummary(out, codec, len(todo), src.n_blocks, names, before, after,
                             time.perf_counter() - t0)


def _open_copy(src: FeatureStore, out: Path, codec: str, overwrite: bool) -> FeatureStore:
    """The copy at ``out``: created (or replaced with ``overwrite``), or an interrupted copy of ``src`` in
    ``codec`` resumed."""
    attrs = src.attrs
    origin = {"store": str(src.path.resolve()), "generation": attrs.get("generation"),
              "codec": store_codec(attrs, str(src.path)), "code_version": attrs.get("code_version")}
    if out.exists() and not overwrite:
        dst = FeatureStore(out, mode="r+") if (out / "zarr.json").exists() else None
        made = (dst.attrs.get("provenance") or {}).get("recompressed_from") if dst is not None else None
        if dst is None or made != origin or store_codec(dst.attrs, str(out)) != codec:
            raise UserError(f"{out}: exists and is not an interrupted `features recompress` of {src.path} "
                            f"(as it is now) to --codec {codec}; add --overwrite to replace it")
        dst.recover()
        dst.set_attrs(complete=False)
        return dst
    outputs = {name: tuple(src.array(name).shape[1:]) for name in attrs["outputs"]}
    return FeatureStore.create(out, src.array("imgid")[:], outputs, src.block_size, attrs.get("config", {}),
                               {**(attrs.get("provenance") or {}), "recompressed_from": origin},
                               overwrite=overwrite, dtypes=attrs.get("dtypes"), codec=codec)


def _copy_block(src: FeatureStore, dst: FeatureStore, block: int) -> None:
    """Block ``block`` of every output, its validity and failure record, from ``src`` into ``dst``."""
    start, stop = src.block_rows(block)
    arrays = {name: np.asarray(src.array(name)[start:stop]) for name in src.attrs["outputs"]}
    text = str(src.array("failures")[block])
    failures: list[dict[str, Any]] = parse_json(text, f"{src.path}: block {block}") if text else []
    dst.write_block(block, arrays, np.asarray(src.array("valid")[start:stop], dtype=bool), failures)


def _array_bytes(store: FeatureStore, name: str) -> int:
    """Bytes of the chunk files of array ``name``."""
    folder = store.array_folder(name) / "c"
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
