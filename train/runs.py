"""Run directories: their configuration, the checks before a run starts or resumes, and reading back.

The layout, the marker and what train may replace belong to :class:`train.rundir.RunDir`.
:func:`load_run` rebuilds a trained model from such a folder; :func:`embed_split` and
:func:`encode_texts` embed a split or arbitrary texts with it (the evaluation commands use them).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from features.spec import FeatureSpec
from prep.dataset import CHARS_FILE, DATASET_FILE, WORDS_FILE, PreparedDataset
from train.checkpoint import check_model_state, load_checkpoint
from train.data import (
    CaptionSet,
    TextCodec,
    codec_for,
    load_caption_set,
    read_features,
    read_region_counts,
)
from train.inference import embed_caption_set, embed_codes
from train.models.family import families_with_key, model_spec, train_settings
from train.rundir import CONFIG, RunDir
from train.settings import ClassifySection, TrainSection
from vsecore import console
from vsecore.device import resolve_device
from vsecore.errors import UserError
from vsecore.io import read_text, sha256_file, write_json_atomic

#: settings that may change when a run resumes: where it runs and how long it may go on
RESUMABLE_CHANGES = ("out", "device", "workers", "epochs", "checkpoint_every")


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


def run_inputs(run_dir: str | os.PathLike, config: dict[str, Any] | None = None) -> list[str]:
    """What a reader of the run reads, which its outputs may not replace: the run's prepared dataset
    and feature store (its ``config.json`` and checkpoints: :meth:`train.rundir.RunDir.check_eval_output`).
    ``run_dir`` may be a model folder of ``train export-model`` (its ``model.json`` names them)."""
    if config is None and is_model_folder(run_dir):
        from train.model_export import read_model_json

        config = read_model_json(Path(run_dir))
    if config is None:
        try:
            config = read_config(run_dir)
        except UserError:  # not a run: loading it says so
            return []
    settings = config.get("settings", {})
    features = settings.get("features")
    store = store_path(features) if isinstance(features, str) else None
    return [v for v in (settings.get("data"), store) if v]


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
    text = read_text(path, f"a run's configuration ({CONFIG})", missing=f"no run at {run_dir} (no {CONFIG})")
    try:
        config = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UserError(f"{path}: invalid JSON: {getattr(exc, 'msg', 'nested too deeply')}") from None
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
    if config.get("task") == "classify":
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
    return config


def classify_settings_from_config(values: dict[str, Any]) -> ClassifySection:
    """The :class:`train.settings.ClassifySection` of a classification run's ``config.json`` settings
    (the options of encoders other than the run's are dropped, as written with their defaults)."""
    encoder = values.get("encoder")
    return ClassifySection.model_validate(
        {k: v for k, v in values.items()
         if k not in ClassifySection.encoder_keys or encoder in ClassifySection.encoder_keys[k]})


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
    """The parts of a run's config that must not change on ``--resume``, flattened to dotted keys."""
    family = config["settings"].get("family")
    out = {f"settings.{k}": v for k, v in config["settings"].items()
           if k not in RESUMABLE_CHANGES and not _other_familys(k, family)}
    out["vocab_size"], out["feature_shape"] = model_sizes(config)
    for key, value in (config.get("fingerprints") or {}).items():
        out[f"fingerprints.{key}"] = value
    return out


def model_sizes(config: dict[str, Any]) -> tuple[int, list[int]]:
    """``(vocab_size, feature_shape)`` of a run's config (runs before word and region models wrote
    ``alphabet_size`` and ``image_dim``)."""
    vocab = config.get("vocab_size", config.get("alphabet_size"))
    shape = config.get("feature_shape") or [config.get("image_dim")]
    return int(vocab), [int(v) for v in shape]


def check_same_config(run_dir: Path, new: dict[str, Any]) -> None:
    """A :class:`UserError` naming the first key where ``new`` differs from the run's ``config.json``."""
    old = read_config(run_dir)
    a, b = comparable(old), comparable(json.loads(json.dumps(new)))
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            raise UserError(f"{run_dir}: cannot resume: {key} was {a.get(key)!r}, now {b.get(key)!r} "
                            "(resume with the run's settings, or start a new run with another --out)")


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool,
                    inputs: tuple[str | os.PathLike | None, ...] = ()) -> None:
    """Check (and with ``overwrite`` clear what the old run wrote in) ``run_dir`` before a run starts or
    resumes (:meth:`train.rundir.RunDir.prepare`)."""
    RunDir(run_dir).prepare(resume=resume, overwrite=overwrite, inputs=inputs)


