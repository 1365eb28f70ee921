"""``prep textcls``: text classification files -> a prepared classification dataset, and its reader.

The folder has the same guarantees as every prepared dataset (``docs/ARCHITECTURE.md``): written
into a temporary sibling that replaces ``--out`` only on success, the ``--out`` rules of
:func:`prep.run.check_out`, the ``.vse-prepared`` marker, train-only ``chars.json`` / ``words.json``
(:mod:`prep.vocab`) and a ``prep.json`` record with the inputs' SHA-256. Its ``dataset.json`` is
not the Karpathy schema but::

    {"dataset": NAME, "task": "textcls", "format_version": 1, "labels": [class names],
     "languages": [...], "items": [{"id", "split", "label" (0-based), "text", "tokens", "lang",
     "source": "FILE:LINE"}, ...]}

``text`` is :func:`encoder_text` of the row (the Zhang files' escapes decoded, then cleaned as ``prep``
cleans captions: controls removed, Unicode NFKC, whitespace collapsed; the romaji for Japanese);
``tokens`` its words (lowercased when ``lowercase``). Rows whose text is empty are dropped and counted;
what was repaired is counted in ``prep.json`` (``repaired``: occurrences of each kind, ``repaired_texts``,
``repaired_first``), and ``text_repairs`` names the repair :func:`encoder_text` applied (``"zhang"`` or
``null``), so ``train predict`` reads a new text exactly as this dataset's texts were read.

Splits. The official train/test files are kept. The val split is carved from the train rows:
``val_fraction`` of them, stratified (each class gives the same fraction, the remainders going to
the classes with the largest fractional parts, so the total is ``round(fraction * rows)``) and
seeded. With a single file (``--test-fraction``), the test split is carved first, the same way,
and ``val_fraction`` is a fraction of the rows left.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prep import __version__
from prep.build import LIST_FIRST
from prep.dataset import (
    CHARS_FILE,
    DATASET_FILE,
    FORMAT_VERSION,
    PREPARED_FILE,
    RECORD_FILE,
    SPLITS,
    WORDS_FILE,
    Vocabulary,
    input_record,
    load_vocabulary,
    write_prepared_files,
)
from prep.settings import PrepSection
from prep.sources.textcls import (
    FIELD_SEPARATOR,
    RawText,
    read_classes,
    read_generic,
    read_zhang_csv,
    repair_escapes,
)
from prep.tokenize import lone_surrogate, normalize, strip_controls
from prep.vocab import build_char_vocabulary, build_word_vocabulary
from vsecore import console
from vsecore.errors import UserError
from vsecore.io import atomic_directory, exclusive_lock, remove_stale_siblings
from vsecore.jsonfile import read_json

TASK = "textcls"
#: ``text_repairs`` of a dataset whose texts went through :func:`prep.sources.textcls.repair_escapes`
ZHANG_REPAIRS = "zhang"


def encoder_text(text: str, repairs: str | None) -> tuple[str, Counter]:
    """A text as a classification encoder sees it (before its codec lowercases and cuts it): ``(text,
    repair counts)``. The one function ``prep textcls`` applies to every row and ``train predict`` to
    every new text.

    ``repairs``: :data:`ZHANG_REPAIRS` decodes the Zhang files' escapes
    (:func:`prep.sources.textcls.repair_escapes`), ``None`` none. Then control and invisible format
    characters are removed (``control_characters``) and :func:`prep.tokenize.normalize` runs (NFKC; tabs,
    new lines and runs of spaces become one space; stripped). A lone surrogate is a :class:`UserError`.
    """
    counts: Counter = Counter()
    if repairs == ZHANG_REPAIRS:
        text, counts = repair_escapes(text)
    elif repairs is not None:
        raise UserError(f"unknown text repairs {repairs!r} (this toolkit knows '{ZHANG_REPAIRS}')")
    if not text.isprintable():  # the rare text with a control, a surrogate or a tab: look closer
        at = lone_surrogate(text)
        if at is not None:
            raise UserError(f"the text holds a lone surrogate (U+{ord(text[at]):04X}) at character {at}, "
                            "which is not Unicode text")
        text, removed = strip_controls(text)
        if removed:
            counts["control_characters"] += removed
    return normalize(text), counts


def is_blank(text: str) -> bool:
    """Whether an :func:`encoder_text` holds nothing to classify: empty, or only field separators."""
    return not text.replace(FIELD_SEPARATOR, "").strip()


def stratified_take(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """A boolean mask over ``labels`` (N,) selecting ``round(fraction * N)`` rows, stratified by label.

    Each class gives ``floor(fraction * n_c)`` rows; the rows still missing go one each to the
    classes with the largest remainders (ties: lower label first). Within a class the rows are a
    random permutation drawn from ``rng`` (classes in ascending order), so the mask depends only on
    the labels, the fraction and the generator's seed.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    counts = np.array([(labels == c).sum() for c in classes])
    exact = fraction * counts
    take = np.floor(exact).astype(np.int64)
    missing = int(round(fraction * len(labels))) - int(take.sum())
    if missing > 0:
        order = sorted(range(len(classes)), key=lambda k: (-(exact[k] - take[k]), k))
        for k in order[:missing]:
            take[k] += 1
    mask = np.zeros(len(labels), dtype=bool)
    for c, n in zip(classes, take, strict=True):
        rows = np.flatnonzero(labels == c)
        mask[rows[rng.permutation(len(rows))[:n]]] = True
    return mask


