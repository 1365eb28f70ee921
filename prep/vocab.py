"""Vocabularies of the train split: the character alphabet and the word vocabulary.

Both start with ``<pad>`` (index 0) and ``<unk>`` (index 1); the remaining symbols are those seen
at least ``min_count`` times in the train split, most frequent first (ties by symbol), so the
order is deterministic. Symbols of val/test sentences never enter: that is the leak the older
codebases had.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from prep.dataset import PAD, UNK
from vsecore.errors import UserError

#: share of the train split's occurrences that may fall out of a vocabulary (to ``<unk>``) before prep warns
UNKNOWN_WARN_SHARE = 0.05


def kept_symbols(counts: Mapping[str, int], min_count: int) -> list[str]:
    """The one ``min_count`` rule of every vocabulary: symbols seen at least ``min_count`` times
    (``<pad>`` and ``<unk>`` aside), most frequent first, ties by symbol."""
    kept = [(s, c) for s, c in counts.items() if c >= min_count and s not in (PAD, UNK)]
    return [s for s, _ in sorted(kept, key=lambda sc: (-sc[1], sc[0]))]


def build_char_vocabulary(texts: Iterable[str], min_count: int = 1, lowercase: bool = True) -> dict[str, Any]:
    """``chars.json`` content from the train ``raw`` texts (lowercased when ``lowercase``)."""
    counts: Counter = Counter()
    for text in texts:
        counts.update(text.lower() if lowercase else text)
    symbols = [PAD, UNK, *kept_symbols(counts, min_count)]
    return {"pad": PAD, "unk": UNK, "symbols": symbols,
            "counts": {s: counts[s] for s in symbols[2:]}, "min_count": min_count, "lowercase": lowercase}


def build_word_vocabulary(token_lists: Iterable[Iterable[str]], min_count: int = 1) -> dict[str, Any]:
    """``words.json`` content from the train sentences' tokens."""
    counts: Counter = Counter()
    for tokens in token_lists:
        counts.update(tokens)
    tokens_kept = [PAD, UNK, *kept_symbols(counts, min_count)]
    return {"pad": PAD, "unk": UNK, "min_count": min_count, "tokens": tokens_kept,
            "counts": {t: counts[t] for t in tokens_kept[2:]}}


def check_coverage(vocabulary: dict[str, Any], total: int, what: str, option: str) -> str | None:
    """What the ``min_count`` of a built vocabulary left out of the train split's ``total`` occurrences.

    A :class:`UserError` when no symbol is kept (every character or token would read as ``<unk>``);
    a warning (returned) when more than :data:`UNKNOWN_WARN_SHARE` of the occurrences are left out;
    else ``None``. ``what`` names the symbols ("characters", "tokens"), ``option`` the command-line
    option that set ``min_count``.
    """
    kept = vocabulary["counts"]
    min_count = vocabulary["min_count"]
    if total <= 0:
        return None
    if not kept:
        raise UserError(f"{option} {min_count}: no train-split {what[:-1]} occurs {min_count} times, so "
                        f"the vocabulary would hold only {PAD} and {UNK}; lower {option}")
    unknown = 1 - sum(kept.values()) / total
    if unknown <= UNKNOWN_WARN_SHARE:
        return None
    return (f"{option} {min_count} keeps {len(kept)} {what}: {unknown:.0%} of the train split's {what} "
            f"will read as {UNK}")