def write_config(run_dir: Path, config: dict[str, Any]) -> None:
    """Write ``config.json`` atomically."""
    write_json_atomic(run_dir / CONFIG, config)


@dataclass
class Embeddings:
    """Embeddings of a split: caption ``k`` describes image row ``caption_image[k]``."""

    images: torch.Tensor  # (N, d) float32
    captions: torch.Tensor  # (M, d) float32
    caption_image: torch.Tensor  # (M,) int64, row in ``images``
    texts: list[str]
    imgids: np.ndarray  # (N,) int64, the prepared imgid of each image row


@dataclass
class LoadedRun:
    """A trained model read back from a run directory, with what it needs to embed new data."""

    run_dir: Path
    settings: TrainSection
    config: dict[str, Any]
    model: torch.nn.Module
    device: torch.device
    checkpoint: str
    epoch: int
    _dataset: PreparedDataset | None = field(default=None, repr=False)
    _features: tuple[Any, np.ndarray] | None = field(default=None, repr=False)
    _featurizer: Any = field(default=None, repr=False)
    _counts: np.ndarray | None = field(default=None, repr=False)
    #: use the run even when its dataset or features changed since training (a warning, not an error)
    accept_changed: bool = False

    def _changed(self, what: str, names: list[str], where: str) -> None:
        """Refuse (or with :attr:`accept_changed` warn about) inputs that differ from the run's record."""
        if not names:
            return
        text = (f"{self.run_dir}: the run's {what} changed since it was trained: {', '.join(names)} in "
                f"{where} differ from the fingerprints in {CONFIG}")
        if not self.accept_changed:
            raise UserError(f"{text}; train again on it, or add {ACCEPT_CHANGED} to use it anyway")
        console.warning(f"warning: {text} ({ACCEPT_CHANGED}: the results may be meaningless)")

    @property
    def dataset(self) -> PreparedDataset:
        """The prepared dataset the run was trained on (loaded on first use)."""
        if self._dataset is None:
            if not self.settings.data:
                raise UserError(f"{self.run_dir}: the run's config names no prepared dataset")
            self._changed("prepared dataset", changed_dataset_files(self.config, self.settings.data),
                          self.settings.data)
            self._dataset = PreparedDataset.load(self.settings.data)
        return self._dataset

    @property
    def features(self) -> tuple[Any, np.ndarray]:
        """``(x (N, *feature_shape), valid (N,) bool)`` of the run's feature store (read on first use; ``x``
        in the stored dtype, or read a batch at a time when large: :func:`train.data.read_features`)."""
        if self._features is None:
            if not self.settings.features:
                raise UserError(f"{self.run_dir}: the run's config names no feature store")
            x, valid = read_features(self.settings.features, self.dataset)
            recorded = (self.config.get("fingerprints") or {}).get("features")
            if recorded is not None and features_fingerprint(x, valid) != recorded:
                self._changed("features", ["the feature matrix"], self.settings.features)
            self._features = (x, valid)
            self._counts = read_region_counts(self.settings.features)
        return self._features

    @property
    def region_counts(self) -> np.ndarray | None:
        """``(N,)`` real regions per image of a region store with ``counts``, else None."""
        self.features  # noqa: B018 - reads the store once
        return self._counts

    @property
    def codec(self) -> TextCodec:
        """How the run's text encoder reads captions (its family's text input and the run's limits)."""
        return codec_for(self.settings, self.dataset, model_spec(self.settings).text_input)

    def feature_store_config(self) -> dict[str, Any]:
        """The ``config`` attribute of the run's feature store: how its rows were extracted."""
        from features.store import FeatureStore
        from features.store_read import parse_spec

        return dict(FeatureStore(parse_spec(self.settings.features)[0]).attrs.get("config", {}))

    def encode_text(self, texts: list[str]) -> torch.Tensor:
        """Caption embeddings (M, d) of arbitrary texts (see :func:`encode_texts`)."""
        return encode_texts(self, list(texts))

    def encode_images(self, paths: list[str | os.PathLike]) -> torch.Tensor:
        """Image embeddings (N, d) of image files, featurized exactly as the run's feature store.

        An image that cannot be read is a :class:`UserError` naming it.
        """
        from features.featurize import StoreFeaturizer
        from train.inference import embed_images

        if self._featurizer is None:
            self._featurizer = StoreFeaturizer(self.settings.features, str(self.device))
        rows, failures = self._featurizer(list(paths))
        if failures:
            raise UserError(f"{failures[0]['path']}: cannot use this image: {failures[0]['reason']}")
        return embed_images(self.model, torch.from_numpy(rows), self.device, amp=self.settings.amp)

    def search(self, text: str | list[str] | None = None, image: str | list[str] | None = None, top: int = 5,
               split: str | None = "test", data: str | os.PathLike | None = None,
               features: str | None = None) -> list:
        """Ranked images for text queries or captions for image queries (:func:`train.query.search`);
        ``data`` and ``features`` search another prepared dataset's images with its feature store."""
        from train.query import search

        return search(self, text=text, image=image, top=top, split=split, data=data, features=features)

    def caption_set(self, split: str, lang: str | None = None) -> CaptionSet:
        """The whole ``split`` in ``lang`` (default: the run's), all its images (not the val subset)."""
        x, valid = self.features
        return load_caption_set(self.dataset, x, valid, split, lang or self.settings.lang,
                                self.settings.max_chars,
                                codec=self.codec, counts=self.region_counts)


