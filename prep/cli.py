"""``prep <dataset>``: parse the command line and call :func:`prep.run.run_prep` (``docs/ARCHITECTURE.md``).

Every option of a setting is generated from its field of :class:`prep.settings.PrepSection` (type, choices,
metavar, help, and the "(default ...)" ``--help`` shows), as ``features <kind>`` and ``train <family>`` are;
:data:`DATASETS` says which settings each dataset takes, and where a dataset says one in its own words. The
stage itself is a library: :mod:`prep.build` (source -> ``dataset.json`` content) and :mod:`prep.run`
(``--out`` checks, lock, vocabularies, record, atomic write), which the pipeline runner and the tests call
directly.
"""

from __future__ import annotations

import sys

from vsecore.errors import interrupted_while_loading

# Ctrl-C while these modules load (a fifth of a second, mostly pydantic) ends like any other
# interruption of prep: one line and status 130, for `python -m prep` and for the `prep` script alike.
with interrupted_while_loading("prep"):
    import argparse
    from collections.abc import Mapping, Sequence
    from dataclasses import dataclass, field

    from prep.run import run_prep
    from prep.settings import PrepSection, absolute_paths, prep_section
    from vsecore.errors import add_common_options, run_cli
    from vsecore.options import (
        add_overwrite_option,
        add_pipeline_arguments,
        field_defaults,
        field_option,
        show_defaults,
    )
    from vsecore.pipelines_file import explain_origins, pipeline_settings, settings_from


@dataclass(frozen=True)
class Dataset:
    """A ``prep`` subcommand: its line in ``prep --help``, its description, the settings it takes (in
    ``--help`` order, before the common ones), their help where it says them in its own words, whether it
    reads images (``--images``), and the common settings it accepts without showing them."""

    help: str
    description: str
    options: tuple[str, ...]
    words: Mapping[str, str] = field(default_factory=dict)
    images: bool = True
    hidden: tuple[str, ...] = ()


