"""YJ Captions 26k: Japanese captions of COCO train2014 images, with their English COCO captions.

The YJ file has the COCO caption format (``images`` optional, ``annotations`` with ``image_id``,
``id``, ``caption``). The English captions, file names and folders come from the COCO Karpathy JSON.
The dataset has no retrieval split: as in the LIWE paper, ``val_images`` and ``test_images`` images
are drawn at random (seeded; the seed is recorded), the rest is train. Each image gets image-level
en/ja pairs: its k-th Japanese caption with its k-th English caption (as many as the shorter list).
YJ images absent from the COCO file are left out, counted and listed.
"""

from __future__ import annotations

import os
import random
from typing import Any

from prep.sources import (
    RawCaption,
    RawDataset,
    RawImage,
    RawPair,
    caption_annotations,
    check_id,
    need,
    need_dir,
    need_file,
)
from vsecore.errors import UserError
from vsecore.jsonfile import read_json


def _english_by_cocoid(path) -> dict[int, dict[str, Any]]:
    data = read_json(path, text_only=True)
    out: dict[int, dict[str, Any]] = {}
    for k, img in enumerate(need(data, "images", path, "top level", list)):
        where = f"images[{k}]"
        cocoid = check_id(img.get("cocoid"), path, where, "cocoid")
        if cocoid is None:
            continue
        if cocoid in out:
            raise UserError(f"{path}: {where}: duplicate cocoid {cocoid!r} (an earlier image has it too)")
        captions = []
        for j, s in enumerate(need(img, "sentences", path, where, list)):
            sw = f"{where}.sentences[{j}]"
            captions.append(RawCaption("en", need(s, "raw", path, sw), check_id(s.get("sentid"), path, sw,
                                                                                  "sentid")))
        out[cocoid] = {"filename": need(img, "filename", path, where, str), "filepath": img.get("filepath"),
                       "captions": captions}
    return out


def read_yjcaptions(yj: str | os.PathLike | None, coco_karpathy: str | os.PathLike | None,
                    images: str | os.PathLike | None, val_images: int, test_images: int, seed: int
                    ) -> RawDataset:
    """Japanese (to be transliterated) + English captions per image, seeded val/test splits."""
    yj_path = need_file(yj, "--yj")
    coco_path = need_file(coco_karpathy, "--coco-karpathy")
    data = read_json(yj_path, text_only=True)
    japanese: dict[int, list[RawCaption]] = {}
    order: list[int] = []
    for k, img in enumerate(data.get("images", []) if isinstance(data, dict) else []):
        cocoid = need(img, "id", yj_path, f"images[{k}]", int)
        if cocoid in japanese:
            raise UserError(f"{yj_path}: images[{k}]: duplicate image id {cocoid}")
        japanese[cocoid] = []
        order.append(cocoid)
    for _where, cocoid, ann_id, caption in caption_annotations(data, yj_path, id_kind=None):
        if cocoid not in japanese:
            japanese[cocoid] = []
            order.append(cocoid)
        japanese[cocoid].append(RawCaption("ja", caption, ann_id))
    english = _english_by_cocoid(coco_path)
    absent = [c for c in order if c not in english]
    kept = [c for c in order if c in english]
    if val_images < 0 or test_images < 0 or val_images + test_images >= len(kept):
        raise UserError(f"{yj_path}: {len(kept)} images with English captions cannot give "
                        f"{val_images} val + {test_images} test images and a train split")
    shuffled = sorted(kept)
    random.Random(seed).shuffle(shuffled)
    split_of = {c: "val" for c in shuffled[:val_images]}
    split_of.update({c: "test" for c in shuffled[val_images:val_images + test_images]})
    out, pairs = [], []
    for cocoid in kept:
        en = english[cocoid]
        img = RawImage(key=str(cocoid), split=split_of.get(cocoid, "train"), filename=en["filename"],
                       filepath=en["filepath"], cocoid=cocoid, captions=japanese[cocoid] + en["captions"],
                       where=f"{yj_path}: image_id {cocoid}")
        out.append(img)
        for ja, en_cap in zip(japanese[cocoid], en["captions"], strict=False):
            pairs.append(RawPair(image_key=img.key, sides={"en": en_cap, "ja": ja},
                                 where=img.where))
    root = need_dir(images, "--images") if images else coco_path.resolve().parent
    notes = {"split_seed": seed, "val_images": val_images, "test_images": test_images}
    if absent:
        notes["images_not_in_coco_karpathy"] = [str(c) for c in absent[:10]]
    return RawDataset(name="yjcaptions", languages=["en", "ja"], images=out, images_root=root,
                      inputs=[yj_path, coco_path], pairs=pairs,
                      excluded={"images_not_in_coco_karpathy": len(absent)} if absent else {}, notes=notes)
