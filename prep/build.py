"""Raw dataset -> the content of ``dataset.json``: the work of ``prep`` between reading and writing.

:func:`read_source` dispatches to the dataset's reader (:mod:`prep.sources`); :func:`build_dataset`
cleans the captions (Unicode NFKC, whitespace collapsed; empty ones dropped and counted), checks ids
and image paths, tokenizes (spaCy blank tokenizers; Japanese transliterated to Hepburn romaji) and
keeps the first 5 captions of a COCO image (:func:`caption_limit`); :func:`find_missing_images` looks
for the images on disk. :func:`prep.run.run_prep` writes the result.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from prep.dataset import FORMAT_VERSION, SPLITS
from prep.settings import PrepSection
from prep.sources import RawCaption, RawDataset, RawImage
from prep.tokenize import lone_surrogate, normalize, strip_controls, tokenize, transliterate
from vsecore.console import progress
from vsecore.errors import UserError

#: how many dropped captions / missing images are listed by name in the summary and ``prep.json``
LIST_FIRST = 10
_TOKENIZE_CHUNK = 5000


def read_source(settings: PrepSection, work_dir: Path | None) -> RawDataset:
    """Dispatch to the dataset's reader (``work_dir``: where generated images go; synthetic only)."""
    s = settings
    if s.dataset == "coco":
        from prep.sources.coco import read_annotations, read_flat, read_karpathy

        if sum([s.karpathy is not None, bool(s.annotations), bool(s.flat)]) != 1:
            raise UserError("prep coco: give one of --karpathy FILE, --annotations FILE... "
                            "--split-file FILE, or --flat TRAIN.json VAL.json")
        if s.flat:
            if len(s.flat) != 2:
                raise UserError("prep coco: --flat takes two files: TRAIN.json VAL.json")
            return read_flat(s.flat[0], s.flat[1], s.images, s.flat_val_images)
        if s.karpathy is not None:
            return read_karpathy(s.karpathy, s.images, restval=s.restval, name="coco")
        return read_annotations(s.annotations, s.split_file, s.images, restval=s.restval)
    if s.dataset == "f8k":
        from prep.sources.flickr import read_f8k, read_flickr_karpathy

        if (s.karpathy is None) == (s.token_file is None):
            raise UserError("prep f8k: give either --token-file FILE (with the split lists) or "
                            "--karpathy FILE")
        if s.karpathy is not None:
            return read_flickr_karpathy(s.karpathy, s.images, "f8k")
        return read_f8k(s.token_file, s.split_dir, s.images)
    if s.dataset == "f30k":
        from prep.sources.flickr import read_flickr_karpathy

        return read_flickr_karpathy(s.karpathy, s.images, "f30k")
    if s.dataset == "multi30k":
        from prep.sources.multi30k import read_multi30k

        return read_multi30k(s.root, s.images)
    if s.dataset == "yjcaptions":
        from prep.sources.yjcaptions import read_yjcaptions

        return read_yjcaptions(s.yj, s.coco_karpathy, s.images, s.val_images, s.test_images, s.seed)
    if s.dataset == "karpathy":
        from prep.sources.coco import read_karpathy

        if s.karpathy is None:
            raise UserError("prep karpathy: --karpathy FILE is required (your dataset in the Karpathy split "
                            "schema; see the README, 'Your own data')")
        return read_karpathy(s.karpathy, s.images, restval=s.restval, name=s.name, lang=s.lang)
    from prep.sources.synthetic import generate_synthetic

    if work_dir is None:
        raise ValueError("synthetic: the folder to draw the images into is required")
    return generate_synthetic(work_dir, s.num_images, s.image_size, s.captions_per_image, s.languages, s.seed)