def _label_indices(rows: list[RawText], names: list[str] | None) -> tuple[list[int], list[str]]:
    """0-based label of each row and the class names (generic files: sorted distinct names)."""
    if names is not None:
        return [int(r.label) for r in rows], names
    found = sorted({str(r.label) for r in rows})
    index = {n: k for k, n in enumerate(found)}
    return [index[str(r.label)] for r in rows], found


def read_textcls(s: PrepSection) -> tuple[list[RawText], list[str], list[int], list[str], list[Path]]:
    """``(rows, split of each row, 0-based label of each row, class names, input files)``, splits drawn."""
    if s.train_file is None and s.test_file is None:
        raise UserError("prep textcls: give --train FILE (and --test FILE, or --test-fraction F to split "
                        "one file)")
    if s.test_file is not None and s.test_fraction is not None:
        raise UserError("prep textcls: give --test FILE or --test-fraction, not both")
    single = s.train_file if s.train_file is not None else s.test_file
    if (s.train_file is None or s.test_file is None) and s.test_fraction is None:
        raise UserError(f"prep textcls: only one file ({single}); add --test-fraction F to carve the test "
                        "split from it, or give both --train and --test")
    inputs = [Path(p) for p in (s.train_file, s.test_file) if p is not None]
    names: list[str] | None = None
    if s.text_format == "zhang":
        if s.classes_file is None:
            default = inputs[0].parent / "classes.txt"
            if not default.is_file():
                raise UserError(f"prep textcls: --classes FILE is required ({default} not found)")
            classes_file = default
        else:
            classes_file = Path(s.classes_file)
        names = read_classes(classes_file)
        inputs.append(classes_file)

        def read(path: Path) -> list[RawText]:
            return read_zhang_csv(path, len(names))
    else:
        if not s.label_col or not s.text_cols:
            raise UserError(f"prep textcls --format {s.text_format}: --label-col and --text-cols are "
                            "required")

        def read(path: Path) -> list[RawText]:
            return read_generic(path, "\t" if s.text_format == "tsv" else ",", s.label_col, s.text_cols,
                                s.lang_col)
    rng = np.random.default_rng(s.seed)
    if s.train_file is not None and s.test_file is not None:
        train, test = read(Path(s.train_file)), read(Path(s.test_file))
        rows = train + test
        splits = ["train"] * len(train) + ["test"] * len(test)
    else:
        rows = read(Path(single))
        splits = ["train"] * len(rows)
    labels, names = _label_indices(rows, names)
    y = np.asarray(labels)
    split_arr = np.asarray(splits, dtype=object)
    if s.test_fraction is not None:
        split_arr[stratified_take(y, s.test_fraction, rng)] = "test"
    train_rows = np.flatnonzero(split_arr == "train")
    val = stratified_take(y[train_rows], s.val_fraction, rng)
    split_arr[train_rows[val]] = "val"
    return rows, [str(v) for v in split_arr], labels, names, inputs


