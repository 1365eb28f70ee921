"""A run's configuration: its ``config.json``, the checks before a run starts or resumes, and reading back.

The layout, the marker and what train may replace belong to :class:`train.run.layout.RunDir` (below the
engine, which writes the files); this module sits above the models, which it rebuilds from a run's settings.
For a retrieval and a classification run alike, :func:`check_same_config` is the one comparison a
``--resume`` makes, and :func:`rebuild_model` the one way a trained model comes back from its settings and
checkpoint (:func:`train.retrieval.loaded.load_run_directory`,
:func:`train.classification.run.load_classification_run`). The commands read it when they parse (``--resume``
reads a run's settings; :data:`ACCEPT_CHANGED` is a flag), so torch loads only where a model is built.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from features.store.spec import FeatureSpec
from prep.dataset import CHARS_FILE, DATASET_FILE, WORDS_FILE
from train.engine.settings import ClassifySection, TrainSection, first_non_finite
from train.models.classifier import classify_settings, encoder_keys
from train.models.family import families_with_key, get_family, train_settings
from train.run.layout import CONFIG, RunDir
from vsecore import console
from vsecore.errors import UserError
from vsecore.io import sha256_file
from vsecore.jsonfile import read_json

if TYPE_CHECKING:
    import torch

#: the ``task`` of a classification run's config.json (a retrieval run has none)
CLASSIFY_TASK = "classify"
#: settings that may change when a run resumes: where it runs, how long it may go on, and how a step runs
#: (``compile``, ``cuda_graphs``: never what it computes); the new values are recorded in its config.json
RESUMABLE_CHANGES = ("out", "device", "workers", "epochs", "checkpoint_every", "compile", "cuda_graphs")


def default_run_dir(family: str) -> str:
    """``runs/<family>-<YYYYmmdd-HHMMSS>`` (local time)."""
    return f"runs/{family}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def dataset_fingerprint(data: str | os.PathLike) -> dict[str, str]:
    """SHA-256 of the prepared ``dataset.json`` and ``chars.json`` (what a character model reads)."""
    root = Path(data)
    return {"dataset_json": sha256_file(root / DATASET_FILE), "chars_json": sha256_file(root / CHARS_FILE)}


#: the files of a prepared dataset whose SHA-256 a run records, by fingerprint key
DATASET_FILES = {"dataset_json": DATASET_FILE, "chars_json": CHARS_FILE, "words_json": WORDS_FILE}
#: the flag that lets a reader use a run whose inputs changed since training (with a warning)
ACCEPT_CHANGED = "--accept-changed-inputs"


def file_stats(data: str | os.PathLike, keys: list[str]) -> dict[str, list[int]]:
    """``{key: [size, mtime_ns]}`` of the dataset files of ``keys``: a reader whose files still have
    these skips re-hashing them (:func:`changed_dataset_files`)."""
    out = {}
    for key in keys:
        st = (Path(data) / DATASET_FILES[key]).stat()
        out[key] = [st.st_size, st.st_mtime_ns]
    return out


def changed_dataset_files(config: dict[str, Any], data: str | os.PathLike) -> list[str]:
    """The dataset files recorded in ``config``'s fingerprints that differ on disk now (their names).

    A file whose size and modification time are those recorded at training time is the same file
    (no hashing: a reader runs this every time); otherwise a different size settles it, else the
    SHA-256 is compared.
    """
    fingerprints = config.get("fingerprints") or {}
    stats = config.get("fingerprint_stats") or {}
    changed = []
    for key, name in DATASET_FILES.items():
        if key not in fingerprints:
            continue
        path = Path(data) / name
        try:
            st = path.stat()
        except OSError:
            changed.append(f"{name} (missing)")
            continue
        recorded = stats.get(key)
        if recorded == [st.st_size, st.st_mtime_ns]:
            continue
        if (recorded and recorded[0] != st.st_size) or sha256_file(path) != fingerprints[key]:
            changed.append(name)
    return changed


def features_fingerprint(x: Any, valid: np.ndarray) -> str:
    """SHA-256 of the matrix shape, the valid mask and about 1024 evenly spaced rows.

    Sampling rows keeps this cheap on a 6 GB FNE matrix (or a 15 GB region store read on demand,
    :class:`features.rows.StoreRows`: the same bytes) while any re-extraction, other network or other
    row order still changes it. ``x``: ``(N, *feature_shape)``.
    """
    h = hashlib.sha256(f"{x.shape}".encode())
    h.update(np.ascontiguousarray(valid).tobytes())
    step = max(1, x.shape[0] // 1024)
    h.update(np.ascontiguousarray(x[::step]).tobytes())
    return h.hexdigest()


def store_path(features: str | None) -> str | None:
    """The store folder of a ``STORE[:global|:fne|:regions]`` spec (None for None)."""
    if not features:
        return None
    return str(FeatureSpec.parse(features).store)


def absolute_settings(settings: TrainSection) -> TrainSection:
    """A copy with ``data``, ``features`` (its store part) and ``out`` made absolute."""
    update: dict[str, Any] = {"out": os.path.abspath(settings.out)}
    if settings.data:
        update["data"] = os.path.abspath(settings.data)
    if settings.features:
        spec = FeatureSpec.parse(settings.features)
        update["features"] = str(FeatureSpec(Path(os.path.abspath(spec.store)), spec.key))
    return settings.model_copy(update=update)


def read_config(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of a run directory (a :class:`UserError` if it is not one)."""
    path = RunDir(run_dir).config
    config = read_json(path, f"a run's configuration ({CONFIG})",
                       missing=f"no run at {run_dir} (no {CONFIG})")
    return validate_config(config, path)


