"""Captions encoded once (train.engine.caption_cache): the caption sets and batches read from the cache are
those of the loader that encoded every caption at load time, bit for bit, for every text input; a damaged,
foreign or unwritable cache is re-encoded, never trusted (captions moved to other images, which only the
file's digest tells: tests/test_containers.py, through `train evaluate`)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_prepared, make_store

from prep.dataset import PreparedDataset
from prep.dataset_cache import CACHE_ENV, cache_folder
from train.engine import caption_cache
from train.engine.caption_cache import cache_file, split_captions
from train.engine.codecs import TextCodec, text_codec
from train.engine.data import epoch_batches, load_caption_set, read_features
from vsecore.containers import DIGEST, write_npz

INVALID = (3, 26)  # a train image and a val image whose features failed


def reference_caption_set(dataset: PreparedDataset, valid: np.ndarray, split: str, langs: list[str],
                          codec: TextCodec, max_images: int | None = None) -> dict:
    """The loader before the cache (commit 4ad0c80's load_caption_set), kept here as the reference."""
    per_image: dict[int, list] = {}
    for one in langs:
        for s in dataset.sentences_of(split, one):
            per_image.setdefault(s.imgid, []).append((s.raw, s.tokens))
    rows = sorted(per_image)
    if max_images is not None:
        rows = rows[:max_images]
    kept = [r for r in rows if valid[r]]
    texts, encoded, caption_image = [], [], []
    for row, imgid in enumerate(kept):
        for raw, tokens in per_image[imgid]:
            texts.append(raw)
            encoded.append(codec.encode(raw, tokens))
        caption_image.extend([row] * len(per_image[imgid]))
    dtype = np.int16 if codec.vocab_size < 2**15 else np.int32
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([e.size for e in encoded])
    return {"imgids": np.asarray(kept, dtype=np.int64), "texts": texts,
            "codes": np.concatenate([e.reshape(-1) for e in encoded]).astype(dtype), "offsets": offsets,
            "caption_image": np.asarray(caption_image, dtype=np.int64),
            "skipped_images": len(rows) - len(kept)}


def add_german(data: Path) -> Path:
    """Give every other image a German caption too (a second language, as Multi30k's)."""
    content = json.loads((data / "dataset.json").read_text())
    sentid = sum(len(im["sentences"]) for im in content["images"])
    for im in content["images"][::2]:
        raw = "Ein Bild " + im["sentences"][0]["raw"][::-1]
        im["sentences"].insert(0, {"sentid": sentid, "imgid": im["imgid"], "raw": raw, "lang": "de",
                                   "tokens": raw.lower().split()})
        im["sentids"].insert(0, sentid)
        sentid += 1
    content["languages"] = ["en", "de"]
    (data / "dataset.json").write_text(json.dumps(content))
    return data


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[PreparedDataset, np.ndarray, np.ndarray]:
    data = add_german(make_prepared(tmp_path / "tiny"))
    x, valid = read_features(f"{make_store(tmp_path / 'tiny.zarr', data, invalid=INVALID)}:global")
    return PreparedDataset.load(data), x, valid


def codecs(ds: PreparedDataset) -> dict[str, TextCodec]:
    return {"chars": text_codec(ds, "chars", 30), "words": text_codec(ds, "words", 6, min_word_count=2),
            "word_chars": text_codec(ds, "word_chars", 6, word_length=4)}


def assert_same(cs, ref: dict) -> None:
    for name in ("imgids", "codes", "offsets", "caption_image"):
        got = getattr(cs, name)
        assert got.dtype == ref[name].dtype and np.array_equal(got, ref[name]), name
    assert cs.texts == ref["texts"] and cs.skipped_images == ref["skipped_images"]


def assert_same_batches(a, b) -> None:
    for mode in ("all", "one"):
        orders = [epoch_batches(cs, 5, mode, torch.Generator().manual_seed(3)) for cs in (a, b)]
        for i, j in zip(*orders, strict=True):
            for left, right in zip(a.batch(i), b.batch(j), strict=True):
                assert type(left) is type(right)
                assert (torch.equal(left, right) if isinstance(left, torch.Tensor) else left == right)


@pytest.mark.parametrize("kind", ["chars", "words", "word_chars"])
@pytest.mark.parametrize("cache", ["cold", "warm", "off"])
def test_cached_caption_sets_are_the_old_loaders(tiny, kind, cache, monkeypatch) -> None:
    ds, x, valid = tiny
    codec = codecs(ds)[kind]
    if cache == "off":
        monkeypatch.setenv(CACHE_ENV, "0")
    cases = [("train", ["en"], None), ("train", ["en", "de"], None), ("val", ["en"], 5),
             ("test", ["de"], None)]
    if cache == "warm":
        for split, langs, max_images in cases:
            load_caption_set(ds, x, valid, split, langs, 30, max_images, codec=codec)
        monkeypatch.setattr(caption_cache, "encode_split", lambda *a: pytest.fail("encoded again"))
    for split, langs, max_images in cases:
        cs = load_caption_set(ds, x, valid, split, langs, 30, max_images, codec=codec)
        assert_same(cs, reference_caption_set(ds, valid, split, langs, codec, max_images))
    folder = ds.root.parent / "tiny.vse-captions"
    assert folder.is_dir() == (cache != "off")
    if cache != "off":
        assert len(list(folder.glob("*.npz"))) == 4 and not list(folder.glob(".*"))


def test_batches_from_the_cache_equal_batches_encoded_at_load(tiny, monkeypatch) -> None:
    ds, x, valid = tiny
    for codec in codecs(ds).values():
        load_caption_set(ds, x, valid, "train", ["en", "de"], 30, codec=codec)  # writes the cache
        cached = load_caption_set(ds, x, valid, "train", ["en", "de"], 30, codec=codec)
        monkeypatch.setenv(CACHE_ENV, "off")
        assert_same_batches(cached, load_caption_set(ds, x, valid, "train", ["en", "de"], 30, codec=codec))
        monkeypatch.delenv(CACHE_ENV)


def damage(path: Path, how: str, codec: TextCodec) -> None:
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif how == "garbage":
        path.write_bytes(b"not a cache" * 50)
    else:  # a well-formed file (its digest made anew) whose arrays do not fit together
        with np.load(path) as npz:
            arrays = {k: npz[k] for k in npz.files if k != DIGEST}
        if how == "codes out of bounds":
            arrays["codes"][5] = codec.vocab_size
        elif how == "offsets overrun":
            arrays["offsets"][-1] += 1
        elif how == "a huge count of captions":
            arrays["per_image"][0] = 2**62
        elif how == "codes of another dtype":
            arrays["codes"] = arrays["codes"].astype(np.int64)
        else:
            arrays["text"] = np.zeros(10**6, dtype=np.uint8)  # more text than the dataset has
        write_npz(path, arrays)


DAMAGE = {"truncated": "not a readable archive", "garbage": "not a readable archive",
          "codes out of bounds": "codes outside the vocabulary", "offsets overrun": "offsets do not fit",
          "a huge count of captions": "captions per image outside",
          "codes of another dtype": "array codes is <i8",
          "more text than the dataset": "more than the"}


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_cache_is_one_warning_and_encoded_again(tiny, how, capsys) -> None:
    ds, x, valid = tiny
    codec = codecs(ds)["chars"]
    load_caption_set(ds, x, valid, "train", "en", 30, codec=codec)
    path = cache_file(cache_folder(ds.root), "train", ["en"], codec)
    damage(path, how, codec)
    capsys.readouterr()
    cs = load_caption_set(ds, x, valid, "train", "en", 30, codec=codec)
    assert_same(cs, reference_caption_set(ds, valid, "train", ["en"], codec))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "encoding the captions again" in err[0], err
    assert DAMAGE[how] in err[0], err
    capsys.readouterr()
    load_caption_set(ds, x, valid, "train", "en", 30, codec=codec)  # replaced by a good one
    assert not capsys.readouterr().err


def test_a_cache_of_the_version_before_digests_is_a_detail_and_encoded_again(tiny, capsys) -> None:
    ds, x, valid = tiny
    codec = codecs(ds)["chars"]
    load_caption_set(ds, x, valid, "train", "en", 30, codec=codec)
    path = cache_file(cache_folder(ds.root), "train", ["en"], codec)
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files if k != DIGEST}
    meta = {**json.loads(arrays["meta"].tobytes()), "version": 1}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path.with_suffix(".tmp.npz"), **arrays)  # as version 1 wrote it: no digest
    path.with_suffix(".tmp.npz").replace(path)
    capsys.readouterr()
    cs = load_caption_set(ds, x, valid, "train", "en", 30, codec=codec)
    assert not capsys.readouterr().err  # a detail line, shown only with --verbose
    assert_same(cs, reference_caption_set(ds, valid, "train", ["en"], codec))
    with np.load(path) as npz:
        assert DIGEST in npz.files


