"""``train export-model --run R --out DIR``: a trained model in a folder made for sharing, and its reader.

A checkpoint carries the whole training state; what one publishes with a paper is the model. The
folder holds no pickle at all, so opening it can run no code:

    weights.safetensors     the model's tensors (``safetensors``: a JSON header and raw bytes)
    featurizer.safetensors  for Full-Network Embedding stores only: the store's train statistics
                            ``fne_mean`` (F,) and ``fne_std`` (F,) that discretise a new image's row
    model.json              what rebuilds the model and featurizes inputs: format, family, settings,
                            vocab_size, feature_shape, text_input, the text vocabulary and its limits,
                            the feature spec (store key and the store's extractor configuration), the
                            toolkit version, the source run, and the SHA-256 of each .safetensors file

:func:`train.retrieval.open.load_run` (so ``train query``, ``train evaluate`` and ``export-embeddings``)
accepts such a folder as ``--run``: a :class:`SharedModel` with no optimiser and no random states,
for evaluation and queries only. Texts are encoded with the recorded vocabulary; images are
featurized from the recorded extractor configuration (same network, weights checked by SHA-256,
crops and sizes; FNE statistics and thresholds). Candidates of a query or evaluation come from the
prepared dataset and feature store the settings name, when they exist on this machine, or from
``--data`` / ``--features``.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import save

from features.featurize import Featurizer
from features.store.core import FeatureStore
from features.store.read import parse_spec
from features.store.ternary import check_thresholds
from prep.dataset import Vocabulary
from train.config.run import (
    CLASSIFY_TASK,
    model_sizes,
    read_config,
    settings_from_config,
    validate_config,
)
from train.engine.codecs import TextCodec
from train.engine.inference import embed_images
from train.models.family import model_spec
from train.models.joint import build_model
from train.retrieval.loaded import LoadedRun, load_run_directory
from train.run.checkpoint import check_model_state
from train.run.layout import CONFIG
from vsecore import console
from vsecore.device import resolve_device
from vsecore.errors import UserError, disk_error_message
from vsecore.io import (
    atomic_directory,
    atomic_file,
    exclusive_lock,
    remove_stale_siblings,
    sha256_file,
    write_json_atomic,
)
from vsecore.jsonfile import read_json
from vsecore.version import code_version

MODEL_JSON = "model.json"
WEIGHTS = "weights.safetensors"
FEATURIZER = "featurizer.safetensors"
#: the ``format`` of model.json, and the version this code reads and writes
MODEL_FORMAT = "vse-toolkit-model"
MODEL_FORMAT_VERSION = 1
#: a model.json larger than this is refused before it is parsed (a word vocabulary is a few MB)
MAX_MODEL_JSON_BYTES = 64 << 20


def _store_config(features: str) -> tuple[str, dict[str, Any]]:
    """``(key, config)`` of the feature spec ``STORE[:key]``: the key the run reads and the store's
    recorded extractor configuration."""
    path, key = parse_spec(features)
    store = FeatureStore(path)
    key = key or ("global" if store.has("global") else "fne")
    return key, dict(store.attrs.get("config", {}))


def export_model(run_dir: str | os.PathLike, out: str | os.PathLike, checkpoint: str = "best",
                 overwrite: bool = False) -> Path:
    """Write the model of ``run_dir``'s ``checkpoints/<checkpoint>.pt`` as a shareable folder ``out``.

    ``out`` must not exist, or (with ``overwrite``) be a model folder this command wrote; it is
    written into a temporary sibling and renamed into place at the end, holding ``out``'s lock, after
    removing the temporary siblings (``.NAME.XXXXXXXX.partial``, ``.NAME.old-PID``) an export killed
    before it left. A full (or read-only) disk is one line saying that nothing was written and what is
    kept; so is a classification run, which has no retrieval model to share.
    """
    if is_model_folder(run_dir):
        raise UserError(f"{run_dir}: already a model folder made by export-model (copy it to share it)")
    if read_config(run_dir).get("task") == CLASSIFY_TASK:
        raise UserError(f"{run_dir}: a text classification run; export-model writes retrieval models only "
                        "(evaluate it with `train evaluate --run`, predict with `train predict`)")
    run = load_run_directory(run_dir, checkpoint, "cpu")
    out = Path(out)
    _check_model_out(out, overwrite)
    key, store_config = _store_config(run.settings.features)
    model_json = _model_json(run, run_dir, checkpoint, key, store_config)
    with exclusive_lock(out, "this model folder"):
        for stale in remove_stale_siblings(out):
            console.warning(f"export-model: removed {stale.name} (left by a killed export)")
        _check_model_out(out, overwrite)  # again, holding the lock: another export may have written it
        existed = out.exists()
        try:
            _write_model_folder(out, run, model_json, key)
        except (OSError, SafetensorError) as exc:
            reason = _disk_reason(exc, out)
            if reason is None:
                raise
            kept = f"the model folder already at {out} is unchanged" if existed else "nothing was written"
            raise UserError(f"{reason}; {kept}") from None
    return out


def _check_model_out(out: Path, overwrite: bool) -> None:
    """``--out`` of export-model: new, or with ``overwrite`` a model folder this command wrote."""
    if out.exists():
        if not overwrite:
            raise UserError(f"{out}: already exists; give another --out or --overwrite")
        if not is_model_folder(out):
            raise UserError(f"{out}: exists and is not a model folder written by export-model; not "
                            "replacing it")


def _model_json(run: LoadedRun, run_dir: str | os.PathLike, checkpoint: str, key: str,
                store_config: dict[str, Any]) -> dict[str, Any]:
    """``model.json`` of ``run`` (its SHA-256 entries are added as the files are written)."""
    codec = run.codec
    return {
        "format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION,
        "family": run.settings.family, "settings": run.settings.model_dump(),
        "text_input": codec.kind, "vocab_size": codec.vocab_size,
        "feature_shape": model_sizes(run.config)[1],
        "vocabulary": {"kind": codec.kind, "symbols": list(codec.vocab.symbols), "pad": codec.vocab.pad,
                       "unk": codec.vocab.unk, "lowercase": bool(codec.vocab.lowercase),
                       "min_count": int(codec.vocab.min_count), "max_len": int(codec.max_len),
                       "word_length": int(codec.word_length), "lang": codec.lang},
        "features": {"key": key, "store": store_config},
        "toolkit_version": code_version(),
        "source": {"run": str(Path(run_dir).resolve()), "checkpoint": checkpoint, "epoch": run.epoch,
                   "code_version": run.config.get("code_version")},
    }


def save_file(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` (name -> tensor of any shape) as a safetensors file at ``path``.

    Through :func:`vsecore.io.atomic_file`, so the file gets ``model.json``'s permissions (0666 less the
    umask) in a folder made for publishing; safetensors' own file writer left it 0600.
    """
    with atomic_file(Path(path)) as fh:
        fh.write(save(tensors, metadata=metadata))


