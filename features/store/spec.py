"""``STORE.zarr[:key]``: which features of a store a reader means (the one parser of that text).

Training (``--features``), the readers of :mod:`features.store.core`, export and query-time featurisation
all name features this way. The key is optional; :meth:`FeatureSpec.key_in` is the one rule for a bare
store path (the first of ``global``, ``fne``, ``regions`` the store holds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: array of each key: global CNN features, the ternary FNE, the raw FNE, region features
SPEC_ARRAYS = {"global": "global", "fne": "fne/ternary", "fne_raw": "fne/raw", "regions": "regions"}
#: the keys of ``STORE:key`` specs
KEYS = tuple(SPEC_ARRAYS)
#: a bare store path reads the first of these that the store holds (``global`` when none)
DEFAULT_KEYS = ("global", "fne", "regions")


@dataclass(frozen=True)
class FeatureSpec:
    """A feature store and, optionally, which of its features (``None``: see :meth:`key_in`)."""

    store: Path
    key: str | None = None

    @classmethod
    def parse(cls, text: str | Path) -> FeatureSpec:
        """``"PATH.zarr:key"`` -> ``(PATH.zarr, key)`` for a key of :data:`KEYS`; anything else is a bare
        path (so ``/a/b:c.zarr`` is a store whose name holds a colon)."""
        head, sep, tail = str(text).rpartition(":")
        if sep and tail in KEYS and head:
            return cls(Path(head), tail)
        return cls(Path(text))

    @property
    def is_regions(self) -> bool:
        """Whether the spec names region features explicitly (``STORE:regions``)."""
        return self.key == "regions"

    def key_in(self, has: Callable[[str], bool]) -> str:
        """The key read from a store whose arrays ``has(name)`` tells: the given one, else the default."""
        if self.key is not None:
            return self.key
        return next((k for k in DEFAULT_KEYS if has(SPEC_ARRAYS[k])), "global")

    def __str__(self) -> str:
        return str(self.store) if self.key is None else f"{self.store}:{self.key}"