def _tokenize(texts: list[str], langs: list[str], lowercase: bool, wheres: list[str]
              ) -> list[tuple[str, list[str]]]:
    """``(text, tokens)`` per row: en/de/ja as :mod:`prep.tokenize` (ja romanized), other languages with
    spaCy's blank tokenizer of that language (``wheres``: each row's ``FILE:LINE``, for the error of a
    language without one)."""
    from prep.tokenize import SUPPORTED, _blank, tokenize, transliterate
    from vsecore.console import progress

    out: list[Any] = [None] * len(texts)
    with progress(total=len(texts), desc="tokenizing", unit="text") as bar:
        for lang in sorted(set(langs)):
            rows = [i for i, lg in enumerate(langs) if lg == lang]
            try:
                _blank(lang)
            except UserError as exc:
                raise UserError(f"{wheres[rows[0]]}: language '{lang}' ({len(rows)} rows): {exc}") from None
            if lang == "ja":
                for i in rows:
                    out[i] = transliterate(texts[i], lowercase)
                    bar.update(1)
                continue
            for start in range(0, len(rows), 5000):
                chunk = rows[start:start + 5000]
                batch = [texts[i] for i in chunk]
                if lang in SUPPORTED:
                    toks = tokenize(batch, lang, lowercase)
                else:
                    nlp = _blank(lang)
                    toks = [[t.text for t in doc if not t.is_space]
                            for doc in nlp.tokenizer.pipe([b.lower() if lowercase else b for b in batch])]
                for i, t in zip(chunk, toks, strict=True):
                    out[i] = (texts[i], t)
                bar.update(len(chunk))
    return out


def build_textcls(s: PrepSection) -> tuple[dict[str, Any], dict[str, Any], list[Path]]:
    """``(dataset.json content, record parts, inputs)``: rows read, split, cleaned and tokenized."""
    rows, splits, labels, names, inputs = read_textcls(s)
    repairs = ZHANG_REPAIRS if s.text_format == "zhang" else None
    kept: list[tuple[RawText, str, str, str, int]] = []
    repaired: Counter = Counter()
    record: dict[str, Any] = {"text_repairs": repairs, "dropped": {}, "dropped_first": [], "repaired": {},
                              "repaired_texts": 0, "repaired_first": []}
    for row, split, label in zip(rows, splits, labels, strict=True):
        try:
            text, counts = encoder_text(row.text, repairs)
        except UserError as exc:
            raise UserError(f"{row.where}: {exc}; fix the source file") from None
        if counts:
            repaired.update(counts)
            record["repaired_texts"] += 1
            if len(record["repaired_first"]) < LIST_FIRST:
                record["repaired_first"].append(row.where)
        if is_blank(text):
            record["dropped"]["empty_texts"] = record["dropped"].get("empty_texts", 0) + 1
            if len(record["dropped_first"]) < LIST_FIRST:
                record["dropped_first"].append(row.where)
            continue
        kept.append((row, split, text, row.lang or s.lang, label))
    record["repaired"] = dict(sorted(repaired.items()))
    tokenized = _tokenize([k[2] for k in kept], [k[3] for k in kept], s.lowercase, [k[0].where for k in kept])
    items = []
    for n, ((row, split, _, lang, label), (text, toks)) in enumerate(zip(kept, tokenized, strict=True)):
        items.append({"id": n, "split": split, "label": label, "text": text, "tokens": toks, "lang": lang,
                      "source": row.where})
    languages = sorted({it["lang"] for it in items})
    dataset = {"dataset": s.name or _default_name(inputs[0]), "task": TASK, "format_version": FORMAT_VERSION,
               "labels": names, "languages": languages, "items": items}
    return dataset, record, inputs


def _default_name(path: Path) -> str:
    """A dataset name from its folder (``ag_news_csv`` -> ``ag_news``)."""
    return path.resolve().parent.name.removesuffix("_csv") or "textcls"


