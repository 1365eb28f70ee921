"""The settings of ``features <kind>`` (the ``features:`` and ``regions:`` sections of ``pipelines.yaml``).

:class:`FeaturesSection` holds the stage's own settings, those of every kind: which kind, the prepared dataset
and the store, how blocks run (batch and block size, device, scheduler, workers, threads, failed images).
Each extractor declares its own (:mod:`features.extractors`); the stage's settings class is
:class:`FeaturesSection` + the union of the registered extractors' fields (:func:`features_settings_class`,
as ``TrainSection`` + a family's config), read by the stage (:mod:`features.run`), its options
(:mod:`features.cli`) and the pipeline schema (:mod:`pipelines.schema`). :func:`features_section` reads a
pipeline's ``features:`` (or ``regions:``) section, its ``data`` the ``prep`` stage's output unless given;
:func:`store_key` is the key a store of a kind is read by. Nothing here imports torch.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any, ClassVar, Literal

from pydantic import Field, SerializerFunctionWrapHandler, create_model, model_serializer

from features.extractors import BUILTIN_EXTRACTORS
from features.extractors.registry import Extractor, extractors, extractors_of_kind, get_extractor_of, kinds
from prep.settings import prep_section
from vsecore.device import DEVICE_HELP
from vsecore.pipelines_file import PipelineEntry
from vsecore.schema import Section


class FeaturesSection(Section):
    """The stage's own settings of ``features <kind>`` (every kind's); ``kind`` is the subcommand."""

    path_fields: ClassVar[tuple[str, ...]] = ("data", "out")
    kind: str = "cnn"
    data: str | None = Field(None, json_schema_extra={"metavar": "DIR"}, description=(
        "prepared dataset folder (written by `prep`); rows follow its image order"))
    out: str = Field(json_schema_extra={"metavar": "STORE.zarr"},
                     description="feature store to write (Zarr v3)")
    allow_download: bool = Field(False, json_schema_extra={"action": "store_true"},
                                 description="let torchvision/timm download missing pretrained weights")
    batch_size: int | None = Field(None, json_schema_extra={"metavar": "N"}, description=(
        "images per forward pass on CUDA (default 32); on the CPU every image is a forward pass of its own "
        "and N images are mapped between two progress updates (default 1)"))
    block_size: int = Field(256, json_schema_extra={"metavar": "N"}, description=(
        "rows per block: the unit of work, of resumption and of Zarr chunks; default 256"))
    device: str = Field("auto", description=DEVICE_HELP)
    amp: bool = Field(False, json_schema_extra={"action": "store_true"},
                      description="bf16 autocast on CUDA (faster; numbers differ slightly from fp32)")
    scheduler: str = Field("none", json_schema_extra={"metavar": "none|local|tcp://HOST:PORT"}, description=(
        "none (default): in this process; local: start a Dask LocalCluster of --workers processes; "
        "tcp://HOST:PORT: a running `dask scheduler` whose workers share the store's filesystem"))
    workers: int = Field(2, json_schema_extra={"metavar": "N"},
                         description="worker processes of --scheduler local (default 2)")
    threads: int | None = Field(None, json_schema_extra={"metavar": "N"}, description=(
        "torch threads of the network on the CPU, in this process and in every Dask worker (the same N gives "
        "bit-identical rows anywhere); default: all of torch's threads in-process, the CPU cores divided "
        "among --workers for local, 1 on a remote cluster"))
    decode_threads: int | None = Field(None, json_schema_extra={"metavar": "N"}, description=(
        "threads that read, decode and resize images on the host (default: the CPU count; for --scheduler "
        "local the CPU count divided among --workers; on a remote cluster each worker's CPU count)"))
    read_ahead: int = Field(1, json_schema_extra={"metavar": "N"}, description=(
        "blocks decoded ahead of the one the network maps, in this process (each held in memory meanwhile); "
        "default 1"))
    on_error: Literal["record", "fail"] = Field("record", description=(
        "record (default): unusable images are listed in the store and summary, their rows NaN with "
        "valid=False; fail: stop at the first one"))

    @model_serializer(mode="wrap")
    def _recorded_settings(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """What a section records (a pipeline stage's fingerprint is its dump): the stage's settings, every
        built-in extractor's (every section recorded them before extractors were registered, so the
        fingerprints pipelines recorded stay valid) and its own kind's extractors'; another kind's plugin
        settings only when set."""
        data = handler(self)
        keep = recorded_fields(self.kind)
        return {k: v for k, v in data.items() if k in keep or k in self.model_fields_set}


#: settings added after pipelines had recorded their sections: recorded only when set, so the fingerprints
#: recorded before them stay valid (their defaults are what those runs did)
RECORDED_WHEN_SET = ("decode_threads", "read_ahead", "decoder")


def recorded_fields(kind: str) -> set[str]:
    """The settings a section of ``kind`` records (:meth:`FeaturesSection._recorded_settings`)."""
    own = [e.config for e in (*BUILTIN_EXTRACTORS, *extractors_of_kind(kind))]
    return set(FeaturesSection.model_fields).union(*(config.model_fields for config in own)) - set(
        RECORDED_WHEN_SET)


#: the settings class of the registered extractors (rebuilt when the registry changes)
_UNION: tuple[tuple[Extractor, ...], type[FeaturesSection]] | None = None


def features_settings_class() -> type[FeaturesSection]:
    """:class:`FeaturesSection` + every registered extractor's fields, ``kind`` one of the registered
    kinds (a field several extractors declare is one setting: :func:`features.extractors.registry.
    register_extractor` checks that they agree)."""
    global _UNION
    registered = extractors()
    if _UNION is not None and _UNION[0] == registered:
        return _UNION[1]
    fields: dict[str, Any] = {}
    paths = list(FeaturesSection.path_fields)
    for extractor in registered:
        for name, info in extractor.config.model_fields.items():
            fields.setdefault(name, (info.annotation, copy.copy(info)))
        paths += [p for p in extractor.config.path_fields if p not in paths]
    cls = create_model("FeaturesSettings", __base__=FeaturesSection, __module__=__name__,
                       kind=(Literal[kinds()], "cnn"), **fields)  # type: ignore[valid-type]
    cls.path_fields = tuple(paths)
    _UNION = (registered, cls)
    return cls


def features_settings(**values: Any) -> FeaturesSection:
    """Validate ``values`` as the stage's settings (a pydantic ``ValidationError`` for a bad one)."""
    return features_settings_class().model_validate(values)


def implied_settings(settings: FeaturesSection, given: Collection[str]) -> FeaturesSection:
    """``settings`` with what the options ``given`` imply for its extractor
    (:attr:`features.extractors.registry.Extractor.command_line`: e.g. bounded region counts make the
    detector adaptive); the command and ``vse.extract`` both call it."""
    rule = get_extractor_of(settings).command_line
    return settings if rule is None else settings.model_copy(update=rule(settings, given))


def store_key(kind: str) -> str:
    """The key a store of ``kind`` is read by: the first key of its kind's first extractor (``global``,
    ``fne``, ``regions``)."""
    return extractors_of_kind(kind)[0].keys[0]


def features_section(entry: PipelineEntry, stage: str = "features") -> FeaturesSection | None:
    """A pipeline's ``features:`` section (or ``regions:``, a second feature stage), validated as the stage's
    settings (a one-line error naming the file, pipeline and key); ``data`` is the ``prep`` stage's output
    unless given. None when the pipeline has no such section."""
    def prepared() -> str | None:
        prep = prep_section(entry)
        return prep.out if prep is not None else None

    return entry.section(stage, features_settings, features_settings_class().path_fields, {"data": prepared})
