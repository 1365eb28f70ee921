"""``prep <dataset>``: raw annotations -> prepared dataset (see ``docs/ARCHITECTURE.md``).

:func:`run_prep` is the whole stage for one validated :class:`~pipelines.schema.PrepSection`: read the
source, clean the captions (Unicode NFKC, whitespace collapsed; empty ones dropped and counted),
check ids, tokenize (spaCy blank tokenizers; Japanese transliterated to Hepburn romaji), look for the
images on disk, build the train-only vocabularies and write everything into a temporary folder that
replaces ``--out`` only when all of it succeeded. COCO keeps the first 5 captions of an image
(:func:`caption_limit`). ``--out`` is replaced only when it is a prepared dataset (the
``.vse-prepared`` marker) and ``--overwrite`` is given, never when it is, holds or lies inside an
input (:func:`check_out`, :func:`check_not_input`).
"""

from __future__ import annotations

import sys

from vsecore.errors import interrupted_while_loading

# Ctrl-C while these modules load (a fifth of a second, mostly pydantic) ends like any other
# interruption of prep: one line and status 130, for `python -m prep` and for the `prep` script alike.
with interrupted_while_loading("prep"):
    import argparse
    import errno
    import os
    import stat
    from collections import Counter
    from collections.abc import Sequence
    from pathlib import Path, PurePosixPath, PureWindowsPath
    from typing import Any

    from pipelines.schema import PrepSection, add_pipeline_arguments, stage_settings
    from prep import __version__
    from prep.dataset import (
        CHARS_FILE,
        DATASET_FILE,
        FORMAT_VERSION,
        MARKER_FILE,
        RECORD_FILE,
        SPLITS,
        WORDS_FILE,
        foreign_entries,
        is_prepared_dataset,
    )
    from prep.sources import RawCaption, RawDataset, RawImage
    from prep.tokenize import lone_surrogate, normalize, strip_controls, tokenize, transliterate
    from prep.vocab import build_char_vocabulary, build_word_vocabulary, check_coverage
    from vsecore import console
    from vsecore.console import progress
    from vsecore.errors import UserError, add_common_options, run_cli
    from vsecore.io import (
        atomic_directory,
        exclusive_lock,
        remove_stale_siblings,
        sha256_file,
        write_json_atomic,
    )
    from vsecore.outputs import check_output_folder

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


