"""Readers of the raw annotation formats, one module per dataset, and what they hand to ``prep``.

Each reader turns its raw files into a :class:`RawDataset`: images with their split and captions
as written (before cleaning and tokenization), optional cross-language pairs, the input files to
record, and what it dropped or excluded. :func:`prep.run.run_prep` then cleans, tokenizes, checks
and writes it in the prepared-dataset format.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vsecore.errors import UserError
from vsecore.io import MAX_TEXT_BYTES, regular_file_size


@dataclass
class RawCaption:
    """A caption as the source wrote it (Japanese in kana/kanji; transliterated later)."""

    lang: str
    text: Any
    source_id: Any = None


@dataclass
class RawImage:
    """An image of the source: ``key`` is its unique id there (duplicates are an error)."""

    key: str
    split: str
    filename: str
    filepath: str | None = None
    cocoid: int | None = None
    karpathy_split: str | None = None
    captions: list[RawCaption] = field(default_factory=list)
    #: where the image came from in the input, for error messages ("FILE: images[12]")
    where: str = ""


@dataclass
class RawPair:
    """A cross-language pair on one image (``sides``: language -> text, or the image's caption)."""

    image_key: str
    sides: dict[str, Any]
    where: str = ""


@dataclass
class RawDataset:
    """Everything a source reader found; cleaned, tokenized and written by ``prep``."""

    name: str
    languages: list[str]
    images: list[RawImage]
    images_root: Path
    inputs: list[Path]
    pairs: list[RawPair] = field(default_factory=list)
    #: counts of items excluded on purpose (e.g. ``{"restval_images": 30504}``)
    excluded: dict[str, int] = field(default_factory=dict)
    #: settings the reader chose that must be recorded (e.g. the split seed)
    notes: dict[str, Any] = field(default_factory=dict)


def check_id(value: Any, file: str | os.PathLike, where: str, key: str) -> Any:
    """``value`` if it can be an id (an int, a string or ``None``); else a one-line :class:`UserError`.

    Ids are compared and hashed (duplicates are looked up), so a list or an object there would
    otherwise fail deep inside ``prep`` with a traceback.
    """
    if value is None or isinstance(value, str) or isinstance(value, int) and not isinstance(value, bool):
        return value
    raise UserError(f"{file}: {where}: field '{key}' must be an integer or a string id, "
                    f"got {type(value).__name__} {json.dumps(value)[:40]}")


def need(obj: Any, key: str, file: str | os.PathLike, where: str, kind: type | tuple[type, ...] | None = None
         ) -> Any:
    """``obj[key]``, or a one-line :class:`UserError` ``FILE: where: missing field 'key'``."""
    if not isinstance(obj, dict):
        raise UserError(f"{file}: {where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise UserError(f"{file}: {where}: missing field '{key}'")
    value = obj[key]
    if kind is not None and not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise UserError(f"{file}: {where}: field '{key}' must be {names}, got {type(value).__name__}")
    return value


def caption_annotations(data: Any, file: str | os.PathLike, id_kind: type | None = int
                        ) -> Iterator[tuple[str, int, Any, Any]]:
    """``(where, image_id, annotation id, caption)`` of each entry of a COCO-format caption file.

    Missing fields and a repeated annotation id are one-line :class:`UserError` naming the file
    and the entry (``annotations[k]``).
    """
    seen: dict[Any, str] = {}
    for k, ann in enumerate(need(data, "annotations", file, "top level", list)):
        where = f"annotations[{k}]"
        image_id = need(ann, "image_id", file, where, int)
        ann_id = check_id(need(ann, "id", file, where, id_kind), file, where, "id")
        caption = need(ann, "caption", file, where)
        if ann_id in seen:
            raise UserError(f"{file}: {where}: duplicate annotation id {ann_id} (also at {seen[ann_id]})")
        seen[ann_id] = where
        yield where, image_id, ann_id, caption


def need_file(path: str | os.PathLike | None, option: str) -> Path:
    """The existing file given by ``option``; a :class:`UserError` if absent or missing."""
    if path is None:
        raise UserError(f"{option} is required")
    p = Path(path).expanduser()
    if not os.path.exists(p):
        raise UserError(f"{p}: no such file (given by {option})")
    regular_file_size(p, MAX_TEXT_BYTES, f"the file given by {option}")
    return p


def need_dir(path: str | os.PathLike | None, option: str) -> Path:
    """The existing folder given by ``option``; a :class:`UserError` if absent or missing."""
    if path is None:
        raise UserError(f"{option} is required")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise UserError(f"{p}: no such folder (given by {option})")
    return p.resolve()
