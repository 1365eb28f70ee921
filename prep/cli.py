"""``prep <dataset>``: parse the command line and call :func:`prep.run.run_prep` (``docs/ARCHITECTURE.md``).

The stage itself is a library: :mod:`prep.build` (source -> ``dataset.json`` content) and
:mod:`prep.run` (``--out`` checks, lock, vocabularies, record, atomic write), which the pipeline
runner and the tests call directly.
"""

from __future__ import annotations

import sys

from vsecore.errors import interrupted_while_loading

# Ctrl-C while these modules load (a fifth of a second, mostly pydantic) ends like any other
# interruption of prep: one line and status 130, for `python -m prep` and for the `prep` script alike.
with interrupted_while_loading("prep"):
    import argparse
    from collections.abc import Sequence

    from pipelines.schema import add_pipeline_arguments, stage_settings
    from prep.run import run_prep
    from vsecore.errors import add_common_options, run_cli


def _common(p: argparse.ArgumentParser, images: bool = True) -> None:
    p.add_argument("--out", metavar="DIR", default=None,
                   help="output folder of the prepared dataset: a new or empty folder, or a prepared "
                        "dataset with --overwrite (replaced only when preparation succeeds)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing prepared dataset at --out (a folder prep did not write is "
                        "never replaced)")
    if images:
        p.add_argument("--images", metavar="DIR", default=None,
                       help="folder the images' paths (filepath/filename) are relative to; images not found "
                            "there are counted and listed")
    p.add_argument("--strict", action="store_true", default=None,
                   help="make missing images an error instead of a count")
    p.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=None,
                   help="lowercase tokens and the character alphabet, as the papers do (default: on)")
    p.add_argument("--min-word-count", type=int, default=None, metavar="K",
                   help="keep train tokens seen at least K times in words.json (default 1)")
    p.add_argument("--min-char-count", type=int, default=None, metavar="K",
                   help="keep train characters seen at least K times in chars.json (default 1)")
    add_pipeline_arguments(p)


def _other_dataset_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``prep f8k|f30k|karpathy|multi30k|yjcaptions|synthetic`` (``coco`` is in :func:`build_parser`)."""
    p = sub.add_parser("f8k", help="Flickr8k (token file + split lists, or Karpathy JSON)",
                       description="Flickr8k: 6,000 / 1,000 / 1,000 images, 5 captions each.")
    p.add_argument("--token-file", metavar="FILE", default=None, help="Flickr8k.token.txt")
    p.add_argument("--split-dir", metavar="DIR", default=None,
                   help="folder of Flickr_8k.{train,dev,test}Images.txt (default: the token file's folder)")
    p.add_argument("--karpathy", metavar="FILE", default=None,
                   help="Karpathy's dataset_flickr8k.json instead")
    _common(p)

    p = sub.add_parser("f30k", help="Flickr30k (Karpathy JSON)",
                       description="Flickr30k from dataset_flickr30k.json: 29,000 / 1,014 / 1,000 images.")
    p.add_argument("--karpathy", metavar="FILE", default=None, help="Karpathy's dataset_flickr30k.json")
    _common(p)

    p = sub.add_parser("karpathy", help="your own data: any dataset in the Karpathy split JSON schema",
                       description="Any image-caption dataset written in Karpathy's split schema "
                       "({'images': [{'filename', 'filepath'?, 'split': train|restval|val|test, "
                       "'sentences': [{'raw'}, ...]}, ...]}); every caption kept; restval folds into train "
                       "unless --no-restval. See the README section 'Your own data'.")
    p.add_argument("--karpathy", metavar="FILE", default=None, help="the dataset's Karpathy-schema JSON")
    p.add_argument("--name", default=None, help="dataset name recorded in dataset.json (default: the file's "
                   "'dataset' field)")
    p.add_argument("--lang", choices=("en", "de", "ja"), default=None,
                   help="language of the captions: their tokenizer (ja: romanized with pykakasi) "
                        "(default en)")
    p.add_argument("--restval", action=argparse.BooleanOptionalAction, default=None,
                   help="fold 'restval' images into train (default) or leave them out")
    _common(p)
    _bilingual_and_synthetic_parsers(sub)

    from prep.textcls import add_textcls_parser

    add_textcls_parser(sub, _common)


def _bilingual_and_synthetic_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``prep multi30k|yjcaptions`` (captions in two languages, with pairs) and ``prep synthetic``."""
    p = sub.add_parser("multi30k", help="Multi30k: 5 en + 5 de captions per image, en-de translation pairs",
                       description="Multi30k from the multi30k/dataset layout: task2 captions (5 per "
                       "language per image), task1 translations as pairs; 29,000 / 1,014 / 1,000 images.")
    p.add_argument("--root", metavar="DIR", default=None, help="folder holding task1/ and task2/")
    _common(p)

    p = sub.add_parser("yjcaptions", help="YJ Captions 26k (Japanese, romanized) + English COCO captions",
                       description="YJ Captions: Japanese captions transliterated to Hepburn romaji "
                       "(original kept), English captions of the same COCO images, image-level en/ja pairs, "
                       "seeded random val/test splits.")
    p.add_argument("--yj", metavar="FILE", default=None,
                   help="yjcaptions26k_clean.json (COCO caption format)")
    p.add_argument("--coco-karpathy", metavar="FILE", default=None,
                   help="Karpathy's dataset_coco.json (English captions, file names)")
    p.add_argument("--val-images", type=int, default=None, metavar="N",
                   help="random val images (default 1000)")
    p.add_argument("--test-images", type=int, default=None, metavar="N",
                   help="random test images (default 1000)")
    p.add_argument("--seed", type=int, default=None, help="seed of the random val/test split (default 0)")
    _common(p)

    p = sub.add_parser("synthetic", help="generated coloured shapes with en/de/ja captions (demo default)",
                       description="Draws coloured shapes and writes captions that describe them; "
                       "deterministic given --seed. 1/12 of the images each for val and test.")
    p.add_argument("--num-images", type=int, default=None, metavar="N", help="images to draw (default 1200)")
    p.add_argument("--image-size", type=int, default=None, metavar="PX",
                   help="side of the images (default 128)")
    p.add_argument("--captions-per-image", type=int, default=None, metavar="K",
                   help="captions per image per language, 1..5 (default 5)")
    p.add_argument("--languages", nargs="+", default=None, choices=("en", "de", "ja"),
                   help="caption languages (default: en de ja)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default 0)")
    _common(p, images=False)


