"""The settings of ``prep <dataset>`` (the ``prep:`` section of ``pipelines.yaml``): one place for their
fields, defaults and help texts, read by the ``prep`` stage (:mod:`prep.run`, :mod:`prep.build`,
:mod:`prep.textcls`), by its command, whose options are generated from the fields (:mod:`prep.cli`), and by
the pipeline schema (:mod:`pipelines.schema`). :func:`prep_section` reads a pipeline's section."""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

from pydantic import Field

from vsecore.pipelines_file import PipelineEntry
from vsecore.schema import Section


class PrepSection(Section):
    """Options of ``prep <dataset>``. A field's ``description`` is its option's help (a command gives some
    its own words, :data:`prep.cli.DATASETS`); ``json_schema_extra`` holds the option's look (``metavar``,
    ``option`` when the flag is not the field's name, ``nargs``, ``action: store_true``)."""

    path_fields: ClassVar[tuple[str, ...]] = (
        "out", "karpathy", "annotations", "split_file", "images", "token_file", "split_dir",
        "root", "yj", "coco_karpathy", "flat", "train_file", "test_file", "classes_file",
    )
    dataset: Literal["coco", "f8k", "f30k", "multi30k", "yjcaptions", "synthetic", "karpathy", "textcls"]
    out: str = Field(json_schema_extra={"metavar": "DIR"}, description=(
        "output folder of the prepared dataset: a new or empty folder, or a prepared dataset with "
        "--overwrite (replaced only when preparation succeeds)"))
    #: karpathy: the dataset's name (default: the file's "dataset" field) and its captions' language
    name: str | None = Field(None, description="dataset name recorded in dataset.json (default: the file's "
                             "'dataset' field)")
    lang: Literal["en", "de", "ja"] = Field("en", description="language of the captions: their tokenizer "
                                            "(ja: romanized with pykakasi)")
    # coco / f8k / f30k inputs
    karpathy: str | None = Field(None, json_schema_extra={"metavar": "FILE"},
                                 description="the dataset's Karpathy-schema JSON")
    annotations: list[str] | None = Field(
        None, json_schema_extra={"metavar": "FILE", "nargs": "+"},
        description="official caption files (captions_train2014.json captions_val2014.json)")
    split_file: str | None = Field(None, json_schema_extra={"metavar": "FILE"}, description=(
        "with --annotations: a Karpathy JSON or {\"train\"|\"restval\"|\"val\"|\"test\": [COCO ids or file "
        "names]}; images in no split are left out and counted"))
    flat: list[str] | None = Field(None, json_schema_extra={"metavar": "FILE", "nargs": 2}, description=(
        "TRAIN.json VAL.json: flat lists of {image_path, caption, image_id} (the layout of the shared "
        "coco_sample); train images -> train, the first --flat-val-images val images -> val, the rest -> "
        "test"))
    flat_val_images: int = Field(100, json_schema_extra={"metavar": "N"},
                                 description="with --flat: how many of VAL.json's images form the val split")
    images: str | None = Field(None, json_schema_extra={"metavar": "DIR"}, description=(
        "folder the images' paths (filepath/filename) are relative to; images not found there are counted "
        "and listed"))
    restval: bool = Field(True, description="fold the 'restval' images into train, or leave them out "
                          "(--no-restval)")
    #: coco: keep every caption of an image instead of the first ``captions_per_image``
    all_captions: bool = Field(False, json_schema_extra={"action": "store_true"},
                               description="keep every caption of each image")
    token_file: str | None = Field(None, json_schema_extra={"metavar": "FILE"},
                                   description="Flickr8k.token.txt")
    split_dir: str | None = Field(None, json_schema_extra={"metavar": "DIR"}, description=(
        "folder of Flickr_8k.{train,dev,test}Images.txt (default: the token file's folder)"))
    # multi30k
    root: str | None = Field(None, json_schema_extra={"metavar": "DIR"},
                             description="folder holding task1/ and task2/")
    # yjcaptions
    yj: str | None = Field(None, json_schema_extra={"metavar": "FILE"},
                           description="yjcaptions26k_clean.json (COCO caption format)")
    coco_karpathy: str | None = Field(None, json_schema_extra={"metavar": "FILE"}, description=(
        "Karpathy's dataset_coco.json (English captions, file names)"))
    val_images: int = Field(1000, json_schema_extra={"metavar": "N"}, description="random val images")
    test_images: int = Field(1000, json_schema_extra={"metavar": "N"}, description="random test images")
    # synthetic
    num_images: int = Field(1200, json_schema_extra={"metavar": "N"}, description="images to draw")
    image_size: int = Field(128, json_schema_extra={"metavar": "PX"}, description="side of the images")
    #: synthetic: captions drawn per image and language (1..5); coco: the first K kept per image
    #: (the VSE++/SCAN protocol: 5; Karpathy's file gives a few images 6 or 7)
    captions_per_image: int = Field(5, ge=1, json_schema_extra={"metavar": "K"}, description=(
        "keep the first K captions of each image, in the source's order (5 as VSE++/SCAN; a few images have "
        "6-7); the others are dropped and counted"))
    languages: list[str] = Field(default_factory=lambda: ["en", "de", "ja"],
                                 json_schema_extra={"nargs": "+", "choices": ["en", "de", "ja"]},
                                 description="caption languages")
    # textcls (text classification, prep.textcls): Zhang et al. CSV (train/test + classes.txt) or a
    # generic CSV/TSV with a header; val carved from train (stratified, seeded); test_fraction splits a
    # single file
    text_format: Literal["zhang", "csv", "tsv"] = Field(
        "zhang", json_schema_extra={"option": "--format"},
        description="zhang: Zhang et al.'s headerless CSV; csv/tsv: a file with a header")
    train_file: str | None = Field(None, json_schema_extra={"option": "--train", "metavar": "FILE"},
                                   description="train file (or the single file that --test-fraction splits)")
    test_file: str | None = Field(None, json_schema_extra={"option": "--test", "metavar": "FILE"},
                                  description="official test file")
    classes_file: str | None = Field(None, json_schema_extra={"option": "--classes", "metavar": "FILE"},
                                     description="zhang: classes.txt (default: the one next to the first "
                                     "file)")
    label_col: str | None = Field(None, json_schema_extra={"metavar": "COL"}, description=(
        "csv/tsv: column of the class names (header name or 0-based index)"))
    text_cols: list[str] | None = Field(None, json_schema_extra={"metavar": "COL", "nargs": "+"},
                                        description="csv/tsv: text columns, joined by a space")
    lang_col: str | None = Field(None, json_schema_extra={"metavar": "COL"}, description=(
        "csv/tsv: column of each row's language (en, de, ja romanized, or any language spaCy has a blank "
        "tokenizer for); default: --lang for every row"))
    val_fraction: float = Field(0.05, gt=0, lt=1, json_schema_extra={"metavar": "F"}, description=(
        "fraction of the train rows carved into val, stratified by class"))
    test_fraction: float | None = Field(None, gt=0, lt=1, json_schema_extra={"metavar": "F"}, description=(
        "split a single file: this fraction of its rows becomes test, stratified"))
    # common
    seed: int = Field(0, description="random seed")
    strict: bool = Field(False, json_schema_extra={"action": "store_true"},
                         description="make missing images an error instead of a count")
    lowercase: bool = Field(True, description="lowercase tokens and the character alphabet, as the papers do")
    #: a token / character of the train split enters the vocabulary when seen at least this often
    min_word_count: int = Field(1, ge=1, json_schema_extra={"metavar": "K"},
                                description="keep train tokens seen at least K times in words.json")
    min_char_count: int = Field(1, ge=1, json_schema_extra={"metavar": "K"},
                                description="keep train characters seen at least K times in chars.json")


def prep_section(entry: PipelineEntry) -> PrepSection | None:
    """The ``prep`` section of a pipeline, validated (a one-line error naming the file, pipeline and key);
    None when it has none."""
    return entry.section("prep", PrepSection, PrepSection.path_fields)


def absolute_paths(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (option name -> value) with the path fields given made absolute against the working
    directory, as the shell meant them (a pipelines file's paths are relative to its folder, made absolute
    when read): a prepared dataset records its settings so, and a pipeline with the same settings compares
    equal. The command and ``vse.prep`` both call it."""

    def absolute(path: str) -> str:
        return os.path.normpath(os.path.abspath(os.path.expanduser(path)))

    out = dict(values)
    for key in PrepSection.path_fields:
        value = out.get(key)
        if isinstance(value, str):
            out[key] = absolute(value)
        elif isinstance(value, list):
            out[key] = [absolute(v) for v in value]
    return out
