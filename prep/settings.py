"""The settings of ``prep <dataset>`` (the ``prep:`` section of ``pipelines.yaml``): one place for their
fields and defaults, read by the ``prep`` stage (:mod:`prep.run`, :mod:`prep.build`, :mod:`prep.textcls`)
and by the pipeline schema (:mod:`pipelines.schema`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from vsecore.schema import Section


class PrepSection(Section):
    """Options of ``prep <dataset>``."""

    path_fields: ClassVar[tuple[str, ...]] = (
        "out", "karpathy", "annotations", "split_file", "images", "token_file", "split_dir",
        "root", "yj", "coco_karpathy", "flat", "train_file", "test_file", "classes_file",
    )
    dataset: Literal["coco", "f8k", "f30k", "multi30k", "yjcaptions", "synthetic", "karpathy", "textcls"]
    out: str
    #: karpathy: the dataset's name (default: the file's "dataset" field) and its captions' language
    name: str | None = None
    lang: Literal["en", "de", "ja"] = "en"
    # coco / f8k / f30k inputs
    karpathy: str | None = None
    annotations: list[str] | None = None
    split_file: str | None = None
    flat: list[str] | None = None
    flat_val_images: int = 100
    images: str | None = None
    restval: bool = True
    #: coco: keep every caption of an image instead of the first ``captions_per_image``
    all_captions: bool = False
    token_file: str | None = None
    split_dir: str | None = None
    # multi30k
    root: str | None = None
    # yjcaptions
    yj: str | None = None
    coco_karpathy: str | None = None
    val_images: int = 1000
    test_images: int = 1000
    # synthetic
    num_images: int = 1200
    image_size: int = 128
    #: synthetic: captions drawn per image and language (1..5); coco: the first K kept per image
    #: (the VSE++/SCAN protocol: 5; Karpathy's file gives a few images 6 or 7)
    captions_per_image: int = Field(5, ge=1)
    languages: list[str] = Field(default_factory=lambda: ["en", "de", "ja"])
    # textcls (text classification, prep.textcls): Zhang et al. CSV (train/test + classes.txt) or a
    # generic CSV/TSV with a header; val carved from train (stratified, seeded); test_fraction splits a
    # single file
    text_format: Literal["zhang", "csv", "tsv"] = "zhang"
    train_file: str | None = None
    test_file: str | None = None
    classes_file: str | None = None
    label_col: str | None = None
    text_cols: list[str] | None = None
    lang_col: str | None = None
    val_fraction: float = Field(0.05, gt=0, lt=1)
    test_fraction: float | None = Field(None, gt=0, lt=1)
    # common
    seed: int = 0
    strict: bool = False
    lowercase: bool = True
    #: a token / character of the train split enters the vocabulary when seen at least this often
    min_word_count: int = Field(1, ge=1)
    min_char_count: int = Field(1, ge=1)
