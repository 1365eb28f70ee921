"""Multi30k (English and German on Flickr30k images), from the layout of the ``multi30k/dataset`` repo.

- ``task2/``: five independent captions per image per language, the retrieval captions:
  ``raw/{train,val,test_2016}.{1..5}.{en,de}.gz``, images in
  ``image_splits/{train,val,test_2016}_images.txt``.
- ``task1/``: one German translation of one English caption per image (the translation pairs):
  ``raw/{train,val,test_2016_flickr}.{en,de}.gz``, images in ``image_splits/{...}.txt``.

Line ``i`` of a caption file belongs to line ``i`` of its image list; a count mismatch is an error.
Splits: 29,000 / 1,014 / 1,000 images (the Flickr30k Karpathy split order).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from prep.sources import RawCaption, RawDataset, RawImage, RawPair, need_dir
from vsecore.errors import UserError
from vsecore.io import read_text

#: split -> (task2 file stem, task1 file stem)
SPLIT_FILES = {"train": ("train", "train"), "val": ("val", "val"), "test": ("test_2016", "test_2016_flickr")}
CAPTIONS_PER_LANGUAGE = 5
LANGS = ("en", "de")


def read_lines(path: Path) -> list[str]:
    """Lines of a text file, gzipped when it ends in ``.gz`` (a :class:`UserError` if absent)."""
    if not path.is_file():
        raise UserError(f"{path}: no such file (expected in the Multi30k layout, see datasets/multi30k.md)")
    if path.suffix != ".gz":
        return read_text(path).splitlines()
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return fh.read().splitlines()
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text once decompressed ({exc.reason} at byte {exc.start})"
                        ) from None
    except (OSError, EOFError) as exc:
        raise UserError(f"{path}: unreadable ({exc})") from None


def _aligned(path: Path, n: int, images_file: Path) -> list[str]:
    lines = read_lines(path)
    if len(lines) != n:
        raise UserError(f"{path}: {len(lines)} lines, but {images_file} lists {n} images")
    return lines


def read_multi30k(root: str | os.PathLike | None, images: str | os.PathLike | None) -> RawDataset:
    """Images with 5 en + 5 de captions (task2) and the en-de translation pairs (task1)."""
    root = need_dir(root, "--root")
    inputs: list[Path] = []
    out: list[RawImage] = []
    by_name: dict[str, RawImage] = {}
    pairs: list[RawPair] = []
    for split, (t2, t1) in SPLIT_FILES.items():
        list_file = root / "task2" / "image_splits" / f"{t2}_images.txt"
        names = [n.strip() for n in read_lines(list_file) if n.strip()]
        inputs.append(list_file)
        split_images = []
        for lineno, name in enumerate(names, 1):
            if name in by_name:
                raise UserError(f"{list_file}: line {lineno}: duplicate image '{name}' "
                                f"(also in {by_name[name].where})")
            img = RawImage(key=name, split=split, filename=name, where=f"{list_file}: line {lineno}")
            by_name[name] = img
            split_images.append(img)
        for lang in LANGS:
            for k in range(1, CAPTIONS_PER_LANGUAGE + 1):
                file = root / "task2" / "raw" / f"{t2}.{k}.{lang}.gz"
                inputs.append(file)
                for lineno, (img, text) in enumerate(zip(split_images, _aligned(file, len(names), list_file),
                                                         strict=True), 1):
                    img.captions.append(RawCaption(lang, text, f"{file.name}:{lineno}"))
        out.extend(split_images)
        pairs.extend(_read_pairs(root, split, t1, by_name, inputs))
    return RawDataset(name="multi30k", languages=list(LANGS), images=out,
                      images_root=need_dir(images, "--images") if images else root / "images",
                      inputs=inputs, pairs=pairs)


def _read_pairs(root: Path, split: str, stem: str, by_name: dict[str, RawImage], inputs: list[Path]
                ) -> list[RawPair]:
    list_file = root / "task1" / "image_splits" / f"{stem}.txt"
    names = [n.strip() for n in read_lines(list_file)]
    inputs.append(list_file)
    texts = {}
    for lang in LANGS:
        file = root / "task1" / "raw" / f"{stem}.{lang}.gz"
        inputs.append(file)
        texts[lang] = _aligned(file, len(names), list_file)
    pairs = []
    for i, name in enumerate(names):
        where = f"{list_file}: line {i + 1}"
        img = by_name.get(name)
        if img is None or img.split != split:
            raise UserError(f"{where}: image '{name}' is not in the task2 {split} images")
        pairs.append(RawPair(image_key=name, sides={lang: texts[lang][i] for lang in LANGS}, where=where))
    return pairs
