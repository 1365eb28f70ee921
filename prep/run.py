"""The ``prep`` stage for one validated :class:`~prep.settings.PrepSection` (``docs/ARCHITECTURE.md``).

:func:`run_prep` checks ``--out``, reads the source (:func:`prep.build.read_source`), builds the
dataset (:func:`prep.build.build_dataset`), the train-only vocabularies and the ``prep.json`` record,
and writes everything into a temporary folder that replaces ``--out`` only when all of it succeeded.
``--out`` is replaced only when it is a prepared dataset (the ``.vse-prepared`` marker) and
``--overwrite`` is given, never when it is, holds or lies inside an input (:func:`check_out`,
:func:`check_not_input`). The pipeline runner and the tests call it; :mod:`prep.cli` only parses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prep import __version__
from prep.build import (
    LIST_FIRST,
    build_dataset,
    find_missing_images,
    read_source,
    split_counts,
)
from prep.dataset import (
    FORMAT_VERSION,
    SPLITS,
    input_record,
    write_prepared_files,
)
from prep.out_checks import _given_inputs, _os_error, check_not_input, check_out
from prep.settings import PrepSection
from prep.sources import RawDataset
from prep.vocab import build_char_vocabulary, build_word_vocabulary, check_coverage
from vsecore import console
from vsecore.console import progress
from vsecore.errors import UserError
from vsecore.io import (
    atomic_directory,
    exclusive_lock,
    remove_stale_siblings,
)
from vsecore.outputs import check_output_folder


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
            "inputs": [input_record(p) for p in progress(raw.inputs, desc="checksums", unit="file")],
            "options": settings.model_dump(mode="json"), "images_root": str(raw.images_root),
            "counts": counts, "dropped": drops["counts"], "dropped_first": drops["first_empty_captions"],
            "repaired": drops["repaired"], "repaired_first": drops["first_repaired"],
            "excluded": raw.excluded,
            "missing_images": {"count": len(missing), "first": missing[:LIST_FIRST]},
            "notes": raw.notes, "vocabulary": {"chars": len(chars["symbols"]), "words": len(words["tokens"])},
        }
        write_prepared_files(work, dataset, chars, words, record)
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
