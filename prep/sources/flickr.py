"""Flickr8k (token file + official split lists, or Karpathy JSON) and Flickr30k (Karpathy JSON).

The token file has one caption a line, ``NAME.jpg#K<TAB>caption``. Images are ordered by the split
lists, train then dev then test (6,000 / 1,000 / 1,000), which is also the order of Karpathy's
``dataset_flickr8k.json``; images of the token file in no list are left out and counted.
"""

from __future__ import annotations

import os
from pathlib import Path

from prep.sources import RawCaption, RawDataset, RawImage, need_dir, need_file
from prep.sources.coco import read_karpathy
from vsecore.errors import UserError
from vsecore.io import read_text

#: official Flickr8k split lists, in image order
F8K_SPLIT_LISTS = (("train", "Flickr_8k.trainImages.txt"), ("val", "Flickr_8k.devImages.txt"),
                   ("test", "Flickr_8k.testImages.txt"))


def read_token_file(path: Path) -> dict[str, list[RawCaption]]:
    """Captions per image name from ``Flickr8k.token.txt`` (in file order)."""
    captions: dict[str, list[RawCaption]] = {}
    seen: dict[str, int] = {}
    text = read_text(path)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        ident, tab, caption = line.partition("\t")
        name, hash_, k = ident.partition("#")
        if not tab or not hash_ or not k.strip().isdigit():
            raise UserError(f"{path}: line {lineno}: expected 'NAME.jpg#K<TAB>caption', got {line[:60]!r}")
        ident = f"{name}#{int(k)}"
        if ident in seen:
            raise UserError(f"{path}: line {lineno}: duplicate caption id '{ident}' (also line "
                            f"{seen[ident]})")
        seen[ident] = lineno
        captions.setdefault(name, []).append(RawCaption("en", caption, ident))
    return captions


def read_split_lists(split_dir: Path) -> list[tuple[str, str, str]]:
    """``(split, image name, where)`` of the official lists, in order; duplicates are an error."""
    out: list[tuple[str, str, str]] = []
    seen: dict[str, str] = {}
    for split, fname in F8K_SPLIT_LISTS:
        path = split_dir / fname
        if not path.is_file():
            raise UserError(f"{path}: no such split list (expected in --split-dir)")
        for lineno, line in enumerate(read_text(path).splitlines(), 1):
            name = line.strip()
            if not name:
                continue
            where = f"{path}: line {lineno}"
            if name in seen:
                raise UserError(f"{where}: duplicate image '{name}' (also {seen[name]})")
            seen[name] = where
            out.append((split, name, where))
    return out


def read_f8k(token_file: str | os.PathLike | None, split_dir: str | os.PathLike | None,
             images: str | os.PathLike | None) -> RawDataset:
    """Flickr8k from the token file and the split lists (default: the token file's folder)."""
    token_path = need_file(token_file, "--token-file")
    lists_dir = need_dir(split_dir, "--split-dir") if split_dir else token_path.resolve().parent
    captions = read_token_file(token_path)
    rows = read_split_lists(lists_dir)
    out = []
    for split, name, where in rows:
        if name not in captions:
            raise UserError(f"{where}: image '{name}' has no caption in {token_path}")
        out.append(RawImage(key=name, split=split, filename=name, captions=captions[name], where=where))
    listed = {name for _, name, _ in rows}
    unlisted = sum(1 for name in captions if name not in listed)
    root = need_dir(images, "--images") if images else token_path.resolve().parent / "images"
    return RawDataset(name="f8k", languages=["en"], images=out, images_root=root,
                      inputs=[token_path] + [lists_dir / f for _, f in F8K_SPLIT_LISTS],
                      excluded={"images_in_no_split": unlisted} if unlisted else {})


def read_flickr_karpathy(path: str | os.PathLike | None, images: str | os.PathLike | None, name: str
                         ) -> RawDataset:
    """Flickr8k or Flickr30k from Karpathy's ``dataset_flickr8k.json`` / ``dataset_flickr30k.json``."""
    raw = read_karpathy(need_file(path, "--karpathy"), images, restval=True, name=name)
    raw.name = name
    return raw
