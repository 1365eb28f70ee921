"""How a family's text encoder reads captions: :class:`TextCodec` (``chars``: character indices of the
prepared ``chars.json``; ``words``: word indices of ``words.json``; ``word_chars``: words spelled in
characters; unknown symbols -> ``<unk>`` = 1), built from the run's settings by :func:`codec_for`; new texts
are tokenized as ``prep`` tokenizes captions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from prep.dataset import PAD_INDEX, PreparedDataset, Vocabulary
from prep.tokenize import normalize, tokenize
from prep.vocab import kept_symbols
from vsecore.errors import UserError


def encode_text(text: str, vocab: Vocabulary, max_chars: int) -> list[int]:
    """Character indices of ``text`` (lowercased when the alphabet is), at most ``max_chars``.

    An empty text becomes a single ``<unk>``: encoders need at least one position.
    """
    if vocab.lowercase:
        text = text.lower()
    codes = vocab.encode(text[:max_chars])
    return codes or [vocab.index(vocab.unk)]


def word_vocabulary(words: Vocabulary, min_count: int) -> Vocabulary:
    """``words.json`` restricted to tokens seen at least ``min_count`` times in the train split.

    Tokens stay in their ``words.json`` order (most frequent first), so indices are stable for a
    given ``min_count``; the others map to ``<unk>``.
    """
    if min_count <= words.min_count:
        return words
    kept = kept_symbols(words.counts, min_count)  # words.json's own order: the same rule built it
    return Vocabulary(symbols=words.symbols[:2] + kept, counts={t: words.counts[t] for t in kept},
                      min_count=min_count, lowercase=words.lowercase, pad=words.pad, unk=words.unk)


@dataclass(frozen=True)
class TextCodec:
    """How captions become the integer tokens a text encoder reads (its ``text_input``).

    Attributes:
        kind: ``chars``, ``words`` or ``word_chars`` (:data:`train.models.registry.TEXT_INPUTS`).
        vocab: the character alphabet (``chars``, ``word_chars``) or word vocabulary (``words``).
        max_len: captions are cut to this many characters (``chars``) or words (the others).
        word_length: characters per word for ``word_chars`` (longer words are cut, shorter padded).
        lang: language of new texts given to :meth:`encode_texts` (their tokenizer).

    Dataset captions use the tokens ``prep`` wrote; new texts (noise analysis, queries) are tokenized
    with the same tokenizer (:func:`prep.tokenize.tokenize`).
    """

    kind: str
    vocab: Vocabulary
    max_len: int
    word_length: int = 0
    lang: str = "en"

    @property
    def vocab_size(self) -> int:
        """Symbols the encoder's input layer must cover."""
        return len(self.vocab)

    @property
    def item_width(self) -> int:
        """Integers per position: ``word_length`` for ``word_chars``, else 1."""
        return self.word_length if self.kind == "word_chars" else 1

    def encode(self, raw: str, tokens: Sequence[str]) -> np.ndarray:
        """One caption -> ``(L,)`` (``chars``, ``words``) or ``(L, word_length)`` (``word_chars``) int64."""
        unk = self.vocab.index(self.vocab.unk)
        if self.kind == "chars":
            return np.asarray(encode_text(raw, self.vocab, self.max_len), dtype=np.int64)
        tokens = list(tokens[: self.max_len])
        if self.kind == "words":
            return np.asarray(self.vocab.encode(tokens) or [unk], dtype=np.int64)
        out = np.zeros((max(1, len(tokens)), self.word_length), dtype=np.int64)
        if not tokens:
            out[0, 0] = unk
        for i, token in enumerate(tokens):
            word = token.lower() if self.vocab.lowercase else token
            codes = self.vocab.encode(word[: self.word_length]) or [unk]
            out[i, : len(codes)] = codes
        return out

    def encode_texts(self, texts: Sequence[str]) -> list[np.ndarray]:
        """New texts (not from the prepared dataset) -> their codes: normalised as ``prep`` normalises
        every text (:func:`prep.tokenize.normalize`: NFKC, tabs and runs of spaces one space) for every
        kind of encoder, then tokenized as ``prep`` does for the word encoders."""
        normalized = [normalize(t) for t in texts]
        if self.kind == "chars":
            return [self.encode(t, ()) for t in normalized]
        token_lists = tokenize(normalized, self.lang, self.vocab.lowercase) if normalized else []
        return [self.encode(t, toks) for t, toks in zip(normalized, token_lists, strict=True)]

    def collate(self, codes: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """Pad to the longest: ``(tokens (B, T) or (B, T, C) int64, lengths (B,) int64)``."""
        lengths = torch.tensor([len(c) for c in codes], dtype=torch.long)
        t = int(lengths.max()) if len(codes) else 0
        shape = (len(codes), t) if self.kind != "word_chars" else (len(codes), t, self.word_length)
        tokens = torch.full(shape, PAD_INDEX, dtype=torch.long)
        for i, c in enumerate(codes):
            tokens[i, : len(c)] = torch.as_tensor(np.asarray(c, dtype=np.int64))
        return tokens, lengths


def text_codec(dataset: PreparedDataset, kind: str, max_len: int, lang: str = "en", min_word_count: int = 1,
               word_length: int = 0) -> TextCodec:
    """The :class:`TextCodec` of ``kind`` over a prepared dataset's train-split vocabularies."""
    if kind == "words":
        return TextCodec("words", word_vocabulary(dataset.words, min_word_count), max_len, lang=lang)
    if kind == "word_chars":
        if word_length < 1:
            raise UserError("a word_chars text input needs a word length of at least 1")
        return TextCodec("word_chars", dataset.chars, max_len, word_length, lang)
    if kind != "chars":
        raise ValueError(f"unknown text input {kind!r}")
    return TextCodec("chars", dataset.chars, max_len, lang=lang)


def codec_for(settings: Any, dataset: PreparedDataset, text_input: str) -> TextCodec:
    """The :class:`TextCodec` a ``TrainSection`` asks for, over ``dataset``'s vocabularies.

    ``text_input`` is the family's (:attr:`train.models.registry.ModelSpec.text_input`); the
    settings give the limits (``max_chars``, ``max_words``), ``min_word_count``, ``word_length``
    and the language.
    """
    if text_input == "chars":
        return text_codec(dataset, "chars", settings.max_chars, settings.lang)
    if text_input == "words":
        return text_codec(dataset, "words", settings.max_words, settings.lang, settings.min_word_count)
    if settings.word_length is None:
        raise UserError(f"family '{settings.family}' spells words in characters: give --word-length")
    return text_codec(dataset, "word_chars", settings.max_words, settings.lang,
                      word_length=settings.word_length)