def _write_model_folder(out: Path, run: LoadedRun, model_json: dict[str, Any], key: str) -> None:
    """The files of the model folder, written into a temporary sibling renamed to ``out`` at the end."""
    tensors = {name: t.detach().cpu().contiguous().clone() for name, t in run.model.state_dict().items()}
    with atomic_directory(out, overwrite=True) as tmp:
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": MODEL_FORMAT})
        model_json["sha256"] = {WEIGHTS: sha256_file(tmp / WEIGHTS)}
        if key == "fne":
            store = FeatureStore(parse_spec(run.settings.features)[0])
            thresholds = (store.array("fne/ternary").attrs.get("thresholds")
                          or model_json["features"]["store"]["thresholds"])
            model_json["features"]["thresholds"] = [float(t) for t in thresholds]
            # the statistics in the store's own dtype: a new image is discretised exactly as the store's rows
            save_file({name: torch.from_numpy(np.ascontiguousarray(store.array(f"fne/{array}")[:]))
                       for name, array in (("fne_mean", "mean"), ("fne_std", "std"))}, str(tmp / FEATURIZER))
            model_json["sha256"][FEATURIZER] = sha256_file(tmp / FEATURIZER)
        write_json_atomic(tmp / MODEL_JSON, model_json)


#: the errno in the text of a ``SafetensorError`` of a failed write: ``I/O error: No space left on device
#: (os error 28) at path ...``, or in older versions Rust's ``IoError(Os { code: 28, ... })``
_RUST_ERRNO = re.compile(r"\(os error (\d+)\)|\bcode:\s*(\d+)")


def _disk_reason(exc: BaseException, out: Path) -> str | None:
    """One line for a full, read-only or forbidden disk under ``out`` (an ``OSError``, or the safetensors
    writer's ``SafetensorError`` carrying the errno in its text), else None."""
    if isinstance(exc, OSError):  # named as the file of out it was for, not its temporary folder's
        where = out / Path(exc.filename).name if exc.filename else out
        return disk_error_message(OSError(exc.errno, exc.strerror, str(where)))
    found = _RUST_ERRNO.search(str(exc))
    code = int(found[1] or found[2]) if found else errno.ENOSPC if "No space left" in str(exc) else None
    if code is None:
        return None
    return disk_error_message(OSError(code, os.strerror(code), str(out)))