class _Cleaner:
    """Normalizes caption texts, drops empty ones (counted) and tokenizes them, batched per language."""

    def __init__(self, lowercase: bool) -> None:
        self.lowercase = lowercase
        self.dropped: Counter = Counter()
        self.dropped_first: list[str] = []
        self.repaired: Counter = Counter()
        self.repaired_first: list[str] = []

    def clean(self, text: Any, where: str) -> str | None:
        """The caption as every stage sees it (:func:`prep.tokenize.normalize`), ``None`` when empty.

        A lone surrogate (no valid Unicode text) is an error naming the caption; ANSI escape sequences
        and control characters are removed and the caption counted as repaired
        (``repaired.control_characters`` in ``prep.json``).
        """
        if not isinstance(text, str):
            raise UserError(f"{where}: caption must be a string, got {type(text).__name__}")
        if not text.isprintable():  # the rare caption with a control, a surrogate or a tab: look closer
            at = lone_surrogate(text)
            if at is not None:
                raise UserError(f"{where}: caption holds a lone surrogate (U+{ord(text[at]):04X}) at "
                                f"character {at}, which is not Unicode text; fix the source file")
            text, removed = strip_controls(text)
            if removed:
                self.repaired["control_characters"] += 1
                if len(self.repaired_first) < LIST_FIRST:
                    self.repaired_first.append(where)
        text = normalize(text)
        if not text:
            self.dropped["empty_captions"] += 1
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

    Every later stage opens ``images_root/filepath/filename``; an absolute path or a ``..``
    component would reach outside the folder given as ``--images``.
    """
    for key, value in (("filepath", im.filepath), ("filename", im.filename)):
        if value is None and key == "filepath":
            continue
        if not isinstance(value, str) or not value:
            raise UserError(f"{im.where}: {key} must be a non-empty string, got {value!r}")
        if PurePosixPath(value).is_absolute() or PureWindowsPath(value).anchor:
            raise UserError(f"{im.where}: {key} '{value}' is an absolute path; image paths must be "
                            f"relative to --images")
        if ".." in PurePosixPath(value.replace("\\", "/")).parts:
            raise UserError(f"{im.where}: {key} '{value}' has a '..' component; image paths must stay "
                            f"inside --images")


def build_dataset(raw: RawDataset, settings: PrepSection) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(dataset.json content, record of drops)`` from a source's images, captions and pairs.

    Captions beyond :func:`caption_limit` (the first ones in the source's order that are not
    empty are kept) are dropped and counted as ``captions_beyond_K``.
    """
    cleaner = _Cleaner(settings.lowercase)
    limit = caption_limit(settings)
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
            if cap.source_id is not None:
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
    tokenized = cleaner.tokenize(texts, "tokenizing captions")
    images = []
    for row, im in enumerate(raw.images):
        entry: dict[str, Any] = {"imgid": row, "split": im.split, "filename": im.filename}
        if im.filepath:
            entry["filepath"] = im.filepath
        if im.cocoid is not None:
            entry["cocoid"] = im.cocoid
        if im.karpathy_split:
            entry["karpathy_split"] = im.karpathy_split
        entry["sentids"], entry["sentences"] = [], []
        images.append(entry)
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
                 cleaner: _Cleaner, row_of: dict[str, int]) -> list[dict[str, Any]]:
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
    """Relative paths (``filepath/filename``) of the images not found under ``root``.

    An image reached through a symbolic link (the file itself, or a folder of its ``filepath``) whose
    target lies outside ``root`` is refused like a ``..`` component (:func:`check_image_path`):
    every later stage would read a file from outside the folder given as ``--images``.
    """
    real_root = Path(os.path.realpath(root))
    folders: dict[str, Path] = {}  # filepath -> its real folder (resolved once per folder)
    missing = []
    for im in progress(dataset["images"], desc="checking images", unit="img"):
        rel = f"{im['filepath']}/{im['filename']}" if im.get("filepath") else im["filename"]
        folder, name = os.path.split(rel)  # a file name may hold folders too
        if folder not in folders:
            folders[folder] = Path(os.path.realpath(root / folder))
            _check_inside(root / folder, folders[folder], real_root, rel)
        path = folders[folder] / name
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            missing.append(rel)
            continue
        if stat.S_ISLNK(mode):
            _check_inside(root / rel, Path(os.path.realpath(path)), real_root, rel)
            if not path.is_file():
                missing.append(rel)
        elif not stat.S_ISREG(mode):
            missing.append(rel)
    return missing


def _check_inside(path: Path, real: Path, real_root: Path, rel: str) -> None:
    if real != real_root and real_root not in real.parents and os.path.lexists(path):
        raise UserError(f"{path}: image '{rel}' is reached through a symbolic link to {real}, outside the "
                        f"images folder {real_root}; image paths must stay inside --images (give --images "
                        f"a folder that holds the images themselves)")


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


def _given_inputs(settings: PrepSection) -> list[tuple[Path, str]]:
    """``(resolved path, option)`` of every input path the settings name."""
    out = []
    for key in PrepSection.path_fields:
        value = getattr(settings, key)
        if key == "out" or value is None:
            continue
        for v in value if isinstance(value, list) else [value]:
            out.append((Path(v).expanduser().resolve(), "--" + key.replace("_", "-")))
    return out