#: bounds of the model sizes a config.json may ask for (a hostile file must not allocate terabytes)
MAX_VOCAB_SIZE = 10_000_000
MAX_FEATURE_DIM = 1_000_000


def validate_config(config: Any, path: str | os.PathLike) -> dict[str, Any]:
    """``config`` if it is a run's ``config.json`` content, else a one-line :class:`UserError` (``path``).

    The settings go through the schema a new run is validated with (:func:`settings_from_config`);
    the model sizes must be positive integers within :data:`MAX_VOCAB_SIZE` / :data:`MAX_FEATURE_DIM`.
    """
    from pydantic import ValidationError

    if not isinstance(config, dict) or not isinstance(config.get("settings"), dict):
        raise UserError(f"{path}: not a run configuration (no 'settings' object)")
    if config.get("task") == CLASSIFY_TASK:
        return _validate_classify_config(config, path)
    try:
        settings = settings_from_config(config["settings"])
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise UserError(f"{path}: settings.{loc}: {err['msg']}") from None
    if config.get("family", settings.family) != settings.family:
        raise UserError(f"{path}: family {config.get('family')!r} differs from settings.family")
    vocab = config.get("vocab_size", config.get("alphabet_size"))
    shape = config.get("feature_shape") or [config.get("image_dim")]
    if not _count(vocab, MAX_VOCAB_SIZE):
        raise UserError(f"{path}: vocab_size {vocab!r} is not an integer from 1 to {MAX_VOCAB_SIZE:,}")
    if not isinstance(shape, list) or not 1 <= len(shape) <= 3 or not all(_count(v, MAX_FEATURE_DIM)
                                                                           for v in shape):
        raise UserError(f"{path}: feature_shape {shape!r} is not 1 to 3 integers from 1 to "
                        f"{MAX_FEATURE_DIM:,}")
    for key in ("fingerprints", "parameters", "data"):
        if not isinstance(config.get(key, {}), dict):
            raise UserError(f"{path}: '{key}' is not an object")
    _check_fingerprints(config, path)
    check_model_size(settings, vocab, shape, path)
    return config