# -- reading a model folder --------------------------------------------------------------------------
def read_model_json(folder: Path) -> dict[str, Any]:
    """``model.json`` of a model folder, checked: format, version, settings (the run schema), sizes,
    vocabulary and feature spec (a one-line :class:`UserError` naming the file otherwise)."""
    path = folder / MODEL_JSON
    meta = read_json(path, "a model description (model.json)", most=MAX_MODEL_JSON_BYTES)
    if not isinstance(meta, dict) or meta.get("format") != MODEL_FORMAT:
        raise UserError(f"{path}: not a model description written by `train export-model`")
    if meta.get("format_version") != MODEL_FORMAT_VERSION:
        raise UserError(f"{path}: model format version {meta.get('format_version')!r}, this code reads "
                        f"{MODEL_FORMAT_VERSION}")
    validate_config(meta, path)
    vocab = meta.get("vocabulary")
    fields = {"kind": str, "symbols": list, "pad": str, "unk": str, "lowercase": bool, "min_count": int,
              "max_len": int, "word_length": int, "lang": str}
    if not isinstance(vocab, dict) or any(not isinstance(vocab.get(k), t) for k, t in fields.items()):
        raise UserError(f"{path}: 'vocabulary' lacks one of {', '.join(fields)} (or has the wrong type)")
    symbols = vocab["symbols"]
    if (not all(isinstance(s, str) for s in symbols) or len(symbols) != meta["vocab_size"]
            or vocab["pad"] not in symbols or vocab["unk"] not in symbols
            or vocab["kind"] != meta.get("text_input")):
        raise UserError(f"{path}: the vocabulary does not match vocab_size {meta['vocab_size']} and "
                        f"text_input {meta.get('text_input')!r}")
    _check_text_limits(meta, vocab, path)
    spec = meta.get("features")
    if not isinstance(spec, dict) or not isinstance(spec.get("key"), str) or not isinstance(spec.get("store"),
                                                                                             dict):
        raise UserError(f"{path}: 'features' lacks the store key and configuration")
    sums = meta.get("sha256")
    if not isinstance(sums, dict) or not isinstance(sums.get(WEIGHTS), str):
        raise UserError(f"{path}: 'sha256' does not give the checksum of {WEIGHTS}")
    return meta


def _check_text_limits(meta: dict[str, Any], vocab: dict[str, Any], path: Path) -> None:
    """The vocabulary's ``max_len``, ``word_length``, ``min_count`` and ``lang`` are the settings' (what the
    exported codec took from them): a ``max_len`` of 0 would cut every query to nothing."""
    settings = settings_from_config(meta["settings"])
    kind = vocab["kind"]
    expected = {"max_len": settings.max_chars if kind == "chars" else settings.max_words,
                "word_length": getattr(settings, "word_length", None) if kind == "word_chars" else None,
                "min_count": settings.min_word_count if kind == "words" else None, "lang": settings.lang}
    for key, value in expected.items():
        if value is not None and vocab[key] != value:
            raise UserError(f"{path}: vocabulary.{key} {vocab[key]!r} is not the settings' {value!r}")


