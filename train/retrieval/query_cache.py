"""Query candidates embedded once: one side of a split (its images, or its captions) embedded by one model,
kept in a cache file that verifies its own content.

Why: ``train query`` embedded the whole split, images and captions, at every call (49 s for one text on
a run, 76 s for an image on an exported model), while only the query itself is new. A text query needs
the images of the split, an image query its captions: :func:`cached_side` gives that side back from a
file after the first query, and the second query neither reads the feature store nor runs an encoder over
the candidates.

Where: ``$VSE_QUERY_CACHE`` when set (``0``/``off``/``no``/``false``: no file, the candidates are embedded at
every call), else ``<cache home>/vse-toolkit/query/`` (``$XDG_CACHE_HOME``, or ``~/.cache``;
:func:`vsecore.inductor_cache.cache_home`), created 0700. Not inside the run: ``--overwrite`` refuses a run
directory holding files ``train`` did not write, an exported model folder is made to be shared or
published (often read-only, and whoever reads it should not write into it), and a prepared dataset shared by
a group is often read-only; the embeddings depend on the model and the data together, and are the
querying user's own. One file per place (:func:`cache_file`: the model's folder and checkpoint, the
dataset, the feature store, the split, the side and the language), so a new checkpoint or a re-extracted
store replaces the file instead of adding one.

What a file is used for (:func:`side_key`, compared whole with the key it records): the SHA-256 of the
model's weights as loaded (:func:`model_digest`: every tensor's name, dtype, shape and bytes: the weights
that embed, whether read from a checkpoint or from an exported folder, checked before they were loaded),
the feature store (its folder, key, ``generation`` token, which every write to a store renews, and the
digest of its layout, :func:`features.store.read.layout_digest`), the SHA-256 of the prepared
``dataset.json`` bytes, the split, the side, the caption language and text codec, the measure, the
device type and autocast, and torch's version (the kernels that computed the floats). A file made for
anything else is a detail line (``-v``), then the side is embedded again and the file replaced.

Its content is checked as every cache's (``docs/safety.md``, "Caches verify their own content"): written by
:func:`vsecore.containers.write_npz` (stored members, a digest of them, a temporary sibling and a rename);
read by :func:`vsecore.containers.read_npz` from checked headers (float32 ``(n, d)`` embeddings, int64
``(n,)`` rows, ``n`` at most the dataset's images or captions, ``d`` at most
:data:`train.engine.settings.MAX_JOINT_DIM`), the digest recomputed over the bytes read, then the
recorded key, then the rows (inside the dataset, none twice). Any failure, or any error while reading, is
one warning line naming the file and the reason, then the same rebuild. A cached side is the fresh one
bit for bit, so the rankings are the same (``tests/test_query.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from features.store.core import FeatureStore
from features.store.read import layout_digest
from features.store.spec import FeatureSpec
from train.engine.settings import MAX_JOINT_DIM
from vsecore import console
from vsecore.containers import ContainerError, Member, NoDigest, one_line, read_npz, write_npz
from vsecore.inductor_cache import cache_home

#: ``0``/``off``/``no``/``false``: no cache; a folder: where the files go; unset: the user's cache home
QUERY_CACHE_ENV = "VSE_QUERY_CACHE"
_OFF = {"0", "off", "no", "false"}
#: version of a file's content; a file of another version is embedded again
QUERY_CACHE_VERSION = 1
#: the sides: a text query ranks the images, an image query the captions
IMAGES, CAPTIONS = "images", "captions"
#: the most bytes of a file's recorded key (a few hundred)
MAX_KEY_BYTES = 1 << 20
_MEMBERS = {"meta": Member(("uint8",), shape=("key",)), "embeddings": Member(("float32",), shape=("n", "d")),
            "rows": Member(("int64",), shape=("n",))}


@dataclass
class Side:
    """One side of the candidates, embedded: ``embeddings`` (K, d) float32 on the CPU, and ``rows`` (K,)
    int64: the image row (``imgid``) of each image, or the sentence row (index into the prepared dataset's
    sentences) of each caption."""

    embeddings: torch.Tensor
    rows: np.ndarray


def cache_folder(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where the query caches go (:data:`QUERY_CACHE_ENV`, else the user's cache home), or None: none."""
    setting = environ.get(QUERY_CACHE_ENV, "").strip()
    if setting.lower() in _OFF:
        return None
    return Path(setting).expanduser() if setting else cache_home(environ) / "vse-toolkit" / "query"


