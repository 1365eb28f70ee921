"""Tokenization with spaCy's blank (rule-based, offline) tokenizers, and Japanese transliteration.

English and German: the text is lowercased (as the papers do) and split by ``spacy.blank(lang)``.
Japanese: ``spacy.blank("ja")`` (SudachiPy, split mode A) cuts the sentence into words; each word
is transliterated to Hepburn romaji with pykakasi, so that character models see a small Latin
alphabet. The romaji words are the tokens; ``raw`` is the words joined by single spaces, with
punctuation attached to the word before it ("shiroi sara no ue ni keeki ga oka re te i masu.").
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from functools import cache

from vsecore.errors import UserError

SUPPORTED = ("en", "de", "ja")


@cache
def _blank(lang: str):  # -> spacy.Language (imported lazily: spaCy takes a second to load)
    import spacy

    try:
        return spacy.blank(lang)
    except ImportError as exc:  # the Japanese tokenizer needs sudachipy + sudachidict_core
        hint = " (install the Japanese extra: pip install 'vse-toolkit[ja]')" if lang == "ja" else ""
        raise UserError(f"spaCy's '{lang}' tokenizer is unavailable: {exc}{hint}") from None


@cache
def _kakasi():
    try:
        import pykakasi
    except ImportError:
        raise UserError("Japanese captions are romanized with pykakasi, which is not installed (install the "
                        "Japanese extra: pip install 'vse-toolkit[ja]')") from None
    return pykakasi.kakasi()


#: what :func:`strip_controls` removes: ANSI escape sequences (CSI such as colours, OSC such as window
#: titles, and two-character ESC sequences), then every other C0/C1 control character, DEL included,
#: except the whitespace ones (tab, line feed, vertical tab, form feed, carriage return, NEL) that
#: :func:`normalize` turns into single spaces
_CONTROLS = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]"
                       r"|[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f]")
#: invisible format characters removed with the controls: the bidirectional embeddings, overrides and
#: isolates (U+202A-U+202E, U+2066-U+2069: they reorder how a text is displayed, e.g. "Trojan Source"),
#: the zero-width space, word joiner, byte-order mark and soft hyphen. The zero-width (non-)joiners stay:
#: they change how Arabic and Indic scripts are written.
_INVISIBLE = re.compile("[\u202a-\u202e\u2066-\u2069\u200b\u2060\ufeff\u00ad]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def strip_controls(text: str) -> tuple[str, int]:
    """``text`` without ANSI escape sequences, control characters and the invisible format characters
    above (bidirectional overrides, zero-width spaces), and how many were removed.

    Captions are data, not terminal output: an escape sequence would recolour every terminal that
    prints the caption, and control characters become symbols of the character alphabet.
    """
    if not _CONTROLS.search(text) and not _INVISIBLE.search(text):
        return text, 0
    text, controls = _CONTROLS.subn("", text)
    text, invisible = _INVISIBLE.subn("", text)
    return text, controls + invisible


def lone_surrogate(text: str) -> int | None:
    """The position of the first lone surrogate code point in ``text`` (JSON ``"\\ud800"`` decodes to
    one; it cannot be encoded as UTF-8, so no tokenizer or file can take it), or ``None``."""
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def normalize(text: str) -> str:
    """Unicode NFKC, whitespace runs collapsed to one space, stripped (the text every stage sees)."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def romanize(text: str) -> str:
    """Hepburn romaji of Japanese ``text`` (Latin letters, digits and punctuation pass through)."""
    return "".join(item["hepburn"] for item in _kakasi().convert(text))


def tokenize(texts: Sequence[str], lang: str, lowercase: bool = True) -> list[list[str]]:
    """Tokens of each text (English/German); lowercased first when ``lowercase``."""
    if lang not in SUPPORTED:
        raise UserError(f"unsupported language '{lang}' (supported: {', '.join(SUPPORTED)})")
    if lang == "ja":
        return [transliterate(t, lowercase)[1] for t in texts]
    nlp = _blank(lang)
    prepared = [t.lower() if lowercase else t for t in texts]
    docs = nlp.tokenizer.pipe(prepared, batch_size=2000)
    return [[tok.text for tok in doc if not tok.is_space] for doc in docs]


def transliterate(text: str, lowercase: bool = True) -> tuple[str, list[str]]:
    """``(raw, tokens)`` of a Japanese sentence: romaji words joined by spaces, and those words."""
    doc = _blank("ja").tokenizer(text)
    tokens: list[str] = []
    raw_parts: list[str] = []
    for word in doc:
        if word.is_space:
            continue
        roman = romanize(word.text).strip()
        if lowercase:
            roman = roman.lower()
        if not roman:
            continue
        tokens.append(roman)
        if word.is_punct and raw_parts:
            raw_parts[-1] += roman
        else:
            raw_parts.append(roman)
    return " ".join(raw_parts), tokens


def tokenize_many(items: Iterable[tuple[str, str]], lowercase: bool = True) -> list[list[str]]:
    """Tokens of ``(lang, text)`` items in any mix of languages, batched per language."""
    items = list(items)
    out: list[list[str]] = [[] for _ in items]
    for lang in sorted({lang for lang, _ in items}):
        rows = [i for i, (lg, _) in enumerate(items) if lg == lang]
        for i, toks in zip(rows, tokenize([items[i][1] for i in rows], lang, lowercase), strict=True):
            out[i] = toks
    return out