def test_a_cache_of_another_dataset_or_vocabulary_is_not_used(tiny, monkeypatch) -> None:
    ds, x, valid = tiny
    codec = codecs(ds)["words"]
    load_caption_set(ds, x, valid, "train", "en", 30, codec=codec)
    content = json.loads((ds.root / "dataset.json").read_text())
    content["images"][0]["sentences"][1]["raw"] = "A changed caption."
    content["images"][0]["sentences"][1]["tokens"] = ["a", "changed", "caption"]
    (ds.root / "dataset.json").write_text(json.dumps(content))
    changed = PreparedDataset.load(ds.root)
    cs = load_caption_set(changed, x, valid, "train", "en", 30, codec=codec)
    assert "A changed caption." in cs.texts
    assert_same(cs, reference_caption_set(changed, valid, "train", ["en"], codec))
    other = text_codec(changed, "words", 6, min_word_count=40)  # another vocabulary: another file
    assert cache_file(cache_folder(ds.root), "train", ["en"], other) != cache_file(
        cache_folder(ds.root), "train", ["en"], codec)


def test_cache_folder_setting_and_an_unwritable_one(tiny, tmp_path, monkeypatch) -> None:
    ds, x, valid = tiny
    codec = codecs(ds)["chars"]
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "caches"))
    load_caption_set(ds, x, valid, "train", "en", 30, codec=codec)
    assert len(list((tmp_path / "caches").glob("tiny-*/train.en.*.npz"))) == 1
    assert not (tmp_path / "tiny.vse-captions").exists()
    monkeypatch.delenv(CACHE_ENV)
    (tmp_path / "tiny.vse-captions").write_text("a file where the cache folder would go")
    cs = load_caption_set(ds, x, valid, "train", "en", 30, codec=codec)  # encoded in memory, no error
    assert_same(cs, reference_caption_set(ds, valid, "train", ["en"], codec))


def test_concurrent_first_loads_all_get_the_captions_and_one_whole_file(tiny) -> None:
    ds, _, _ = tiny
    codec = codecs(ds)["word_chars"]
    results: list = [None] * 4

    def load(i: int) -> None:
        results[i] = split_captions(ds, "train", ["en", "de"], codec)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    folder = cache_folder(ds.root)
    assert [p.name for p in folder.iterdir()] == [cache_file(folder, "train", ["en", "de"], codec).name]
    again = split_captions(ds, "train", ["en", "de"], codec)
    for r in results:
        assert np.array_equal(r.codes, again.codes) and r.texts == again.texts
