"""The command-line options of ``train <family>``: each family's own (generated from the fields of its
config, :func:`family_options`), the common ones, and the defaults ``--help`` shows, taken from the
settings the family resolves (what a run records)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from pipelines.schema import add_pipeline_arguments
from train.models.family import get_family, train_settings, with_family_defaults
from train.settings import TrainSection
from vsecore.device import DEVICE_HELP

#: defaults of --alphabet-size / --image-dim for a --dry-run without data (COCO's lowercased
#: alphabet is about 70 symbols; VGG fc7 features have 4096 dimensions)
DRY_RUN_ALPHABET = 72
DRY_RUN_IMAGE_DIM = 4096
#: default --vocab-size of a word model's --dry-run without data: the SEAM paper's COCO vocabulary
DRY_RUN_VOCABULARY = 11360


#: region rows of a --dry-run without --features: the paper's 36 BUTD regions of 2,048 dimensions
DRY_RUN_REGIONS = (36, 2048)


def _comma_list(kind: type) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            return [kind(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None

    return parse


def field_option(group: argparse._ActionsContainer, name: str, info: FieldInfo) -> None:
    """Add ``--name`` for the settings field ``name``: its type and choices from the annotation, its help
    from the description; ``default=None``, so a value not given comes from the pipeline or the schema
    (:func:`pipelines.schema.stage_settings`)."""
    help_text = (info.description or "").replace("%", "%%")  # argparse formats the help with %
    kwargs: dict[str, Any] = {"dest": name, "default": None, "help": help_text}
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "metavar" in extra:
        kwargs["metavar"] = extra["metavar"]
    kind = info.annotation
    if get_origin(kind) in (Union, UnionType):  # X | None: an option of type X
        kinds = [a for a in get_args(kind) if a is not type(None)]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif get_origin(kind) is Literal:
        kwargs["choices"] = get_args(kind)
        kwargs["type"] = type(get_args(kind)[0])
    elif get_origin(kind) is list:
        kwargs["type"] = _comma_list(get_args(kind)[0])
    elif kind in (int, float, str):
        kwargs["type"] = kind
    else:
        raise TypeError(f"setting {name!r}: no command-line option for the type {info.annotation!r}")
    group.add_argument("--" + name.replace("_", "-"), **kwargs)


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


def common_options(p: argparse.ArgumentParser) -> None:
    data = p.add_argument_group("data")
    data.add_argument("--data", metavar="PREPARED", default=None,
                      help="prepared dataset folder written by `prep` (required unless --pipeline gives it)")
    data.add_argument("--features", metavar="STORE[:global|:fne|:regions]", default=None,
                      help="feature store written by `features`, with the key of the features to use: "
                           "global or fne for chain/oecc/seam/vse (default: global if present, else fne), "
                           "regions for clmr/liwe")
    data.add_argument("--lang", default=None, help="language of the captions to train on (default en)")
    data.add_argument("--max-chars", dest="max_chars", type=int, default=None,
                      help="captions are cut to this many characters (default 256)")
    data.add_argument("--captions-per-epoch", dest="captions_per_epoch", choices=("all", "one"), default=None,
                      help="'all': every caption once per epoch (CHAIN-VSE, OECC, SEAM); 'one': one random "
                           "caption per image per epoch (FNE paper) (default all; vse one)")
    model = p.add_argument_group("model and loss")
    model.add_argument("--d", type=int, default=None, help="dimension of the joint embedding (default 1024)")
    model.add_argument("--measure", choices=("order", "cosine"), default=None,
                       help="similarity: order violation or cosine (default order)")
    model.add_argument("--order-sqrt", dest="order_sqrt", action=argparse.BooleanOptionalAction, default=None,
                       help="take the square root of the order violation, as the released code does "
                            "(default: the papers' squared form)")
    model.add_argument("--loss", choices=("sum", "max"), default=None,
                       help="sum of hinges over the contrastive examples, or the hardest only (default sum)")
    model.add_argument("--margin", type=float, default=None, help="contrastive margin alpha (default 0.05)")
    opt = p.add_argument_group("optimisation")
    opt.add_argument("--batch-size", dest="batch_size", type=int, default=None,
                     help="image-caption pairs per batch; the others are the contrastive examples "
                          "(default 128)")
    opt.add_argument("--lr", type=float, default=None, help="Adam learning rate (default 1e-3)")
    opt.add_argument("--lr-decay-patience", dest="lr_decay_patience", type=int, default=None,
                     help="divide the learning rate by 10 after this many epochs without a better "
                          "validation rsum (default 3)")
    opt.add_argument("--lr-schedule", dest="lr_schedule", choices=("plateau", "step", "constant"),
                     default=None,
                     help="plateau: /10 after --lr-decay-patience epochs without improvement; step: /10 "
                          "every --lr-step epochs; constant (default: plateau; seam step, vse constant)")
    opt.add_argument("--lr-step", dest="lr_step", type=int, default=None,
                     help="epochs between two /10 steps of --lr-schedule step (default 15)")
    opt.add_argument("--early-stop", dest="early_stop", type=int, default=None,
                     help="stop after this many epochs without a better validation rsum (default 10)")
    opt.add_argument("--epochs", type=int, default=None, help="maximum number of epochs (default 30)")
    opt.add_argument("--grad-clip", dest="grad_clip", type=float, default=None,
                     help="clip the gradient norm to this value; 0 disables (default 2.0)")
    opt.add_argument("--seed", type=int, default=None,
                     help="seed of initialisation and shuffling; on CPU a run is reproducible (default 0)")
    val = p.add_argument_group("validation")
    val.add_argument("--val-protocol", dest="val_protocol", choices=("1k", "5cv", "5k", "all"), default=None,
                     help="protocol of the per-epoch validation rsum (default all: every val image)")
    val.add_argument("--val-images", dest="val_images", type=int, default=None,
                     help="validate on the first N val images only (default: all)")
    run = p.add_argument_group("run")
    run.add_argument("--out", metavar="RUN_DIR", default=None,
                     help="run directory (default runs/<family>-<timestamp>)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in --out from its newest checkpoint, also one written mid-epoch")
    run.add_argument("--overwrite", action="store_true",
                     help="start over in an --out that already holds a run: the files the run wrote are "
                          "deleted; a folder holding anything else is refused")
    run.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, default=None,
                     help="also write checkpoints/last.pt every this many steps within an epoch "
                          "(default 200)")
    run.add_argument("--device", default=None, help=DEVICE_HELP)
    run.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                     help="bf16 autocast on CUDA (ignored on CPU) (default off)")
    run.add_argument("--workers", type=int, default=None,
                     help="worker processes that collate the batches (a DataLoader's; 0: in this "
                          "process)")
    run.add_argument("--dry-run", dest="dry_run", action="store_true",
                     help="build the model, print its parameter counts per part and exit")
    run.add_argument("--alphabet-size", dest="alphabet_size", type=int, default=None,
                     help=f"character alphabet size for --dry-run without --data (default "
                          f"{DRY_RUN_ALPHABET})")
    run.add_argument("--vocab-size", dest="vocab_size", type=int, default=None,
                     help=f"word vocabulary size for --dry-run of a word model without --data (default "
                          f"{DRY_RUN_VOCABULARY})")
    run.add_argument("--image-dim", dest="image_dim", type=int, default=None,
                     help=f"image feature dimension for --dry-run without --features (default "
                          f"{DRY_RUN_IMAGE_DIM})")
    add_pipeline_arguments(p)


#: a help text's own "(default ...)" note at its end, replaced by the resolved value
_DEFAULT_NOTE = re.compile(r"\s*\(default[^()]*(?:\([^()]*\)[^()]*)*\)\s*$")
#: options whose value is not a setting a run records (or has no single default)
NOT_SETTINGS = ("out", "family", "data", "features", "pipeline", "pipelines")


def shown(value: Any) -> str:
    """A setting as ``--help`` shows it: on/off, numbers as Python prints them, lists comma-separated."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) if value else "none"
    return str(value)


def resolved_defaults(family: str) -> TrainSection:
    """The settings a run of ``family`` records for every option not given (schema defaults, then the
    family's own defaults, without a dataset: the vse ``--kind`` preset shows COCO's column)."""
    return with_family_defaults(train_settings(family=family, out="RUN_DIR"), None)


def show_resolved_defaults(parser: argparse.ArgumentParser, family: str) -> None:
    """Rewrite each setting's "(default ...)" in ``--help`` from :func:`resolved_defaults`, so the help
    and a run's ``config.json`` read one source (a family default shows as that family's value)."""
    resolved = resolved_defaults(family)
    notes = get_family(family).help_notes
    for action in parser._actions:
        key = action.dest
        if key not in type(resolved).model_fields or key in NOT_SETTINGS:
            continue
        value = getattr(resolved, key)
        text = _DEFAULT_NOTE.sub("", action.help or "")
        if value is None:
            action.help = text
            continue
        action.help = f"{text} (default {shown(value)}{notes.get(key, '')})"