def _read_tensors(folder: Path, name: str, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of ``folder/name`` after checking its SHA-256 against ``model.json``."""
    from safetensors.torch import load_file

    path = folder / name
    if not path.is_file():
        raise UserError(f"{path}: missing (the model folder is incomplete)")
    expected = meta["sha256"].get(name)
    if sha256_file(path) != expected:
        raise UserError(f"{path}: its SHA-256 is not the one model.json records: the file was changed or "
                        "damaged")
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable safetensors file ({exc})") from None


def read_fne_featurizer(folder: Path, meta: dict[str, Any]
                        ) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """``(fne_mean (F,), fne_std (F,), (low, high))`` of a Full-Network Embedding model folder, checked:
    finite float vectors of the feature width ``F``, a standard deviation not zero everywhere (every feature
    would be 0 and every score the same), two finite thresholds with low <= high (one line naming the
    file and the field otherwise)."""
    path = folder / MODEL_JSON
    thresholds = meta["features"].get("thresholds")
    if not isinstance(thresholds, list) or len(thresholds) != 2 or not all(
            isinstance(t, int | float) and not isinstance(t, bool) for t in thresholds):
        raise UserError(f"{path}: features.thresholds {str(thresholds)[:80]} is not two numbers [low, high]")
    try:
        check_thresholds(float(thresholds[0]), float(thresholds[1]), strict=False)
    except ValueError as exc:
        raise UserError(f"{path}: features.thresholds: {exc}") from None
    stats = _read_tensors(folder, FEATURIZER, meta)
    width = meta["feature_shape"]
    where = folder / FEATURIZER
    for name in ("fne_mean", "fne_std"):
        t = stats.get(name)
        if t is None or not t.is_floating_point() or [*t.shape] != width or not bool(torch.isfinite(t).all()):
            shape = None if t is None else [*t.shape]
            raise UserError(f"{where}: {name} is not a finite float vector of the feature width {width} "
                            f"(shape {shape})")
    std = stats["fne_std"]
    if not bool((std >= 0).all()) or not bool((std > 0).any()):
        raise UserError(f"{where}: fne_std is negative somewhere or zero everywhere (a new image's features "
                        "would all be 0)")
    return stats["fne_mean"].numpy(), stats["fne_std"].numpy(), (float(thresholds[0]), float(thresholds[1]))


def load_model_folder(folder: str | os.PathLike, checkpoint: str = "best", device: str = "auto"
                      ) -> SharedModel:
    """Rebuild the model of a folder written by :func:`export_model` (no pickle is read).

    ``checkpoint`` must be ``best`` (the folder holds one set of weights: the exported checkpoint).
    """
    folder = Path(folder)
    if checkpoint != "best":
        raise UserError(f"{folder}: a model folder holds one set of weights (the exported checkpoint); "
                        f"--checkpoint {checkpoint} does not apply")
    meta = read_model_json(folder)
    settings = settings_from_config(meta["settings"])
    if model_spec(settings).text_input != meta["text_input"]:
        raise UserError(f"{folder / MODEL_JSON}: text_input {meta['text_input']!r} is not the one of family "
                        f"'{settings.family}'")
    if meta["features"]["key"] == "fne":
        read_fne_featurizer(folder, meta)
    tensors = _read_tensors(folder, WEIGHTS, meta)  # its SHA-256 first, then the model of bounded size
    model = build_model(settings, meta["vocab_size"], meta["feature_shape"])
    check_model_state(model, tensors, str(folder / WEIGHTS))
    model.load_state_dict(tensors)
    dev = resolve_device(device)
    model.to(dev).eval()
    vocab = meta["vocabulary"]
    table = Vocabulary(symbols=list(vocab["symbols"]), min_count=vocab["min_count"],
                       lowercase=vocab["lowercase"], pad=vocab["pad"], unk=vocab["unk"])
    codec = TextCodec(vocab["kind"], table, vocab["max_len"], vocab["word_length"], vocab["lang"])
    source = meta.get("source") if isinstance(meta.get("source"), dict) else {}
    epoch = source.get("epoch") if isinstance(source.get("epoch"), int) else 0
    return SharedModel(run_dir=folder, settings=settings, config=meta, model=model, device=dev,
                       checkpoint="model", epoch=epoch, shared_codec=codec)


@dataclass
class SharedModel(LoadedRun):
    """A model read from an export-model folder: a :class:`train.retrieval.loaded.LoadedRun` for evaluation
    and
    queries, whose vocabulary and featurizer come from ``model.json``, not from the training data."""

    shared_codec: TextCodec | None = field(default=None, repr=False)

    @property
    def codec(self) -> TextCodec:
        """The recorded text vocabulary and limits."""
        assert self.shared_codec is not None
        return self.shared_codec

    @property
    def dataset(self) -> Any:
        """The prepared dataset the settings name, when it is on this machine."""
        data = self.settings.data
        if self._dataset is None and (not data or not Path(data).exists()):
            raise UserError(f"{self.run_dir}: the model's prepared dataset ({data}) is not on this machine; "
                            "rank your own collection with --data DIR --features STORE")
        return LoadedRun.dataset.fget(self)  # type: ignore[attr-defined]

    def feature_store_config(self) -> dict[str, Any]:
        """The extractor configuration of the store the model was trained on (recorded)."""
        return dict(self.config["features"]["store"])

    def encode_images(self, paths: list[str | os.PathLike]) -> torch.Tensor:
        """Image embeddings (N, d) of image files, featurized from the recorded extractor configuration."""
        if self._featurizer is None:
            self._featurizer = model_featurizer(self, str(self.device))
        rows, failures = self._featurizer(list(paths))
        if failures:
            raise UserError(f"{failures[0]['path']}: cannot use this image: {failures[0]['reason']}")
        return embed_images(self.model, torch.from_numpy(rows), self.device, amp=self.settings.amp)


def model_featurizer(model: SharedModel, device: str = "cpu") -> Featurizer:
    """The featurizer of a model folder's query images (:class:`features.featurize.Featurizer`): the
    network, crops and sizes of its recorded store configuration, the weights checked by SHA-256, and for a
    Full-Network Embedding the statistics and thresholds of ``featurizer.safetensors`` (checked before any
    network is loaded)."""
    spec, config = model.config["features"], model.config["features"]["store"]
    code = read_fne_featurizer(model.run_dir, model.config) if spec["key"] == "fne" else None
    return Featurizer(config, spec["key"], model.config["feature_shape"], str(resolve_device(device)), code,
                      source=f"{model.run_dir / MODEL_JSON}: features.store")


def is_model_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a model folder written by ``train export-model`` (not a run directory)."""
    path = Path(path)
    return (path / MODEL_JSON).is_file() and not (path / CONFIG).exists()
