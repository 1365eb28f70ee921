"""The command-line options of ``train <family>``: each family's own, the common ones, and the defaults
``--help`` shows, taken from the settings the family resolves (what a run records)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from prep.pipelines import TrainSection, add_pipeline_arguments
from train.models.registry import with_family_defaults
from train.models.uvs import vse_preset
from vsecore.device import DEVICE_HELP

#: defaults of --alphabet-size / --image-dim for a --dry-run without data (COCO's lowercased
#: alphabet is about 70 symbols; VGG fc7 features have 4096 dimensions)
DRY_RUN_ALPHABET = 72
DRY_RUN_IMAGE_DIM = 4096
#: default --vocab-size of a word model's --dry-run without data: the SEAM paper's COCO vocabulary
DRY_RUN_VOCABULARY = 11360


def _chain_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", choices=("v1", "v2"), default=None,
                   help="CHAIN-VSE v1 (inception of character convolutions) or v2 (depthwise separable "
                        "convolutions) (default v1)")
    p.add_argument("--p", type=float, default=None,
                   help="width multiplier of the text encoder: p=1 has 256 filters per stream, p=0.5 has "
                        "128 (default 1.0)")


def _oecc_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", choices=("A", "B", "C", "D"), default=None,
                   help="OECC text encoder architecture A-D (paper, Table 1) (default D)")


# --- clmr / liwe (LIWE paper) ----------------------------------------------------------------------
#: region rows of a --dry-run without --features: the paper's 36 BUTD regions of 2,048 dimensions
DRY_RUN_REGIONS = (36, 2048)


def _comma_list(kind: type) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            return [kind(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None

    return parse


def _region_family_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eta", type=float, default=None,
                   help="hard-negative schedule: J = lambda J_max + (1 - lambda) J_sum with lambda = "
                        "1 - eta^iteration (default 0.991; 1: sum of hinges only, 0: max of hinges only)")
    p.add_argument("--langs", type=_comma_list(str), default=None, metavar="LANG[,LANG]",
                   help="languages of the image-text training captions (default: --lang only, as the "
                        "paper's Eq. 8 and LAVSE: other languages enter through --cross-lang); the test "
                        "evaluation is done per language")
    p.add_argument("--cross-lang", dest="cross_lang", type=_comma_list(str), default=None,
                   metavar="LANG[,LANG]",
                   help="add the cross-language loss over the dataset's pairs aligning --lang with each of "
                        "these languages (default: none)")


def _clmr_options(p: argparse.ArgumentParser) -> None:
    _region_family_options(p)


def _liwe_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=_comma_list(int), default=None, metavar="F1,F2",
                   help="fully connected layers of the character-built word embedder: LIWE(f1,f2) (default "
                        "128,256)")
    p.add_argument("--word-length", dest="word_length", type=int, default=None, metavar="C_W",
                   help="characters per word (longer words are cut) (default: the length covering 99.9%% of "
                        "the train split's distinct words; 26 for a --dry-run without --data)")
    _region_family_options(p)


REGION_FAMILIES = {
    "clmr": ("CLMR: word embeddings + BiGRU, non-local region image encoder, cosine, eta schedule, "
             "cross-language loss", _clmr_options),
    "liwe": ("LIWE: character-built word embeddings + BiGRU, non-local region image encoder, cosine, eta "
             "schedule, cross-language loss", _liwe_options),
}
# -------------------------------------------------------------------------------------------------------

def _word_options(p: argparse.ArgumentParser) -> None:
    """Options of the word-level families (seam, vse): how captions become word indices."""
    p.add_argument("--max-words", dest="max_words", type=int, default=None,
                   help="captions are cut to this many words (default 100)")
    p.add_argument("--min-word-count", dest="min_word_count", type=int, default=None,
                   help="words seen fewer times in the train split map to <unk> (default 1: every "
                        "train word)")


def _seam_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variant", choices=("E", "C", "G"), default=None,
                   help="SEAM-E (attention over the word embeddings), SEAM-C (+ convolutions of width 2 "
                        "and 3) or SEAM-G (attention over a GRU's states) (default E)")
    p.add_argument("--hops", type=int, default=None,
                   help="attention hops h of each attention module (default: E 30, C 5, G 30)")
    p.add_argument("--penalty", type=float, default=None,
                   help="lambda, coefficient of the attention penalty ||AA^T - I||_F^2 (default 0)")
    p.add_argument("--gru-units", dest="gru_units", type=int, default=None,
                   help="GRU units of SEAM-G (default 512)")
    _word_options(p)


def _vse_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=("SH", "SH-bl", "MH", "MH-bl", "SOE", "SOE-bl", "MOE", "MOE-bl", "PH",
                                      "POE"), default=None,
                   help="the FNE paper's pipeline, with its table 1 settings as defaults: sum (S) or max (M) "
                        "of hinges, cosine (H) or order (OE); PH/POE train with the sum until validation "
                        "stops improving, then go on from the best checkpoint with the max; -bl: the "
                        "baselines' settings (default SH)")
    p.add_argument("--word-dim", dest="word_dim", type=int, default=None,
                   help="size of the word embedding (default: the --kind preset)")
    p.add_argument("--absolute", action=argparse.BooleanOptionalAction, default=None,
                   help="|.| on both sides before the L2 normalisation (default: the --kind preset)")
    p.add_argument("--finetune-lr", dest="finetune_lr", type=float, default=None,
                   help="learning rate of the second (max of hinges) phase of PH/POE (default: the preset; "
                        "POE 1e-4, PH --lr)")
    _word_options(p)


#: the families that train today, with the options only they take
FAMILY_OPTIONS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "chain": ("CHAIN-VSE: character inception text encoder, order embeddings", _chain_options),
    "oecc": ("OECC: order embeddings with character convolutions through time", _oecc_options),
    "seam": ("SEAM: self-attentive word-embedding text encoders (E, C, G), order embeddings", _seam_options),
    "vse": ("VSE pipelines of the FNE paper: word embedding + GRU on FNE or one-layer features "
            "(SH, MH, SOE, MOE, PH, POE)", _vse_options),
    **REGION_FAMILIES,
}


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
        return ",".join(str(v) for v in value)
    return str(value)


def resolved_defaults(family: str) -> TrainSection:
    """The settings a run of ``family`` records for every option not given (schema defaults, then the
    family's own defaults, without a dataset: the vse ``--kind`` preset shows COCO's column)."""
    return with_family_defaults(TrainSection(family=family, out="RUN_DIR"), None)


def show_resolved_defaults(parser: argparse.ArgumentParser, family: str) -> None:
    """Rewrite each setting's "(default ...)" in ``--help`` from :func:`resolved_defaults`, so the help
    and a run's ``config.json`` read one source (a family default shows as that family's value)."""
    resolved = resolved_defaults(family)
    preset_keys = set(vse_preset("SH", None)) if family == "vse" else set()
    for action in parser._actions:
        key = action.dest
        if key not in TrainSection.model_fields or key in NOT_SETTINGS:
            continue
        value = getattr(resolved, key)
        text = _DEFAULT_NOTE.sub("", action.help or "")
        if value is None:
            action.help = text
            continue
        note = "; the --kind preset of the prepared dataset's column, COCO's without one" \
            if key in preset_keys else ""
        action.help = f"{text} (default {shown(value)}{note})"