def check_not_input(out: Path, inputs: list[tuple[Path, str]], inside_ok: bool = False) -> None:
    """A :class:`UserError` if ``out`` is, contains or (unless ``inside_ok``) lies inside an input.

    ``--out`` is replaced as a whole, so an input inside it would be deleted, and one equal to it
    overwritten.
    """
    for path, option in inputs:
        if out == path or path.is_relative_to(out):
            raise UserError(f"{out}: --out must not be or contain an input of prep ({path}, given by "
                            f"{option})")
        if not inside_ok and out.is_relative_to(path):
            raise UserError(f"{out}: --out must not lie inside an input of prep ({path}, given by "
                            f"{option})")


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` whose replacement would lose anything but a prepared dataset.

    A missing or empty folder is used; a prepared dataset (:func:`prep.dataset.is_prepared_dataset`)
    is replaced only with ``overwrite``, and not when it also holds files prep does not write;
    anything else (a file, a folder of other things, a read-only folder) is an error and stays
    untouched.
    """
    if not (out.exists() or out.is_symlink()):
        return
    if not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder; give --out a new or empty folder")
    if is_prepared_dataset(out):
        foreign = foreign_entries(out)
        if foreign:
            raise UserError(f"{out}: a prepared dataset, but it also holds '{foreign[0]}', which prep did "
                            f"not write; refusing to replace it (move that away, or give another --out)")
        if not overwrite:
            raise UserError(f"{out}: already holds a prepared dataset; add --overwrite to replace it, "
                            f"or give another --out")
    elif any(out.iterdir()):
        raise UserError(f"{out}: exists, is not empty and is not a prepared dataset (no {MARKER_FILE}); "
                        f"refusing to replace it: give a new or empty folder as --out")
    if not os.access(out, os.W_OK):
        raise UserError(f"{out}: --out is read-only")


def _writes_out(name: Path, out: Path) -> bool:
    """Whether ``name`` is ``out``, a folder above it, or in a sibling prep writes (lock, temporary)."""
    if out.is_relative_to(name):
        return True
    if name == out.parent or not name.is_relative_to(out.parent):
        return False
    first = name.relative_to(out.parent).parts[0]
    return first == out.name or first.startswith(f".{out.name}.")


def _os_error(exc: OSError, out: Path) -> UserError | None:
    """One line for an ``OSError`` met while preparing ``out``: any failure to write ``--out`` (a
    read-only folder or file system, a full disk) or a permission denied on an input; ``None``
    for anything else (a bug: it keeps its traceback)."""
    why = exc.strerror or str(exc)
    if not exc.filename:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
            return UserError(f"{out}: cannot write --out ({why})")
        return None
    name = Path(exc.filename)
    if _writes_out(name, out):
        return UserError(f"{out}: cannot write --out ({why}: {name})")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return UserError(f"{name}: {why}")
    return None


def run_prep(settings: PrepSection, overwrite: bool = False) -> Path:
    """Prepare one dataset into ``settings.out`` (replaced only on success); returns the folder.

    ``--out`` is checked first (:func:`check_out`, :func:`check_not_input`; the source is read
    before anything is written, so that its files and images folder are checked too), then
    written under :func:`vsecore.io.exclusive_lock`: a second ``prep`` on the same folder is an
    error, and this one removes the temporary folders that killed runs left next to it.
    """
    if settings.dataset == "textcls":  # text classification: its own format (prep.textcls)
        from prep.textcls import run_textcls_prep

        return run_textcls_prep(settings, overwrite)
    out = Path(settings.out).expanduser().resolve()
    try:
        check_not_input(out, _given_inputs(settings))
        # the shared rules: not /, not a file, inside no store, run or other prepared dataset
        check_output_folder(out, (), owner=out)
        check_out(out, overwrite)
        raw = None
        if settings.dataset != "synthetic":  # synthetic draws its images into the new folder
            raw = read_source(settings, None)
            check_source_not_out(out, raw, settings)
        with exclusive_lock(out, "this prepared dataset"):
            check_out(out, overwrite)  # again, holding the lock: another run may have written it
            for stale in remove_stale_siblings(out):
                console.warning(f"prep: removed {stale.name} (left by a killed run)")
            record = _prepare(settings, out, raw)
    except OSError as exc:
        error = _os_error(exc, out)
        if error is None:
            raise
        raise error from None
    console.result(summary_line(settings.dataset, record, out))
    return out


def check_source_not_out(out: Path, raw: RawDataset, settings: PrepSection) -> None:
    """:func:`check_not_input` for the files a reader read and its images folder.

    ``--out`` may lie inside the images root only where that root is a guess (no ``--images``:
    the annotation file's folder or the working folder), not an images folder.
    """
    files = [p.resolve() for p in raw.inputs]
    check_not_input(out, [(p, "the source") for p in files])
    root = raw.images_root.resolve()
    guessed = settings.images is None and root in {p.parent for p in files} | {Path.cwd().resolve()}
    check_not_input(out, [(root, "the images root")], inside_ok=guessed)


def _prepare(settings: PrepSection, out: Path, raw: RawDataset | None) -> dict[str, Any]:
    """Build and write the dataset into a temporary folder that replaces ``out``; the record.

    ``raw``: the source, already read (``None``: synthetic, generated here into the folder).
    """
    with atomic_directory(out) as work:
        generated = raw is None
        if raw is None:
            raw = read_source(settings, work)
            raw.images_root = out  # the generated images move with the folder
        dataset, drops = build_dataset(raw, settings)
        missing = find_missing_images(dataset, work if generated else raw.images_root)
        if missing and settings.strict:
            raise UserError(f"{raw.images_root}: {len(missing)} of {len(dataset['images'])} images missing "
                            f"(first: {', '.join(missing[:3])}); drop --strict to prepare anyway")
        train = [s for im in dataset["images"] if im["split"] == "train" for s in im["sentences"]]
        if not train:
            raise UserError(f"prep {settings.dataset}: the train split has no captions")
        chars = build_char_vocabulary((s["raw"] for s in train), settings.min_char_count, settings.lowercase)
        words = build_word_vocabulary((s["tokens"] for s in train), settings.min_word_count)
        for vocabulary, total, what, option in (
                (chars, sum(len(s["raw"]) for s in train), "characters", "--min-char-count"),
                (words, sum(len(s["tokens"]) for s in train), "tokens", "--min-word-count")):
            warning = check_coverage(vocabulary, total, what, option)
            if warning:
                console.warning(f"prep: {warning}")
        counts = split_counts(dataset)
        record = {
            "format_version": FORMAT_VERSION, "prep_version": __version__, "dataset": raw.name,
            "inputs": [{"path": str(p.resolve()), "bytes": p.stat().st_size, "sha256": sha256_file(p)}
                       for p in progress(raw.inputs, desc="checksums", unit="file")],
            "options": settings.model_dump(mode="json"), "images_root": str(raw.images_root),
            "counts": counts, "dropped": drops["counts"], "dropped_first": drops["first_empty_captions"],
            "repaired": drops["repaired"], "repaired_first": drops["first_repaired"],
            "excluded": raw.excluded,
            "missing_images": {"count": len(missing), "first": missing[:LIST_FIRST]},
            "notes": raw.notes, "vocabulary": {"chars": len(chars["symbols"]), "words": len(words["tokens"])},
        }
        write_json_atomic(work / DATASET_FILE, dataset, indent=None)
        write_json_atomic(work / CHARS_FILE, chars)
        write_json_atomic(work / WORDS_FILE, words)
        write_json_atomic(work / RECORD_FILE, record)
        write_json_atomic(work / MARKER_FILE, {"format_version": FORMAT_VERSION, "prep_version": __version__})
    return record


def summary_line(name: str, record: dict[str, Any], out: Path) -> str:
    """One line: counts per split, pairs, dropped, missing images, output folder."""
    parts = []
    for sp in SPLITS:
        c = record["counts"][sp]
        parts.append(f"{sp} {c['images']} images / {c['sentences']} sentences")
    pairs = sum(record["counts"][sp]["pairs"] for sp in SPLITS)
    dropped = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in record["dropped"].items()) or "none"
    excluded = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in record["excluded"].items())
    miss = record["missing_images"]
    missing = f"{miss['count']} images missing" + (f" (first: {', '.join(miss['first'][:3])})"
                                                    if miss["count"] else "")
    repaired = ", ".join(f"{v} captions with {k.replace('_', ' ')} removed"
                         for k, v in record.get("repaired", {}).items())
    return (f"prep {name}: {'; '.join(parts)}; {pairs} pairs; dropped: {dropped}"
            + (f"; repaired: {repaired}" if repaired else "")
            + (f"; excluded: {excluded}" if excluded else "") + f"; {missing}; "
            f"{record['vocabulary']['chars']} chars, {record['vocabulary']['words']} words -> {out}")


# -- command line ------------------------------------------------------------------------------

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

    from prep.textcls import add_textcls_parser

    add_textcls_parser(sub, _common)


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