def check_model_size(settings: TrainSection, vocab_size: int, feature_shape: list[int],
                     path: str | os.PathLike) -> int:
    """The number of parameters (and buffer values) of the model ``settings`` build, counted on PyTorch's
    ``meta`` device (no memory is allocated), or a one-line :class:`UserError` naming ``path``: a float
    setting that is not finite, settings that build no model, or more than :data:`MAX_PARAMETERS`."""
    if (bad := first_non_finite(settings)) is not None:
        raise UserError(f"{path}: settings.{bad[0]}: {bad[1]} is not a finite number")
    import torch

    from train.models.joint import build_model  # start-up: torch only when a model is counted or rebuilt
    from train.run.checkpoint import MAX_PARAMETERS  # start-up: torch only when a model is counted

    try:
        with torch.device("meta"), _no_initialisation():
            model = build_model(settings, vocab_size, feature_shape)
    except (ArithmeticError, ValueError, TypeError, RuntimeError) as exc:
        raise UserError(f"{path}: the settings, vocab_size {vocab_size} and feature_shape {feature_shape} "
                        f"build no model ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
    count = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    if count > MAX_PARAMETERS:
        sizes = ("d", *get_family(settings.family).config.model_fields)
        named = ", ".join(f"{k} {getattr(settings, k):g}" for k in sizes
                          if isinstance(getattr(settings, k), int | float)
                          and not isinstance(getattr(settings, k), bool))
        raise UserError(f"{path}: settings ({named}), vocab_size {vocab_size} and feature_shape "
                        f"{feature_shape} describe a model of {count:,} parameters, more than the "
                        f"{MAX_PARAMETERS:,} this toolkit builds")
    return count


def _no_initialisation() -> Any:
    """A torch function mode in which in-place operations on ``meta`` tensors (a module's initialisation) do
    nothing: some of them (``normal_``) would import torch's compiler, seconds, to compute nothing."""
    import torch
    from torch.overrides import TorchFunctionMode

    class NoInitialisation(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
                               ) -> Any:
            name = getattr(func, "__name__", "")
            target = args[0] if args else (kwargs or {}).get("tensor")
            in_place = name.endswith("_") and not name.endswith("__")
            if in_place and isinstance(target, torch.Tensor) and target.is_meta:
                return target
            return func(*args, **(kwargs or {}))

    return NoInitialisation()


def _check_fingerprints(config: dict[str, Any], path: str | os.PathLike) -> None:
    """``fingerprints``: names -> SHA-256 strings; ``fingerprint_stats``: names -> ``[size, mtime_ns]``."""
    fingerprints = config.get("fingerprints") or {}
    if not all(isinstance(v, str) for v in fingerprints.values()):
        raise UserError(f"{path}: 'fingerprints' holds a value that is not a checksum string")
    stats = config.get("fingerprint_stats")
    if stats is None:
        return
    if not isinstance(stats, dict) or not all(isinstance(v, list) and len(v) == 2 and all(
            isinstance(n, int) and not isinstance(n, bool) for n in v) for v in stats.values()):
        raise UserError(f"{path}: 'fingerprint_stats' is not an object of [size, mtime_ns] pairs")


def classify_settings_from_config(values: dict[str, Any]) -> ClassifySection:
    """The :class:`train.engine.settings.ClassifySection` of a classification run's ``config.json`` settings
    (the options of encoders other than the run's are dropped, as written with their defaults)."""
    encoder, keys = values.get("encoder"), encoder_keys()
    return classify_settings(**{k: v for k, v in values.items() if k not in keys or encoder in keys[k]})


def _validate_classify_config(config: dict[str, Any], path: str | os.PathLike) -> dict[str, Any]:
    from pydantic import ValidationError

    try:
        classify_settings_from_config(config["settings"])
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise UserError(f"{path}: settings.{loc}: {err['msg']}") from None
    vocab, labels = config.get("vocab_size"), config.get("labels")
    if not _count(vocab, MAX_VOCAB_SIZE):
        raise UserError(f"{path}: vocab_size {vocab!r} is not an integer from 1 to {MAX_VOCAB_SIZE:,}")
    if not (isinstance(labels, list) and 2 <= len(labels) <= MAX_VOCAB_SIZE
            and all(isinstance(x, str) for x in labels)):
        raise UserError(f"{path}: 'labels' is not a list of at least two label names")
    for key in ("fingerprints", "data"):
        if not isinstance(config.get(key, {}), dict):
            raise UserError(f"{path}: '{key}' is not an object")
    return config


def _count(value: Any, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most


def settings_from_config(values: dict[str, Any]) -> TrainSection:
    """The settings of a ``config.json``'s ``settings`` (all keys, as resolved), as its family's class.

    Runs written before each family had its own settings class hold every family's keys (``arch`` in a
    ``chain`` run, with its default); a family's settings refuse the others', so they are dropped here.
    """
    family = values.get("family")
    return train_settings(**{k: v for k, v in values.items() if not _other_familys(k, family)})


def _other_familys(key: str, family: Any) -> bool:
    """Whether ``key`` is a setting of families other than ``family`` only."""
    owners = families_with_key(key)
    return bool(owners) and family not in owners


def comparable(config: dict[str, Any]) -> dict[str, Any]:
    """The parts of a run's config that must not change on ``--resume``, flattened to dotted keys: the
    settings (but :data:`RESUMABLE_CHANGES`), the model's sizes and the fingerprints of the inputs. A
    retrieval run's settings of other families are left out (older runs hold them); a classification run's
    sizes are its vocabulary and labels."""
    settings = dict(config["settings"])
    if config.get("task") == CLASSIFY_TASK:
        settings.setdefault("train_noise", 0.0)  # a run from before --train-noise trained without
        out = {f"settings.{k}": v for k, v in settings.items() if k not in RESUMABLE_CHANGES}
        out.update({"vocab_size": config["vocab_size"], "labels": config["labels"]})
    else:
        family = settings.get("family")
        out = {f"settings.{k}": v for k, v in settings.items()
               if k not in RESUMABLE_CHANGES and not _other_familys(k, family)}
        out["vocab_size"], out["feature_shape"] = model_sizes(config)
    for key, value in (config.get("fingerprints") or {}).items():
        out[f"fingerprints.{key}"] = value
    return out


def rebuild_model(build: Callable[[], torch.nn.Module], path: Path, config: dict[str, Any],
                  device: torch.device) -> tuple[torch.nn.Module, int]:
    """The trained model of a run (a retrieval or a classification one) and the epoch of its checkpoint
    ``path``: ``build()`` makes the model from the run's settings and sizes (bounded by
    :func:`validate_config`), then every entry of the checkpoint and every tensor's name and shape are
    checked against it with the tensors only memory-mapped (:func:`train.run.checkpoint.load_checkpoint`),
    before any tensor is read; then the tensors are loaded, and the model moved to ``device`` in eval mode.
    """
    from train.run.checkpoint import load_checkpoint, load_model_state  # start-up: torch for a rebuild

    model = build()
    state = load_checkpoint(path, map_location="cpu", model=model)
    load_model_state(model, state["model"], path, config.get("code_version", "?"))
    return model.to(device).eval(), int(state["epoch"])


def model_sizes(config: dict[str, Any]) -> tuple[int, list[int]]:
    """``(vocab_size, feature_shape)`` of a run's config (runs before word and region models wrote
    ``alphabet_size`` and ``image_dim``)."""
    vocab = config.get("vocab_size", config.get("alphabet_size"))
    shape = config.get("feature_shape") or [config.get("image_dim")]
    return int(vocab), [int(v) for v in shape]


def check_same_config(run_dir: Path, new: dict[str, Any]) -> None:
    """The one check of a ``--resume`` (a retrieval run's or a classification run's): a :class:`UserError`
    when the run's ``config.json`` is another task's, or naming the first key of :func:`comparable` where
    ``new`` (the config the resumed run would write) differs from it."""
    old = read_config(run_dir)
    if old.get("task") != new.get("task"):
        what = "a classification run" if new.get("task") == CLASSIFY_TASK else "a retrieval run"
        raise UserError(f"{run_dir}: cannot resume: not {what}")
    a, b = comparable(old), comparable(json.loads(json.dumps(new)))
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            raise UserError(f"{run_dir}: cannot resume: {key} was {a.get(key)!r}, now {b.get(key)!r} "
                            "(resume with the run's settings, or start a new run with another --out)")


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool,
                    inputs: tuple[str | os.PathLike | None, ...] = ()) -> None:
    """Check (and with ``overwrite`` clear what the old run wrote in) ``run_dir`` before a run starts or
    resumes (:meth:`train.run.layout.RunDir.prepare`): a new run writes nothing there until
    :func:`write_config` starts it."""
    RunDir(run_dir).prepare(resume=resume, overwrite=overwrite, inputs=inputs)


def write_config(run_dir: Path, config: dict[str, Any]) -> None:
    """Write ``config.json`` atomically; a new run's first write starts it, with its marker, in one step
    (:meth:`train.run.layout.RunDir.write_config`)."""
    RunDir(run_dir).write_config(config)


@contextlib.contextmanager
def run_log(run_dir: Path) -> Iterator[Callable[[], None]]:
    """Append every message to the run's ``train.log`` while the context is open, from the moment the run
    has started: at once for a run that resumes, and for a new one from the call of the yielded function,
    right after :func:`write_config` started it (before, a ``train.log`` would be a file in a folder that is
    no run yet: the data load's messages reach the terminal only)."""
    run = RunDir(run_dir)
    opened: list[Path] = []
    with contextlib.ExitStack() as stack:
        def start() -> None:
            if not opened:
                opened.append(stack.enter_context(console.log_file(run.log)))

        if run.has_started():
            start()
        yield start
