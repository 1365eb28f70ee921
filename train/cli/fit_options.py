"""The command-line options of ``train <family>``: each family's own (generated from the fields of its
config, :func:`family_options`), the common ones, and the defaults ``--help`` shows, taken from the
settings the family resolves (what a run records). The families' declarations import no torch, so neither
does ``train <family> --help``."""

from __future__ import annotations

import argparse

from train.engine.settings import DRY_RUN_ALPHABET, DRY_RUN_IMAGE_DIM, DRY_RUN_VOCABULARY, TrainSection
from train.models.family import get_family, train_settings, with_family_defaults
from vsecore.options import add_overwrite_option, add_pipeline_arguments, field_option, show_defaults


def family_options(group: argparse._ActionsContainer, family: str) -> None:
    """The options of ``train <family>`` that only it takes: one per field of its config (in declaration
    order, the config's own before those it inherits), then the common fields it offers in its own group
    (:attr:`train.models.family.Family.common_options`)."""
    declared = get_family(family)
    fields = declared.config.model_fields
    own = [name for name in vars(declared.config).get("__annotations__", {}) if name in fields]
    for name in [*own, *(name for name in fields if name not in own)]:  # its own first, then inherited
        field_option(group, name, fields[name])
    for name in declared.common_options:
        field_option(group, name, TrainSection.model_fields[name])


#: the common settings' option groups of ``train <family>``, in ``--help`` order: every field of
#: ``TrainSection`` (but ``family``) is in one group, or offered by the families that use it in their own
#: group (:attr:`train.models.family.Family.common_options`). The options that are not settings follow in
#: the run group (:func:`_run_options`).
COMMON_GROUPS: dict[str, tuple[str, ...]] = {
    "data": ("data", "features", "lang", "max_chars", "captions_per_epoch"),
    "model and loss": ("d", "measure", "order_sqrt", "loss", "margin"),
    "optimisation": ("batch_size", "lr", "lr_decay_patience", "lr_schedule", "lr_step", "early_stop",
                     "epochs", "grad_clip", "seed"),
    "validation": ("val_protocol", "val_images"),
    "run": ("out", "checkpoint_every", "device", "amp", "workers", "compile", "cuda_graphs"),
}
#: common fields no group lists: only the families that read words offer them (seam, vse, clmr; liwe
#: ``max_words``)
FAMILY_OFFERED = ("max_words", "min_word_count")


def _check_groups() -> None:
    placed = [name for names in COMMON_GROUPS.values() for name in names]
    fields = set(TrainSection.model_fields) - {"family"}
    missing, unknown = fields - set(placed) - set(FAMILY_OFFERED), set(placed) - fields
    if missing or unknown or len(placed) != len(set(placed)):
        raise RuntimeError(f"COMMON_GROUPS is out of date: without an option {sorted(missing)}, not a common "
                           f"setting {sorted(unknown)}")


_check_groups()


def common_options(p: argparse.ArgumentParser) -> None:
    """The options every ``train <family>`` takes: one per common setting (:data:`COMMON_GROUPS`, generated
    like a family's own by :func:`field_option`), then those that are not settings (``--resume``,
    ``--overwrite``, ``--dry-run`` and its sizes, ``--pipeline``)."""
    fields = TrainSection.model_fields
    groups = {title: p.add_argument_group(title) for title in COMMON_GROUPS}
    for title, names in COMMON_GROUPS.items():
        for name in names:
            field_option(groups[title], name, fields[name])
    _run_options(groups["run"])
    add_pipeline_arguments(p)


def _run_options(group: argparse._ArgumentGroup) -> None:
    """The run group's options that are not settings."""
    group.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its newest checkpoint, also one written "
                            "mid-epoch")
    add_overwrite_option(group, "start over in an --out that already holds a run: the files the run wrote "
                                "are deleted; a folder holding anything else is refused")
    group.add_argument("--dry-run", dest="dry_run", action="store_true",
                       help="build the model, print its parameter counts per part and exit")
    group.add_argument("--alphabet-size", dest="alphabet_size", type=int, default=None,
                       help=f"character alphabet size for --dry-run without --data (default "
                            f"{DRY_RUN_ALPHABET})")
    group.add_argument("--vocab-size", dest="vocab_size", type=int, default=None,
                       help=f"word vocabulary size for --dry-run of a word model without --data (default "
                            f"{DRY_RUN_VOCABULARY})")
    group.add_argument("--image-dim", dest="image_dim", type=int, default=None,
                       help=f"image feature dimension for --dry-run without --features (default "
                            f"{DRY_RUN_IMAGE_DIM})")


#: options whose value is not a setting a run records (or has no single default)
NOT_SETTINGS = ("out", "family", "data", "features", "pipeline", "pipelines")


def resolved_defaults(family: str) -> TrainSection:
    """The settings a run of ``family`` records for every option not given (schema defaults, then the
    family's own defaults, without a dataset: the vse ``--kind`` preset shows COCO's column)."""
    return with_family_defaults(train_settings(family=family, out="RUN_DIR"), None)


def show_resolved_defaults(parser: argparse.ArgumentParser, family: str) -> None:
    """Rewrite each setting's "(default ...)" in ``--help`` from :func:`resolved_defaults`, so the help
    and a run's ``config.json`` read one source (a family default shows as that family's value)."""
    show_defaults(parser, resolved_defaults(family), get_family(family).help_notes, skip=NOT_SETTINGS)