class TextCleaner:
    """Normalizes texts (captions, or ``noun``: a classification dataset's texts), drops empty ones
    (counted as ``empty_{noun}s``) and tokenizes captions, batched per language."""

    def __init__(self, lowercase: bool, noun: str = "caption") -> None:
        self.lowercase, self.noun = lowercase, noun
        self.dropped: Counter = Counter()
        self.dropped_first: list[str] = []
        self.repaired: Counter = Counter()
        self.repaired_first: list[str] = []

    def clean(self, text: Any, where: str) -> str | None:
        """The text as every stage sees it (:func:`prep.tokenize.normalize`), ``None`` when empty.

        A lone surrogate (no valid Unicode text) is an error naming the text; ANSI escape sequences,
        control characters and invisible format characters (bidirectional overrides, zero-width spaces:
        :func:`prep.tokenize.strip_controls`) are removed and the text counted as repaired
        (``repaired.control_characters`` in ``prep.json``).
        """
        if not isinstance(text, str):
            raise UserError(f"{where}: {self.noun} must be a string, got {type(text).__name__}")
        if not text.isprintable():  # the rare text with a control, a surrogate or a tab: look closer
            at = lone_surrogate(text)
            if at is not None:
                raise UserError(f"{where}: {self.noun} holds a lone surrogate (U+{ord(text[at]):04X}) at "
                                f"character {at}, which is not Unicode text; fix the source file")
            text, removed = strip_controls(text)
            if removed:
                self.repaired["control_characters"] += 1
                if len(self.repaired_first) < LIST_FIRST:
                    self.repaired_first.append(where)
        text = normalize(text)
        if not text:
            self.dropped[f"empty_{self.noun}s"] += 1
            if len(self.dropped_first) < LIST_FIRST:
                self.dropped_first.append(where)
            return None
        return text

    def tokenize(self, items: list[tuple[str, str]], desc: str) -> list[tuple[str, list[str], str | None]]:
        """``(raw, tokens, original)`` of each ``(lang, text)``; Japanese ``raw`` is the romaji."""
        out: list[Any] = [None] * len(items)
        with progress(total=len(items), desc=desc, unit="sent") as bar:
            for lang in sorted({lg for lg, _ in items}):
                rows = [i for i, (lg, _) in enumerate(items) if lg == lang]
                if lang == "ja":
                    cache: dict[str, tuple[str, list[str]]] = {}
                    for i in rows:
                        text = items[i][1]
                        if text not in cache:
                            cache[text] = transliterate(text, self.lowercase)
                        raw, toks = cache[text]
                        out[i] = (raw, toks, text)
                        bar.update(1)
                    continue
                for start in range(0, len(rows), _TOKENIZE_CHUNK):
                    chunk = rows[start:start + _TOKENIZE_CHUNK]
                    toks = tokenize([items[i][1] for i in chunk], lang, self.lowercase)
                    for i, t in zip(chunk, toks, strict=True):
                        out[i] = (items[i][1], t, None)
                    bar.update(len(chunk))
        return out


def caption_limit(settings: PrepSection) -> int | None:
    """Captions kept per image and language: the first ``captions_per_image`` for COCO, else all.

    VSE++, SCAN and the papers reproduced here use exactly 5 captions per COCO image; Karpathy's
    file gives a few images 6 or 7. ``all_captions`` keeps them all. Other datasets are never cut.
    """
    if settings.dataset != "coco" or settings.all_captions:
        return None
    return settings.captions_per_image


def check_image_path(im: RawImage) -> None:
    """A :class:`UserError` unless the image's ``filepath``/``filename`` stay inside the images root.

    Every later stage opens ``images_root/filepath/filename``. The paths are written in an annotation,
    split or token file, which comes from elsewhere: an absolute path or a ``..`` component (even one
    that would normalise back inside) could reach outside the folder given as ``--images``, so both
    are refused as written, before any file is looked at. Symbolic links inside ``--images`` are the
    user's and are followed (:func:`find_missing_images`). A NUL character names no file at all.
    """
    for key, value in (("filepath", im.filepath), ("filename", im.filename)):
        if value is None and key == "filepath":
            continue
        if not isinstance(value, str) or not value:
            raise UserError(f"{im.where}: {key} must be a non-empty string, got {value!r}")
        if "\0" in value:
            raise UserError(f"{im.where}: {key} {value!r} holds a NUL character, which no file name can hold")
        if PurePosixPath(value).is_absolute() or PureWindowsPath(value).anchor:
            raise UserError(f"{im.where}: {key} {value!r} is an absolute path; image paths written in "
                            f"annotation files must be relative to --images")
        if ".." in PurePosixPath(value.replace("\\", "/")).parts:
            raise UserError(f"{im.where}: {key} {value!r} has a '..' component; image paths written in "
                            f"annotation files must stay inside --images")


