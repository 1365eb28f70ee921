"""What a reader of a feature store compares before and after reading, so that it gets one version of the
rows or a one-line error (:class:`ConsistentReads`, a base of :class:`features.store.core.FeatureStore`).

Two independent checks: the store's ``generation`` token (a new one with every attribute update and
rewrite, :meth:`ConsistentReads.check_unchanged`) and the identity of the array read (its folder's inode
and a digest of its ``zarr.json``, which carries a token of its own: :meth:`ConsistentReads.array_identity`),
taken before and after its rows are read. A writer rewriting in place marks the store (``rewriting``)
and holds its lock: readers that meet both are told so (:meth:`ConsistentReads.check_readable`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from vsecore.errors import UserError
from vsecore.io import lock_holder
from vsecore.jsonfile import read_json

#: the largest group zarr.json read (its attributes list the failures: one record per failed image)
MAX_GROUP_METADATA_BYTES = 64 << 20


@dataclass(frozen=True)
class StoreState:
    """What a reader compares before and after reading (:meth:`FeatureStore.state`)."""

    generation: str | None
    rewriting: str | None
    complete: bool


class ConsistentReads:
    """The reader's checks of a store at ``path`` (a base of :class:`features.store.core.FeatureStore`, which
    provides :meth:`array_folder`)."""

    path: Path

    def array_folder(self, name: str) -> Path:  # pragma: no cover - FeatureStore's
        raise NotImplementedError

    def state(self) -> StoreState:
        """The store's generation, rewrite marker and completeness, read afresh from its ``zarr.json``
        (one small file: the ``generation`` token changes with every attribute update and rewrite)."""
        try:
            attrs = read_json(self.path / "zarr.json", "the store's metadata", most=MAX_GROUP_METADATA_BYTES,
                              kind=dict).get("attributes", {})
        except UserError:
            return StoreState("unreadable", "replaced", False)  # between the two renames of --overwrite
        return StoreState(attrs.get("generation"), attrs.get("rewriting"), bool(attrs.get("complete")))

    def check_readable(self, state: StoreState | None = None) -> StoreState:
        """The store's :meth:`state`, or a one-line UserError while a live writer rewrites it in place or
        writes it (incomplete while a writer holds its lock).

        A ``rewriting`` marker without a live lock holder was left by a killed writer: each of its
        steps leaves the store readable (:meth:`replace_ternary`), so it does not stop readers.
        """
        state = state or self.state()
        if state.rewriting or not state.complete:
            holder = lock_holder(self.path)
            if holder and state.rewriting:
                raise UserError(f"{self.path}: the store is being rewritten ({state.rewriting}) by {holder}; "
                                "read it again when that finishes")
            if holder:
                raise UserError(f"{self.path}: the store is being written by {holder}; read it again when "
                                "that finishes")
        return state

    def check_unchanged(self, before: StoreState) -> None:
        """A one-line UserError if the store changed since ``before`` (a rewrite overlapped a read)."""
        if self.state().generation != before.generation:
            raise self._rewritten("the store")

    def array_identity(self, name: str) -> tuple[str, int, str] | None:
        """What array ``name`` is now: ``(its folder, the folder's inode, a digest of its zarr.json)``,
        or ``None`` while it is missing (a ``--rethreshold`` swap between its renames).

        A reader takes it before and after reading the array's rows: any replacement of the array in
        between (a swap renames folders and gives the new array its own ``written`` token) changes it,
        whatever the store's attributes say (:meth:`check_array_unchanged`).
        """
        folder = self.array_folder(name)
        real = folder.relative_to(self.path).as_posix()
        try:
            inode = os.stat(folder).st_ino
            meta = (folder / "zarr.json").read_bytes()
        except OSError:
            return None
        return real, inode, hashlib.sha256(meta).hexdigest()

    def check_array_unchanged(self, name: str, before: tuple[str, int, str] | None) -> None:
        """A one-line UserError unless array ``name`` is still the one :meth:`array_identity` gave as
        ``before`` (it was replaced while its rows were read)."""
        if before is None or self.array_identity(name) != before:
            raise self._rewritten(f"array '{name}'")

    def _rewritten(self, what: str) -> UserError:
        """The one-line error for ``what`` (the store, or one of its arrays) rewritten during a read."""
        holder = lock_holder(self.path)
        by = f" by {holder}" if holder else ""
        return UserError(f"{self.path}: {what} was rewritten{by} while it was being read; read it again "
                         "(when that command has finished)")
