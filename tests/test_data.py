"""The caption data pipeline: character encoding, split loading, batches and epoch orders (on the tiny
prepared dataset and feature store of :mod:`helpers`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_prepared, make_store

from prep.dataset import PreparedDataset
from train.engine.codecs import encode_text, text_codec, word_vocabulary
from train.engine.data import epoch_batches, feature_spec, load_caption_set, read_features
from train.engine.inference import batch_to
from vsecore.errors import UserError


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[PreparedDataset, np.ndarray, np.ndarray]:
    data = make_prepared(tmp_path / "tiny")
    store = make_store(tmp_path / "tiny.zarr", data, invalid=(3,))
    x, valid = read_features(f"{store}:global")
    return PreparedDataset.load(data), x, valid


def test_encode_text_lowercases_maps_unknown_and_truncates(tiny) -> None:
    ds, _, _ = tiny
    vocab = ds.chars
    codes = encode_text("A Red€ dog", vocab, max_chars=256)
    assert codes[0] == vocab.index("a") and codes[2] == vocab.index("r")
    assert codes[5] == 1  # '€' never occurs in the train captions -> <unk>
    assert len(encode_text("a red dog", vocab, max_chars=4)) == 4
    assert encode_text("", vocab, max_chars=10) == [1]


def test_caption_set_skips_invalid_images_and_maps_captions(tiny) -> None:
    ds, x, valid = tiny
    cs = load_caption_set(ds, x, valid, "train", "en", max_chars=256)
    assert cs.skipped_images == 1 and cs.num_images == 23
    assert 3 not in cs.imgids.tolist()
    texts, imgids = ds.captions("train", "en")
    expected = [t for t, i in zip(texts, imgids, strict=True) if i != 3]
    assert cs.texts == expected
    for k in range(len(cs)):
        imgid = int(cs.imgids[cs.caption_image[k]])
        assert cs.texts[k] in [s.raw for s in ds.sentences_of("train", "en") if s.imgid == imgid]
        assert cs.caption_codes(k).tolist() == encode_text(cs.texts[k], ds.chars, 256)
    assert torch.equal(cs.images[:], torch.from_numpy(x[cs.imgids]))
    val = load_caption_set(ds, x, valid, "val", "en", max_chars=256, max_images=3)
    assert val.num_images == 3 and set(val.caption_image.tolist()) == {0, 1, 2}


def test_batch_pads_to_the_longest_caption(tiny) -> None:
    ds, x, valid = tiny
    cs = load_caption_set(ds, x, valid, "train", "en", max_chars=20)
    batch = cs.batch([0, 5, 7])
    lengths = [len(cs.caption_codes(k)) for k in (0, 5, 7)]
    assert batch.text.shape == (3, max(lengths)) and batch.text.dtype == torch.long
    assert batch.lengths.tolist() == lengths and max(lengths) <= 20
    for row, k in enumerate((0, 5, 7)):
        assert batch.text[row, : lengths[row]].tolist() == cs.caption_codes(k).tolist()
        assert (batch.text[row, lengths[row]:] == 0).all()
        assert torch.equal(batch.image_features[row], cs.images[cs.caption_image[k]])


def test_epoch_orders_are_seeded_and_complete(tiny) -> None:
    ds, x, valid = tiny
    cs = load_caption_set(ds, x, valid, "train", "en", max_chars=256)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    b1, b2 = epoch_batches(cs, 8, "all", g1), epoch_batches(cs, 8, "all", g2)
    assert all(np.array_equal(a, b) for a, b in zip(b1, b2, strict=True))
    flat = np.concatenate(b1)
    assert sorted(flat.tolist()) == list(range(len(cs))) and flat.tolist() != list(range(len(cs)))
    assert all(len(b) == 8 for b in b1[:-1])
    again = np.concatenate(epoch_batches(cs, 8, "all", g1))  # the next epoch draws a new order
    assert again.tolist() != flat.tolist()
    one = np.concatenate(epoch_batches(cs, 8, "one", torch.Generator().manual_seed(0)))
    assert len(one) == cs.num_images
    assert sorted(cs.caption_image[one].tolist()) == list(range(cs.num_images))


def test_region_features_are_refused_by_linear_image_models() -> None:
    with pytest.raises(UserError, match="regions"):
        feature_spec("feats.zarr:regions")
    assert feature_spec("feats.zarr:fne") == "feats.zarr:fne"
    with pytest.raises(UserError, match="region features"):
        feature_spec("feats.zarr:global", regions=True)
    assert feature_spec("feats.zarr:regions", regions=True) == "feats.zarr:regions"


def test_word_codec_uses_prepared_tokens_and_train_only_counts(tiny) -> None:
    ds, x, valid = tiny
    codec = text_codec(ds, "words", max_len=4, min_word_count=1)
    cs = load_caption_set(ds, x, valid, "train", "en", 256, codec=codec)
    sentence = next(s for s in ds.sentences_of("train", "en") if s.raw == cs.texts[0])
    assert cs.caption_codes(0).tolist() == ds.words.encode(sentence.tokens[:4])
    batch = cs.batch([0, 1])
    assert batch.text.shape == (2, 4) and batch.lengths.tolist() == [4, 4]
    # a rarer-than-min-count word becomes <unk>; the kept words keep their words.json order
    rare = word_vocabulary(ds.words, min_count=10 ** 6)
    assert rare.symbols == ["<pad>", "<unk>"]
    common = min(ds.words.counts.values())
    kept = word_vocabulary(ds.words, min_count=common + 1)
    assert kept.symbols == [t for t in ds.words.symbols if t in ("<pad>", "<unk>")
                            or ds.words.counts[t] > common]
    # new text (queries, noise) goes through prep's tokenizer: "Red dog." -> red, dog, .
    [codes] = codec.encode_texts(["Red dog."])
    assert codes.tolist() == ds.words.encode(["red", "dog", "."])


def test_word_chars_codec_spells_words_padded_to_the_word_length(tiny) -> None:
    ds, x, valid = tiny
    codec = text_codec(ds, "word_chars", max_len=50, word_length=4)
    cs = load_caption_set(ds, x, valid, "train", "en", 256, codec=codec)
    sentence = next(s for s in ds.sentences_of("train", "en") if s.raw == cs.texts[2])
    codes = cs.caption_codes(2)
    assert codes.shape == (len(sentence.tokens), 4)
    for word, row in zip(sentence.tokens, codes, strict=True):
        spelled = ds.chars.encode(word[:4])
        assert row.tolist() == spelled + [0] * (4 - len(spelled))
    batch = cs.batch([2, 3])
    assert batch.text.shape == (2, int(batch.lengths.max()), 4)
    assert (batch.text[0, len(sentence.tokens):] == 0).all()


def test_int8_features_stay_int8_and_are_converted_per_batch(tiny) -> None:
    ds, x, valid = tiny
    ternary = np.sign(np.nan_to_num(x)).astype(np.int8)
    cs = load_caption_set(ds, ternary, valid, "train", "en", 256)
    val = load_caption_set(ds, ternary, valid, "val", "en", 256)
    assert cs.images.features.dtype == torch.int8
    assert cs.images.features.data_ptr() == val.images.features.data_ptr()  # one array for all splits
    batch = cs.batch([0, 1, 2])
    # the batch ships the stored int8; batch_to makes it float32 on the device it moves it to
    assert batch.image_features.dtype == torch.int8
    expected = torch.from_numpy(ternary[cs.imgids[cs.caption_image[[0, 1, 2]]]])
    assert torch.equal(batch.image_features, expected)
    moved = batch_to(batch, torch.device("cpu"))
    assert moved.image_features.dtype == torch.float32 and torch.equal(moved.image_features, expected.float())
    assert moved.text is batch.text and moved.image_index is batch.image_index


def test_a_non_finite_valid_row_is_an_error_naming_the_row(tmp_path) -> None:
    data = make_prepared(tmp_path / "tiny")
    store = make_store(tmp_path / "tiny.zarr", data)
    from features.store.core import FeatureStore

    FeatureStore(store, mode="r+").array("global")[5, 2] = np.inf
    with pytest.raises(UserError, match="row 5 .*not finite"):
        read_features(f"{store}:global")