def _kept_captions(raw: RawDataset, cleaner: TextCleaner, limit: int | None
                   ) -> tuple[list[tuple[str, str]], list[tuple[int, RawCaption]]]:
    """``(lang, cleaned text)`` of every caption kept and ``(image row, caption)`` of each, in order; ids,
    splits and image paths checked; empty captions and those beyond ``limit`` per language dropped."""
    seen_images: dict[str, str] = {}
    seen_sent: dict[tuple[str, Any], str] = {}
    texts: list[tuple[str, str]] = []
    owners: list[tuple[int, RawCaption]] = []
    for row, im in enumerate(raw.images):
        if im.key in seen_images:
            raise UserError(f"{im.where}: duplicate image id '{im.key}' (also {seen_images[im.key]})")
        seen_images[im.key] = im.where
        if im.split not in SPLITS:
            raise UserError(f"{im.where}: unknown split '{im.split}'")
        check_image_path(im)
        kept: Counter = Counter()
        for k, cap in enumerate(im.captions):
            where = f"{im.where}: caption {k}"
            if cap.source_id is not None:
                where += f" (id {cap.source_id})"
                key = (cap.lang, cap.source_id)
                if key in seen_sent:
                    raise UserError(f"{where}: duplicate sentence id {cap.source_id!r} (also "
                                    f"{seen_sent[key]})")
                seen_sent[key] = where
            text = cleaner.clean(cap.text, where)
            if text is None:
                continue
            if limit is not None and kept[cap.lang] >= limit:
                cleaner.dropped[f"captions_beyond_{limit}"] += 1
                continue
            kept[cap.lang] += 1
            texts.append((cap.lang, text))
            owners.append((row, cap))
    return texts, owners


def _image_entry(row: int, im: RawImage) -> dict[str, Any]:
    """The ``dataset.json`` entry of an image, before its sentences."""
    entry: dict[str, Any] = {"imgid": row, "split": im.split, "filename": im.filename}
    if im.filepath:
        entry["filepath"] = im.filepath
    if im.cocoid is not None:
        entry["cocoid"] = im.cocoid
    if im.karpathy_split:
        entry["karpathy_split"] = im.karpathy_split
    entry["sentids"], entry["sentences"] = [], []
    return entry