def load_run(run_dir: str | os.PathLike, checkpoint: str = "best", device: str = "auto") -> LoadedRun:
    """Rebuild the model of ``run_dir`` from ``checkpoints/<checkpoint>.pt`` (``best`` or ``last``).

    The run's dataset and features are checked against the fingerprints of its ``config.json`` when
    first read: a change is a :class:`UserError` naming it, or a warning once ``accept_changed`` is set
    on the returned run.

    A ``train classify`` run gives a :class:`train.classify.ClassificationRun` (``predict``,
    ``probabilities``, ``evaluate``) instead.
    """
    from train.models.vse import build_model

    run_dir = Path(run_dir)
    if is_model_folder(run_dir):  # a model made for sharing (train export-model)
        from train.model_export import load_model_folder

        return load_model_folder(run_dir, checkpoint, device)
    path = RunDir(run_dir).checkpoint(checkpoint)
    if read_config(run_dir).get("task") == "classify":
        from train.classify import load_classification_run

        return load_classification_run(run_dir, checkpoint, device)  # type: ignore[return-value]
    config = read_config(run_dir)
    settings = settings_from_config(config["settings"])
    dev = resolve_device(device)
    state = load_checkpoint(path, map_location="cpu")
    vocab_size, feature_shape = model_sizes(config)
    model = build_model(settings, vocab_size, feature_shape)
    check_model_state(model, state["model"], str(path))
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        first = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
        raise UserError(f"{path} does not fit the model this code builds "
                        f"(trained with code {config.get('code_version', '?')}): {first}") from None
    model.to(dev).eval()
    return LoadedRun(run_dir=run_dir, settings=settings, config=config, model=model, device=dev,
                     checkpoint=checkpoint, epoch=int(state["epoch"]))


def is_model_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a model folder written by ``train export-model`` (not a run directory)."""
    from train.model_export import MODEL_JSON

    path = Path(path)
    return (path / MODEL_JSON).is_file() and not (path / CONFIG).exists()


def embed_split(run: LoadedRun, split: str, texts: list[str] | None = None, lang: str | None = None
                ) -> Embeddings:
    """Embed the images and captions of ``split`` in ``lang`` (default: the run's) with the run's model.

    ``texts``, when given, replace the split's captions one for one (same count and order as
    ``embed_split(run, split).texts``), e.g. with characters replaced for the noise analysis.
    """
    cs = run.caption_set(split, lang)
    if texts is None:
        images, captions = embed_caption_set(run.model, cs, run.device, amp=run.settings.amp)
        texts_out = cs.texts
    else:
        if len(texts) != len(cs):
            raise UserError(f"{len(texts)} texts given for split '{split}', which has {len(cs)} captions")
        images, _ = embed_caption_set(run.model, _no_captions(cs), run.device, amp=run.settings.amp)
        captions = encode_texts(run, texts)
        texts_out = list(texts)
    return Embeddings(images=images, captions=captions, caption_image=torch.from_numpy(cs.caption_image),
                      texts=texts_out, imgids=cs.imgids)


def _no_captions(cs: CaptionSet) -> CaptionSet:
    return CaptionSet(split=cs.split, lang=cs.lang, images=cs.images, imgids=cs.imgids, codes=cs.codes[:0],
                      offsets=cs.offsets[:1], caption_image=cs.caption_image[:0], texts=[],
                      skipped_images=cs.skipped_images, codec=cs.codec)


def encode_texts(run: LoadedRun, texts: list[str]) -> torch.Tensor:
    """Embed arbitrary texts with the run's text encoder: (M, d) float32 on the CPU.

    Texts are encoded as the run's captions were (characters, or words tokenized as ``prep`` does).
    """
    codec = run.codec
    return embed_codes(run.model, codec.encode_texts(texts), codec, run.device, amp=run.settings.amp)