def split_counts(dataset: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Texts per split, per class name and per language."""
    names = dataset["labels"]
    out: dict[str, dict[str, Any]] = {sp: {"texts": 0, "per_class": Counter(), "per_language": Counter()}
                                      for sp in SPLITS}
    for it in dataset["items"]:
        c = out[it["split"]]
        c["texts"] += 1
        c["per_class"][names[it["label"]]] += 1
        c["per_language"][it["lang"]] += 1
    for c in out.values():
        c["per_class"] = {n: c["per_class"].get(n, 0) for n in names}
        c["per_language"] = dict(sorted(c["per_language"].items()))
    return out


def run_textcls_prep(settings: PrepSection, overwrite: bool = False) -> Path:
    """Prepare a classification dataset into ``settings.out`` (replaced only on success); the folder.

    The same checks and locking as :func:`prep.run.run_prep`: ``--out`` may not be, hold or lie in
    an input; a prepared dataset there is replaced only with ``overwrite``.
    """
    from prep.out_checks import _given_inputs, _os_error, check_not_input, check_out

    out = Path(settings.out).expanduser().resolve()
    try:
        check_not_input(out, _given_inputs(settings))
        check_out(out, overwrite)
        dataset, drops, inputs = build_textcls(settings)
        train = [it for it in dataset["items"] if it["split"] == "train"]
        if not train:
            raise UserError("prep textcls: the train split has no texts")
        with exclusive_lock(out, "this prepared dataset"):
            check_out(out, overwrite)
            for stale in remove_stale_siblings(out):
                console.warning(f"prep: removed {stale.name} (left by a killed run)")
            with atomic_directory(out) as work:
                chars = build_char_vocabulary((it["text"] for it in train), settings.min_char_count,
                                              settings.lowercase)
                words = build_word_vocabulary((it["tokens"] for it in train), settings.min_word_count)
                counts = split_counts(dataset)
                record = {
                    "format_version": FORMAT_VERSION, "prep_version": __version__,
                    "dataset": dataset["dataset"], "task": TASK,
                    "inputs": [input_record(p) for p in inputs],
                    "options": settings.model_dump(mode="json"), "labels": dataset["labels"],
                    "counts": counts, **drops,
                    "vocabulary": {"chars": len(chars["symbols"]), "words": len(words["tokens"])},
                }
                write_prepared_files(work, dataset, chars, words, record)
    except OSError as exc:
        error = _os_error(exc, out)
        if error is None:
            raise
        raise error from None
    parts = [f"{sp} {record['counts'][sp]['texts']:,}" for sp in SPLITS]
    dropped = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in record["dropped"].items()) or "none"
    repaired = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in record["repaired"].items())
    repaired = f"{record['repaired_texts']:,} texts ({repaired})" if repaired else "none"
    console.result(f"prep textcls: {'; '.join(parts)} texts; {len(dataset['labels'])} classes; languages "
                   f"{', '.join(dataset['languages'])}; dropped: {dropped}; repaired: {repaired}; "
                   f"{record['vocabulary']['chars']} "
                   f"chars, {record['vocabulary']['words']} words -> {out}")
    return out


@dataclass
class TextClsDataset:
    """A prepared classification dataset, loaded: texts, labels, splits and the train vocabularies."""

    root: Path
    name: str
    labels: list[str]
    languages: list[str]
    texts: list[str]
    tokens: list[list[str]]
    targets: np.ndarray  # (N,) int64, 0-based class of each text
    splits: np.ndarray  # (N,) str
    langs: list[str]
    chars: Vocabulary
    words: Vocabulary
    record: dict[str, Any]

    @classmethod
    def load(cls, path: str | os.PathLike) -> TextClsDataset:
        """Read a folder written by ``prep textcls`` (a :class:`UserError` for anything else)."""
        root = Path(path).expanduser().resolve()
        file = root / DATASET_FILE
        data = read_json(file, PREPARED_FILE, missing=f"{file}: not found (run `prep textcls` first)")
        if not isinstance(data, dict) or data.get("task") != TASK:
            raise UserError(f"{root}: not a text classification dataset (written by `prep textcls`)")
        items = data["items"]
        record_path = root / RECORD_FILE
        return cls(root=root, name=data["dataset"], labels=list(data["labels"]),
                   languages=list(data["languages"]), texts=[it["text"] for it in items],
                   tokens=[it["tokens"] for it in items],
                   targets=np.asarray([it["label"] for it in items], dtype=np.int64),
                   splits=np.asarray([it["split"] for it in items]), langs=[it["lang"] for it in items],
                   chars=load_vocabulary(root / CHARS_FILE), words=load_vocabulary(root / WORDS_FILE),
                   record=read_json(record_path, PREPARED_FILE, kind=dict) if record_path.exists() else {})

    def rows(self, split: str) -> np.ndarray:
        """Indices of the texts of ``split``, ascending."""
        if split not in SPLITS:
            raise UserError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)})")
        return np.flatnonzero(self.splits == split)


def is_textcls_dataset(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a prepared classification dataset (its ``prep.json`` says so)."""
    try:
        record = read_json(Path(path) / RECORD_FILE, PREPARED_FILE)
    except UserError:
        return False
    return isinstance(record, dict) and record.get("task") == TASK


def add_textcls_parser(sub: Any, common: Any) -> None:
    """Add ``prep textcls`` to the ``prep`` subcommands (``common``: the options every dataset takes)."""
    import argparse

    p = sub.add_parser(
        "textcls", help="text classification CSV (AG News, DBPedia, Yelp, Amazon; or any CSV/TSV)",
        description="A text classification dataset (CHAIN-VSE section 5): the Zhang et al. CSV family "
        "(\"class\",\"title\",\"description\"; 1-based class index naming a line of classes.txt; doubled "
        "quotes; HTML entities, their broken '#39;'/'quot;' forms and backslash escapes decoded and counted "
        "in prep.json; title and description joined by ' \u00b6 ') or a generic CSV/TSV with a header "
        "(--label-col, --text-cols, optional --lang-col). Official train/test files are kept; val is carved "
        "from train, stratified and seeded (--val-fraction); --test-fraction splits a single file. Writes "
        "texts, labels, label names, splits, languages and the train-only chars.json/words.json.")
    p.add_argument("--train", dest="train_file", metavar="FILE", default=None,
                   help="train file (or the single file that --test-fraction splits)")
    p.add_argument("--test", dest="test_file", metavar="FILE", default=None, help="official test file")
    p.add_argument("--classes", dest="classes_file", metavar="FILE", default=None,
                   help="zhang: classes.txt (default: the one next to the first file)")
    p.add_argument("--format", dest="text_format", choices=("zhang", "csv", "tsv"), default=None,
                   help="zhang: Zhang et al.'s headerless CSV; csv/tsv: a file with a header (default zhang)")
    p.add_argument("--label-col", dest="label_col", metavar="COL", default=None,
                   help="csv/tsv: column of the class names (header name or 0-based index)")
    p.add_argument("--text-cols", dest="text_cols", metavar="COL", nargs="+", default=None,
                   help="csv/tsv: text columns, joined by a space")
    p.add_argument("--lang-col", dest="lang_col", metavar="COL", default=None,
                   help="csv/tsv: column of each row's language (en, de, ja romanized, or any language "
                        "spaCy has a blank tokenizer for); default: --lang for every row")
    p.add_argument("--lang", choices=("en", "de", "ja"), default=None,
                   help="language of rows without --lang-col (default en)")
    p.add_argument("--name", default=None, help="dataset name (default: the input's folder name)")
    p.add_argument("--val-fraction", dest="val_fraction", type=float, metavar="F", default=None,
                   help="fraction of the train rows carved into val, stratified by class (default 0.05)")
    p.add_argument("--test-fraction", dest="test_fraction", type=float, metavar="F", default=None,
                   help="split a single file: this fraction of its rows becomes test, stratified")
    p.add_argument("--seed", type=int, default=None, help="seed of the val/test carving (default 0)")
    common(p, images=False)
    for action in p._actions:  # images/strict mean nothing for texts
        if action.dest == "strict":
            action.help = argparse.SUPPRESS