def model_digest(model: torch.nn.Module) -> str:
    """SHA-256 of ``model``'s state as loaded: each tensor's name, dtype and shape, then its bytes, in
    state-dict order (the weights that embed the candidates, wherever they were read from)."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"{name}\0{t.dtype}\0{tuple(tensor.shape)}\0".encode())
        h.update(memoryview(t.view(torch.uint8).numpy()))
    return h.hexdigest()


def store_identity(spec: str) -> dict[str, Any]:
    """What identifies the rows of the feature store ``STORE[:key]`` now: its folder, the key, the
    ``generation`` token every write renews, and the digest of the key's layout (opening the store checks
    its record; no row is read)."""
    parsed = FeatureSpec.parse(spec)
    store = FeatureStore(parsed.store)
    return {"store": str(parsed.store.resolve()), "key": parsed.key,
            "generation": store.opened_state.generation, "layout": layout_digest(spec)}


def side_key(model: str, features: dict[str, Any], dataset_sha256: str, split: str | None, side: str,
             text: dict[str, Any] | None, settings: Any, device: torch.device) -> dict[str, Any]:
    """The key a cache file of one side records and is used for (the module docstring lists it).

    ``model``: :func:`model_digest`; ``features``: :func:`store_identity`; ``text``: the caption language
    and the codec's identity (captions only); ``settings``: the run's (measure, ``order_sqrt``, ``amp``)."""
    return {"version": QUERY_CACHE_VERSION, "side": side, "split": split or "all", "model_sha256": model,
            "features": features, "dataset_sha256": dataset_sha256, "text": text,
            "measure": settings.measure, "order_sqrt": bool(settings.order_sqrt),
            "device": device.type, "amp": bool(settings.amp), "torch": torch.__version__}


def cache_file(folder: Path, place: Mapping[str, Any]) -> Path:
    """The file of one ``place`` (model folder and checkpoint, dataset, store, split, side, language) in
    ``folder``: named by the SHA-256 of the place, so a new checkpoint or store there replaces it."""
    name = hashlib.sha256(json.dumps(dict(place), sort_keys=True).encode()).hexdigest()[:24]
    return folder / f"{place.get('side', 'side')}-{name}.npz"


def cached_side(place: Mapping[str, Any], key: dict[str, Any], most_rows: int, build: Callable[[], Side],
                write: bool = True) -> Side:
    """One side of the candidates: read from its cache file when that holds ``key``'s and checks out, else
    ``build()`` and (``write``) kept in the file. ``most_rows``: the rows (images or captions) of the
    dataset, the bound of a file's length and of every row it names."""
    folder = cache_folder()
    path = None if folder is None else cache_file(folder, place)
    if path is not None and path.is_file():
        found = read_side(path, key, most_rows)
        if isinstance(found, Side):
            console.detail(f"query candidates: {len(found.rows)} {key['side']} read from {path}")
            return found
        say = console.detail if found.startswith("made ") else console.warning
        say(f"query cache {path}: {found}; embedding the {key['side']} again")
    side = build()
    if path is not None and write:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_side(path, key, side)
        except OSError as exc:  # a read-only or full disk: the side is still right, only not kept
            console.detail(f"query cache {path} not written ({exc.strerror or exc}); embedded at every query")
    return side


def write_side(path: Path, key: dict[str, Any], side: Side) -> None:
    """Write ``side`` and its ``key`` into ``path``, with a digest of them (a temporary sibling, a rename)."""
    write_npz(path, {"meta": np.frombuffer(json.dumps(key, sort_keys=True).encode(), dtype=np.uint8),
                     "embeddings": side.embeddings.detach().to("cpu", torch.float32).contiguous().numpy(),
                     "rows": np.ascontiguousarray(side.rows, dtype=np.int64)})


def read_side(path: Path, key: dict[str, Any], most_rows: int) -> Side | str:
    """The side in ``path`` if it holds ``key``'s and everything checks out (the module docstring's order),
    else why not (a phrase; whatever a damaged or hostile file raises, MemoryError included, is one)."""
    try:
        arrays = read_npz(path, _MEMBERS, {"key": MAX_KEY_BYTES, "n": most_rows, "d": MAX_JOINT_DIM},
                          digest=True)
        meta = json.loads(arrays["meta"].tobytes().decode("utf-8"))
        if not isinstance(meta, dict):
            return "unreadable record (not an object)"
        if meta != json.loads(json.dumps(key, sort_keys=True)):
            return f"made for {_difference(meta, key)}"
        rows = arrays["rows"]
        if len(rows) and (rows.min() < 0 or rows.max() >= most_rows or len(np.unique(rows)) != len(rows)):
            return f"rows outside the dataset's {most_rows} or named twice"
    except NoDigest:
        return "made by another version (no digest)"
    except ContainerError as exc:
        return str(exc)
    except ValueError as exc:  # a record that is not JSON
        return f"damaged ({one_line(exc)})"
    except Exception as exc:  # whatever else a hostile file raises: a rebuild, never a traceback
        return f"unreadable ({one_line(exc)})"
    return Side(torch.from_numpy(arrays["embeddings"]), rows)


def _difference(meta: dict[str, Any], key: dict[str, Any]) -> str:
    """What a recorded key was made for, in words: the first field that differs from ``key``."""
    names = {"model_sha256": "other weights", "features": "another feature store or generation of it",
             "dataset_sha256": "another dataset.json", "version": "another version"}
    for field in ("version", "model_sha256", "features", "dataset_sha256"):
        if meta.get(field) != key.get(field):
            return names[field]
    different = sorted(k for k in set(meta) | set(key) if meta.get(k) != key.get(k))
    return f"another {', '.join(different) or 'key'}"