def build_parser() -> argparse.ArgumentParser:
    """The ``prep`` argument parser with one subcommand per dataset."""
    parser = argparse.ArgumentParser(
        prog="prep", description="Raw annotations -> prepared dataset (dataset.json in the Karpathy schema "
        "with 'lang' per sentence, train-only chars.json/words.json, and a prep.json record). "
        "Add --traceback to see the traceback of an input error.")
    sub = parser.add_subparsers(dest="command", metavar="DATASET", required=True)

    p = sub.add_parser("coco", help="MS COCO (Karpathy JSON, or the official caption files + split file)",
                       description="MS COCO. Karpathy splits; restval folds into train (113,287 / 5,000 / "
                       "5,000) unless --no-restval (82,783 train images).")
    p.add_argument("--karpathy", metavar="FILE", default=None, help="Karpathy's dataset_coco.json")
    p.add_argument("--annotations", metavar="FILE", nargs="+", default=None,
                   help="official caption files (captions_train2014.json captions_val2014.json)")
    p.add_argument("--split-file", metavar="FILE", default=None,
                   help="with --annotations: a Karpathy JSON or "
                       "{\"train\"|\"restval\"|\"val\"|\"test\": [COCO "
                        "ids or file names]}; images in no split are left out and counted")
    p.add_argument("--flat", metavar="FILE", nargs=2, default=None,
                   help="TRAIN.json VAL.json: flat lists of {image_path, caption, image_id} (the layout of "
                        "the shared coco_sample); train images -> train, the first --flat-val-images "
                        "val images -> val, the rest -> test")
    p.add_argument("--flat-val-images", dest="flat_val_images", type=int, metavar="N", default=None,
                   help="with --flat: how many of VAL.json's images form the val split (default 100)")
    p.add_argument("--restval", action=argparse.BooleanOptionalAction, default=None,
                   help="fold the restval images into train (default) or leave them out (--no-restval)")
    p.add_argument("--captions-per-image", type=int, default=None, metavar="K",
                   help="keep the first K captions of each image, in the source's order (default 5, as "
                        "VSE++/SCAN; a few images have 6-7); the others are dropped and counted")
    p.add_argument("--all-captions", action="store_true", default=None,
                   help="keep every caption of each image")
    _common(p)

    _other_dataset_parsers(sub)
    add_common_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``prep`` / ``python -m prep``."""
    return run_cli(_main, argv, "prep")


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    settings = stage_settings("prep", args, dataset=args.command)
    run_prep(settings, overwrite=args.overwrite)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