DATASETS: dict[str, Dataset] = {
    "coco": Dataset(
        "MS COCO (Karpathy JSON, or the official caption files + split file)",
        "MS COCO. Karpathy splits; restval folds into train (113,287 / 5,000 / 5,000) unless --no-restval "
        "(82,783 train images).",
        ("karpathy", "annotations", "split_file", "flat", "flat_val_images", "restval", "captions_per_image",
         "all_captions"),
        {"karpathy": "Karpathy's dataset_coco.json"}),
    "f8k": Dataset(
        "Flickr8k (token file + split lists, or Karpathy JSON)",
        "Flickr8k: 6,000 / 1,000 / 1,000 images, 5 captions each.",
        ("token_file", "split_dir", "karpathy"), {"karpathy": "Karpathy's dataset_flickr8k.json instead"}),
    "f30k": Dataset(
        "Flickr30k (Karpathy JSON)", "Flickr30k from dataset_flickr30k.json: 29,000 / 1,014 / 1,000 images.",
        ("karpathy",), {"karpathy": "Karpathy's dataset_flickr30k.json"}),
    "karpathy": Dataset(
        "your own data: any dataset in the Karpathy split JSON schema",
        "Any image-caption dataset written in Karpathy's split schema ({'images': [{'filename', 'filepath'?, "
        "'split': train|restval|val|test, 'sentences': [{'raw'}, ...]}, ...]}); every caption kept; restval "
        "folds into train unless --no-restval. See the README section 'Your own data'.",
        ("karpathy", "name", "lang", "restval")),
    "multi30k": Dataset(
        "Multi30k: 5 en + 5 de captions per image, en-de translation pairs",
        "Multi30k from the multi30k/dataset layout: task2 captions (5 per language per image), task1 "
        "translations as pairs; 29,000 / 1,014 / 1,000 images.", ("root",)),
    "yjcaptions": Dataset(
        "YJ Captions 26k (Japanese, romanized) + English COCO captions",
        "YJ Captions: Japanese captions transliterated to Hepburn romaji (original kept), English captions "
        "of the same COCO images, image-level en/ja pairs, seeded random val/test splits.",
        ("yj", "coco_karpathy", "val_images", "test_images", "seed"),
        {"seed": "seed of the random val/test split"}),
    "synthetic": Dataset(
        "generated coloured shapes with en/de/ja captions (demo default)",
        "Draws coloured shapes and writes captions that describe them; deterministic given --seed. 1/12 of "
        "the images each for val and test.",
        ("num_images", "image_size", "captions_per_image", "languages", "seed"),
        {"captions_per_image": "captions per image per language, 1..5"}, images=False),
    "textcls": Dataset(
        "text classification CSV (AG News, DBPedia, Yelp, Amazon; or any CSV/TSV)",
        "A text classification dataset (CHAIN-VSE section 5): the Zhang et al. CSV family "
        "(\"class\",\"title\",\"description\"; 1-based class index naming a line of classes.txt; doubled "
        "quotes; HTML entities, their broken '#39;'/'quot;' forms and backslash escapes decoded and counted "
        "in prep.json; title and description joined by ' \u00b6 ') or a generic CSV/TSV with a header "
        "(--label-col, --text-cols, optional --lang-col). Official train/test files are kept; val is carved "
        "from train, stratified and seeded (--val-fraction); --test-fraction splits a single file. Writes "
        "texts, labels, label names, splits, languages and the train-only chars.json/words.json.",
        ("train_file", "test_file", "classes_file", "text_format", "label_col", "text_cols", "lang_col",
         "lang", "name", "val_fraction", "test_fraction", "seed"),
        {"lang": "language of rows without --lang-col", "name": "dataset name (default: the input's folder "
         "name)", "seed": "seed of the val/test carving"}, images=False, hidden=("strict",)),
}
#: the settings every dataset takes, after its own (``images`` only where it reads images)
COMMON = ("images", "strict", "lowercase", "min_word_count", "min_char_count")
#: what ``prep --overwrite`` replaces
OVERWRITE = "replace an existing prepared dataset at --out (a folder prep did not write is never replaced)"


def _add_dataset(sub: argparse._SubParsersAction, name: str, dataset: Dataset) -> None:
    """``prep NAME``: the dataset's settings, ``--out``, ``--overwrite``, the common settings, ``--pipeline``;
    each "(default ...)" from the settings."""
    p = sub.add_parser(name, help=dataset.help, description=dataset.description)
    fields = PrepSection.model_fields
    for key in dataset.options:
        field_option(p, key, fields[key], help_text=dataset.words.get(key))
    field_option(p, "out", fields["out"])
    add_overwrite_option(p, OVERWRITE)
    for key in COMMON:
        if dataset.images or key != "images":
            # images and strict mean nothing for texts: textcls takes --strict, unshown, as it always did
            field_option(p, key, fields[key], help_text=argparse.SUPPRESS if key in dataset.hidden else None)
    add_pipeline_arguments(p)
    show_defaults(p, field_defaults(PrepSection))


def build_parser() -> argparse.ArgumentParser:
    """The ``prep`` argument parser with one subcommand per dataset."""
    parser = argparse.ArgumentParser(
        prog="prep", description="Raw annotations -> prepared dataset (dataset.json in the Karpathy schema "
        "with 'lang' per sentence, train-only chars.json/words.json, and a prep.json record). "
        "Add --traceback to see the traceback of an input error.")
    sub = parser.add_subparsers(dest="command", metavar="DATASET", required=True)
    for name, dataset in DATASETS.items():
        _add_dataset(sub, name, dataset)
    add_common_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``prep`` / ``python -m prep``."""
    return run_cli(_main, argv, "prep")


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    vars(args).update(absolute_paths(vars(args)))
    pipeline = pipeline_settings(args, "prep", prep_section)
    settings = settings_from(PrepSection, "prep", args, {"dataset": args.command}, pipeline)
    with explain_origins(pipeline):
        run_prep(settings, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
