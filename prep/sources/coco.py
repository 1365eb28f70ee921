"""MS COCO: Karpathy split JSON (also the reader of ``dataset_flickr8k/30k.json``) or the official files.

Karpathy splits are train / restval / val / test. ``restval`` (30,504 images of val2014) folds into
train by default, giving 113,287 / 5,000 / 5,000; with ``restval=False`` those images are left out
(82,783 train images, the Full-Network-Embedding paper's setting). A folded image keeps
``karpathy_split: "restval"``.

From the official caption files (``captions_train2014.json`` ...), the split comes from
``--split-file``: either a Karpathy JSON (its ``cocoid``/``split`` per image) or a JSON object
``{"train": [...], "restval": [...], "val": [...], "test": [...]}`` of COCO ids or file names.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from prep.sources import (
    RawCaption,
    RawDataset,
    RawImage,
    caption_annotations,
    check_id,
    need,
    need_dir,
    need_file,
)
from vsecore.errors import UserError
from vsecore.io import write_json_atomic
from vsecore.jsonfile import read_json
from vsecore.outputs import check_output_file

KARPATHY_SPLITS = ("train", "restval", "val", "test")
_COCO_ID = re.compile(r"(\d+)\.\w+$")


def _split_of(karpathy_split: str, restval: bool) -> str | None:
    """Toolkit split of a Karpathy split; ``None`` when the image is left out."""
    if karpathy_split == "restval":
        return "train" if restval else None
    return karpathy_split


def read_karpathy(path: str | os.PathLike, images: str | os.PathLike | None, restval: bool = True,
                  name: str | None = None, data: dict[str, Any] | None = None,
                  inputs: list[Path] | None = None, lang: str = "en") -> RawDataset:
    """Read a Karpathy split JSON (``dataset_coco.json``, ``dataset_flickr8k.json``, or one's own).

    ``data``: the already parsed Karpathy dict (then ``path`` only names it in messages) and
    ``inputs`` the files it came from; ``lang``: the language of every caption.
    """
    path = need_file(path, "--karpathy")
    if data is None:
        data = read_json(path, text_only=True)
    rows = need(data, "images", path, "top level", list)
    out: list[RawImage] = []
    excluded = 0
    seen: dict[str, dict[Any, str]] = {"cocoid": {}, "imgid": {}}
    for k, img in enumerate(rows):
        where = f"images[{k}]"
        _check_unique_ids(img, path, where, seen)
        ksplit = need(img, "split", path, where, str)
        if ksplit not in KARPATHY_SPLITS:
            raise UserError(f"{path}: {where}: unknown split '{ksplit}' "
                            f"(expected {', '.join(KARPATHY_SPLITS)})")
        split = _split_of(ksplit, restval)
        if split is None:
            excluded += 1
            continue
        filename = need(img, "filename", path, where, str)
        captions = []
        for j, s in enumerate(need(img, "sentences", path, where, list)):
            sw = f"{where}.sentences[{j}]"
            captions.append(RawCaption(lang, need(s, "raw", path, sw), check_id(s.get("sentid"), path, sw,
                                                                                 "sentid")))
        cocoid = check_id(img.get("cocoid"), path, where, "cocoid")
        imgid = check_id(img.get("imgid"), path, where, "imgid")
        ident = cocoid if cocoid is not None else (imgid if imgid is not None else filename)
        out.append(RawImage(
            key=f"{ident}:{filename}",
            split=split, filename=filename, filepath=img.get("filepath"), cocoid=cocoid,
            karpathy_split=ksplit if ksplit == "restval" else None, captions=captions,
            where=f"{path}: {where}"))
    _check_unique_filenames(out)
    root = need_dir(images, "--images") if images is not None else path.resolve().parent
    return RawDataset(name=name or str(data.get("dataset", "coco")), languages=[lang], images=out,
                      images_root=root, inputs=inputs or [path],
                      excluded={"restval_images": excluded} if excluded else {})


def _check_unique_ids(img: Any, path: Path, where: str, seen: dict[str, dict[Any, str]]) -> None:
    """A :class:`UserError` when the image's ``cocoid`` or ``imgid`` was already given to an earlier image
    of the file (restval images included): ids name one image each, and a repeated one means two
    entries would share features or an identity in every later stage."""
    if not isinstance(img, dict):
        return  # need() names the problem
    for key, ids in seen.items():
        value = check_id(img.get(key), path, where, key)
        if value is None:
            continue
        if value in ids:
            raise UserError(f"{path}: {where}: duplicate image {key} {value!r} (also {ids[value]})")
        ids[value] = where


def _check_unique_filenames(images: list[RawImage]) -> None:
    seen: dict[tuple[str | None, str], str] = {}
    for im in images:
        key = (im.filepath, im.filename)
        if key in seen:
            raise UserError(f"{im.where}: duplicate image '{im.filename}' (also at {seen[key]})")
        seen[key] = im.where


def read_annotations(files: list[str], split_file: str | os.PathLike | None, images: str | os.PathLike | None,
                     restval: bool = True) -> RawDataset:
    """Read the official COCO caption files and assign splits from ``split_file``."""
    if not files:
        raise UserError("--annotations needs at least one captions_*.json file")
    split_path = need_file(split_file, "--split-file")
    splits = read_split_file(split_path)
    inputs = [split_path]
    by_id: dict[int, RawImage] = {}
    order: list[int] = []
    for f in files:
        path = need_file(f, "--annotations")
        inputs.append(path)
        data = read_json(path, text_only=True)
        for k, img in enumerate(need(data, "images", path, "top level", list)):
            where = f"images[{k}]"
            cocoid = need(img, "id", path, where, int)
            filename = need(img, "file_name", path, where, str)
            if cocoid in by_id:
                raise UserError(f"{path}: {where}: duplicate image id {cocoid} (also at "
                                f"{by_id[cocoid].where})")
            m = re.match(r"COCO_((?:train|val|test)\d{4})_", filename)
            by_id[cocoid] = RawImage(key=str(cocoid), split="", filename=filename,
                                     filepath=m.group(1) if m else None, cocoid=cocoid,
                                     where=f"{path}: {where}")
            order.append(cocoid)
        for where, cocoid, ann_id, caption in caption_annotations(data, path):
            if cocoid not in by_id:
                raise UserError(f"{path}: {where}: image_id {cocoid} is not in any file's 'images'")
            by_id[cocoid].captions.append(RawCaption("en", caption, ann_id))
    out: list[RawImage] = []
    excluded = {"restval_images": 0, "images_without_split": 0}
    for cocoid in order:
        im = by_id[cocoid]
        ksplit = splits.get(cocoid) or splits.get(im.filename)
        if ksplit is None:
            excluded["images_without_split"] += 1
            continue
        split = _split_of(ksplit, restval)
        if split is None:
            excluded["restval_images"] += 1
            continue
        im.split = split
        im.karpathy_split = "restval" if ksplit == "restval" else None
        out.append(im)
    return RawDataset(name="coco", languages=["en"], images=out,
                      images_root=need_dir(images, "--images") if images is not None else Path.cwd(),
                      inputs=inputs, excluded={k: v for k, v in excluded.items() if v})


def read_split_file(path: Path) -> dict[Any, str]:
    """COCO id (and file name) -> Karpathy split, from a Karpathy JSON or a ``{split: [ids]}`` JSON."""
    data = read_json(path, text_only=True)
    out: dict[Any, str] = {}
    if isinstance(data, dict) and "images" in data:
        for k, img in enumerate(need(data, "images", path, "top level", list)):
            where = f"images[{k}]"
            split = need(img, "split", path, where, str)
            if split not in KARPATHY_SPLITS:
                raise UserError(f"{path}: {where}: unknown split '{split}'")
            out[need(img, "cocoid", path, where, int)] = split
            if "filename" in img:
                out[need(img, "filename", path, where, str)] = split
        return out
    if not isinstance(data, dict) or not set(data) <= set(KARPATHY_SPLITS):
        raise UserError(f"{path}: expected a Karpathy JSON or an object with keys among "
                        f"{', '.join(KARPATHY_SPLITS)}")
    for split, ids in data.items():
        if not isinstance(ids, list):
            raise UserError(f"{path}: '{split}': expected a list of COCO ids or file names")
        for k, ident in enumerate(ids):
            check_id(ident, path, f"{split}[{k}]", "id")
            if ident in out:
                raise UserError(f"{path}: {split}[{k}]: {ident!r} is listed twice")
            out[ident] = split
    return out


def coco_id_from_filename(filename: str) -> int:
    """The COCO id in a file name such as ``COCO_train2014_000000172406.jpg``."""
    m = _COCO_ID.search(filename)
    if not m:
        raise UserError(f"cannot parse a COCO id from the file name '{filename}'")
    return int(m.group(1))


def read_flat(train: str | os.PathLike, val: str | os.PathLike, images: str | os.PathLike | None,
              val_images: int = 100) -> RawDataset:
    """Read flat caption lists (``coco_sample``'s ``train.json`` / ``val.json``) as a Karpathy file.

    See :func:`karpathy_from_flat` for the split rule; ``images`` defaults to the folder ``images``
    next to ``train``.
    """
    train, val = need_file(train, "--flat"), need_file(val, "--flat")
    data = karpathy_from_flat(train, val, val_images=val_images)
    if images is None:
        images = train.resolve().parent / "images"
    return read_karpathy(train, images, name="coco", data=data, inputs=[train, val])


def karpathy_from_flat(train: str | os.PathLike, val: str | os.PathLike, out: str | os.PathLike | None = None,
                       val_images: int = 100) -> dict[str, Any]:
    """A Karpathy-schema dict from flat ``[{image_path, caption, image_id}]`` lists (``coco_sample``).

    Every image of ``train`` goes to "train"; of ``val``'s images, in order of first appearance,
    the first ``val_images`` go to "val" and the rest to "test". COCO ids come from the file names;
    images have no ``filepath`` (they all lie in one folder). Written to ``out`` when given.
    """
    images: list[dict[str, Any]] = []
    index: dict[str, dict[str, Any]] = {}
    sentid = 0
    for file, kind in ((Path(train), "train"), (Path(val), "val")):
        rows = read_json(file, text_only=True)
        if not isinstance(rows, list):
            raise UserError(f"{file}: expected a list of {{image_path, caption, image_id}}")
        seen_here = 0
        for k, row in enumerate(rows):
            where = f"[{k}]"
            filename = os.path.basename(need(row, "image_path", file, where, str))
            caption = need(row, "caption", file, where, str)
            img = index.get(filename)
            if img is None:
                split = kind if kind == "train" else ("val" if seen_here < val_images else "test")
                seen_here += 1
                img = {"filename": filename, "imgid": len(images), "split": split,
                       "cocoid": coco_id_from_filename(filename), "sentids": [], "sentences": []}
                index[filename] = img
                images.append(img)
            img["sentids"].append(sentid)
            img["sentences"].append({"raw": caption, "tokens": caption.lower().split(),
                                     "imgid": img["imgid"], "sentid": sentid})
            sentid += 1
    data = {"dataset": "coco", "images": images}
    if out is not None:  # a file the caller names: never one of the inputs, nor inside a toolkit artifact
        check_output_file(out, inputs=[train, val], overwrite=True, option="out")
        write_json_atomic(out, data, indent=None)
    return data