def build_dataset(raw: RawDataset, settings: PrepSection) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(dataset.json content, record of drops)`` from a source's images, captions and pairs.

    Captions beyond :func:`caption_limit` (the first ones in the source's order that are not
    empty are kept) are dropped and counted as ``captions_beyond_K``.
    """
    cleaner = TextCleaner(settings.lowercase)
    texts, owners = _kept_captions(raw, cleaner, caption_limit(settings))
    tokenized = cleaner.tokenize(texts, "tokenizing captions")
    images = [_image_entry(row, im) for row, im in enumerate(raw.images)]
    sentid_of: dict[int, dict[str, Any]] = {}
    for sentid, ((row, cap), (text, toks, original)) in enumerate(zip(owners, tokenized, strict=True)):
        if not toks:  # e.g. Japanese punctuation only: nothing a model could read
            cleaner.dropped["empty_captions"] += 1
            continue
        sent = {"sentid": sentid, "imgid": row, "raw": text, "tokens": toks, "lang": cap.lang}
        if original is not None:
            sent["original"] = original
        images[row]["sentids"].append(sentid)
        images[row]["sentences"].append(sent)
        sentid_of[id(cap)] = sent
    pairs = _build_pairs(raw, images, sentid_of, cleaner, {im.key: r for r, im in enumerate(raw.images)})
    dataset = {"dataset": raw.name, "format_version": FORMAT_VERSION, "languages": raw.languages,
               "images_root": str(raw.images_root), "images": images, "pairs": pairs}
    drops = {"counts": dict(cleaner.dropped), "first_empty_captions": cleaner.dropped_first,
             "repaired": dict(cleaner.repaired), "first_repaired": cleaner.repaired_first}
    return dataset, drops


def _build_pairs(raw: RawDataset, images: list[dict[str, Any]], sentid_of: dict[int, dict[str, Any]],
                 cleaner: TextCleaner, row_of: dict[str, int]) -> list[dict[str, Any]]:
    pending: list[tuple[int, dict[str, Any]]] = []
    texts: list[tuple[str, str]] = []
    slots: list[tuple[int, str]] = []
    for p in raw.pairs:
        row = row_of[p.image_key]
        sides: dict[str, Any] = {}
        ok = True
        for lang, side in p.sides.items():
            if isinstance(side, RawCaption):
                sent = sentid_of.get(id(side))
                if sent is None:
                    ok = False
                    break
                sides[lang] = {k: sent[k] for k in ("raw", "tokens", "sentid", "original") if k in sent}
            else:
                text = cleaner.clean(side, f"{p.where}: pair {lang}")
                if text is None:
                    ok = False
                    break
                sides[lang] = None
                texts.append((lang, text))
                slots.append((len(pending), lang))
        if not ok:
            cleaner.dropped["pairs"] += 1
            continue
        pending.append((row, sides))
    tokenized = cleaner.tokenize(texts, "tokenizing pairs")
    for (k, lang), (text, toks, original) in zip(slots, tokenized, strict=True):
        side = {"raw": text, "tokens": toks}
        if original is not None:
            side["original"] = original
        pending[k][1][lang] = side
    return [{"pairid": i, "imgid": row, "split": images[row]["split"], **sides}
            for i, (row, sides) in enumerate(pending)]


def find_missing_images(dataset: dict[str, Any], root: Path) -> list[str]:
    """Relative paths (``filepath/filename``) of the images that are not regular files under ``root``.

    Symbolic links under ``root`` are followed, to folders and to files alike, wherever they point:
    ``root`` is the folder the user chose as ``--images`` and its links are theirs (``ROOT/val2014 ->
    /datasets/coco/val2014`` is how one COCO download is shared). What may not leave ``root`` is a path
    written in an annotation file; :func:`check_image_path` refused those before. A dangling link, a
    folder or another file that is not regular (a FIFO, a device) counts as missing.
    """
    missing = []
    for im in progress(dataset["images"], desc="checking images", unit="img"):
        rel = f"{im['filepath']}/{im['filename']}" if im.get("filepath") else im["filename"]
        try:
            regular = stat.S_ISREG(os.stat(root / rel).st_mode)
        except OSError:
            regular = False
        if not regular:
            missing.append(rel)
    return missing


def split_counts(dataset: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Images, sentences (in all and per language) and pairs of each split."""
    counts: dict[str, dict[str, Any]] = {
        sp: {"images": 0, "sentences": 0, "sentences_per_language": Counter(), "pairs": 0} for sp in SPLITS}
    for im in dataset["images"]:
        c = counts[im["split"]]
        c["images"] += 1
        c["sentences"] += len(im["sentences"])
        c["sentences_per_language"].update(s["lang"] for s in im["sentences"])
    for p in dataset["pairs"]:
        counts[p["split"]]["pairs"] += 1
    for c in counts.values():
        c["sentences_per_language"] = dict(sorted(c["sentences_per_language"].items()))
    return counts
