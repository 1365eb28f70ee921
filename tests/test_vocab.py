"""Vocabulary boundaries: a symbol seen exactly ``min_count`` times in the train split is kept."""

from __future__ import annotations

from prep.vocab import build_char_vocabulary, build_word_vocabulary


def test_min_count_keeps_a_symbol_seen_exactly_that_often() -> None:
    texts = ["aaa", "bb", "c"]  # a: 3, b: 2, c: 1
    chars = build_char_vocabulary(texts, min_count=2)
    assert chars["symbols"] == ["<pad>", "<unk>", "a", "b"]
    assert build_char_vocabulary(texts, min_count=3)["symbols"] == ["<pad>", "<unk>", "a"]
    assert build_char_vocabulary(texts, min_count=1)["symbols"][2:] == ["a", "b", "c"]
    words = build_word_vocabulary([["x", "y"], ["x", "z"], ["x", "y"]], min_count=2)
    assert words["tokens"] == ["<pad>", "<unk>", "x", "y"] and words["counts"] == {"x": 3, "y": 2}
