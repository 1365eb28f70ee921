"""The rows cache of a prepared dataset (prep.dataset_cache): a load from it reads what the parse of
dataset.json reads (checked against the reference reader of tests/dataset_reference.py), is used only for
the bytes it was made from, and a damaged, foreign or unwritable one costs a parse, never a wrong row."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from dataset_reference import HOSTILE, assert_same_as_reference, edit, rich
from helpers import make_prepared

import prep.dataset as dataset_module
from prep import dataset_cache
from prep.dataset import DATASET_FILE, PreparedDataset
from prep.dataset_cache import CACHE_ENV, ROWS_FILE, cache_folder
from prep.dataset_rows import TOKEN_SEP
from vsecore.containers import DIGEST, write_npz


@pytest.fixture(autouse=True)
def cache_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every dataset.json is cached (the test datasets are far under the size that is)."""
    monkeypatch.setattr(dataset_cache, "MIN_CACHED_BYTES", 0)
    monkeypatch.delenv(CACHE_ENV, raising=False)


def rows_file(data: Path) -> Path:
    return cache_folder(data.resolve()) / ROWS_FILE


def no_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dataset_module, "_parse_rows", lambda *a: pytest.fail("dataset.json parsed again"))


def plain_rich(tmp_path: Path) -> Path:
    """``rich`` without the token holding the packing separator (what a cache cannot hold): two languages,
    originals, file paths, COCO ids, pairs, sentences without tokens, empty tokens."""
    return edit(rich(tmp_path), lambda c: c["images"][1]["sentences"][0].update(tokens=["a", "b"]))


def test_a_cached_load_reads_as_the_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for data in (make_prepared(tmp_path / "tiny"), plain_rich(tmp_path)):
        assert not rows_file(data).exists()
        assert_same_as_reference(data)  # parsed, then kept
        assert rows_file(data).is_file()
        with monkeypatch.context() as m:
            no_parse(m)
            assert_same_as_reference(data)  # from the cache
            ds = PreparedDataset.load(data)
        assert ds.dataset_sha256 and ds.record == PreparedDataset.load(data).record
    ds = PreparedDataset.load(plain_rich(tmp_path))
    assert ds.sentences[0].tokens == () and ds.sentences[-1].original == "猫"
    assert ds.pairs[0].sides["ja"].sentid == 3


def test_a_dataset_a_cache_cannot_hold_is_parsed_each_time(tmp_path: Path) -> None:
    data = rich(tmp_path)  # a token holds the separator: kept as a tuple, not in the joined column
    assert_same_as_reference(data)
    assert not rows_file(data).exists()
    assert PreparedDataset.load(data).sentences[3].tokens == ("a" + TOKEN_SEP + "b", "c")
    data = edit(make_prepared(tmp_path / "float"), lambda c: c["images"][0].update(cocoid=1.5))
    assert_same_as_reference(data)
    assert not rows_file(data).exists()


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_dataset_json_is_refused_or_read_as_before_from_the_cache_too(tmp_path: Path, case: str
                                                                                ) -> None:
    data = edit(make_prepared(tmp_path / "d", 4, 2, 2), HOSTILE[case])
    assert_same_as_reference(data)
    assert_same_as_reference(data)  # from the cache where the first load kept one


def test_the_cache_is_used_only_for_the_bytes_it_was_made_from(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    data = make_prepared(tmp_path / "d")
    PreparedDataset.load(data)
    before = rows_file(data).read_bytes()
    edit(data, lambda c: c["images"][0]["sentences"][0].update(raw="A changed caption."))
    ds = PreparedDataset.load(data)
    assert ds.sentences[0].raw == "A changed caption."
    assert rows_file(data).read_bytes() != before  # replaced
    with monkeypatch.context() as m:
        no_parse(m)
        assert PreparedDataset.load(data).sentences[0].raw == "A changed caption."
    assert_same_as_reference(data)
    # the same bytes in another folder (a copy): its own cache, the same rows
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in os.listdir(data):
        (copy / name).write_bytes((data / name).read_bytes())
    assert list(PreparedDataset.load(copy).sentences) == list(PreparedDataset.load(data).sentences)


def damage(path: Path, name: str, change) -> None:
    """Change the arrays of the cache ``path`` and write them back with a digest of the change: the checks
    after the digest are the ones tested (an edit that keeps the old digest: the digest tests below)."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != DIGEST}
    change(arrays)
    write_npz(path, arrays)


def record_edit(arrays: dict, **values) -> None:
    record = json.loads(arrays["record"].tobytes())
    record.update(values)
    arrays["record"] = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)


#: case -> (the change, the phrase of the line it gives)
DAMAGE = {
    "truncated": (None, "not a readable archive"),
    "codes outside the table": (lambda a: a["splits.codes"].__setitem__(0, 7), "splits: codes outside"),
    "negative code": (lambda a: a["langs.codes"].__setitem__(0, -1), "langs: codes outside"),
    "offsets past the text": (lambda a: a["raws.offsets"].__setitem__(-1, 10**6), "raws: offsets do not fit"),
    "offsets going back": (lambda a: a["filenames.offsets"].__setitem__(1, 0) or a["filenames.offsets"]
                           .__setitem__(2, 99), "filenames: offsets do not fit"),
    "text not UTF-8": (lambda a: a.update({"raws.text": np.concatenate([a["raws.text"][:-1],
                                                                        np.array([0xFF], np.uint8)])}),
                       "codec can't decode"),
    "a missing array": (lambda a: a.pop("tokens.empty"), "members ['tokens.empty'] missing"),
    "an extra array": (lambda a: a.update(extra=np.zeros(2)), "members ['extra'] not expected"),
    "wrong dtype": (lambda a: a.update({"starts": a["starts"].astype(np.int32)}), "array starts is <i4"),
    "starts not ascending": (lambda a: a["starts"].__setitem__(1, 10**6), "image starts not ascending"),
    "fewer images": (lambda a: a.update({"splits.codes": a["splits.codes"][:-1]}), "disagree on n"),
    "a split table missing": (lambda a: record_edit(a, tables={**json.loads(a["record"].tobytes())["tables"],
                                                               "splits": None}), "without its table"),
    "a table of lists": (lambda a: record_edit(a, tables={**json.loads(a["record"].tobytes())["tables"],
                                                          "splits": [["train"], ["val"], ["test"]]}),
                         "splits: codes outside its table"),
    "not JSON": (lambda a: a.update(record=np.frombuffer(b"{", dtype=np.uint8)), "JSONDecodeError"),
    "another version": (lambda a: record_edit(a, version=0), "made by another version"),
    "another dataset": (lambda a: record_edit(a, dataset_sha256="0" * 64), "made for another dataset"),
    "originals out of range": (lambda a: record_edit(a, originals=[[10**6, "x"]]), "originals of sentences"),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_or_foreign_cache_is_one_line_then_parsed_and_replaced(
        tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = make_prepared(tmp_path / "d")
    sha256 = PreparedDataset.load(data).dataset_sha256
    path = rows_file(data)
    change, phrase = DAMAGE[case]
    if change is None:
        path.write_bytes(path.read_bytes()[:200])
    else:
        damage(path, case, change)
    found = dataset_cache.read_rows_cache(path, sha256)
    assert isinstance(found, str) and phrase in found, (case, found)
    capsys.readouterr()
    assert_same_as_reference(data)
    err = capsys.readouterr().err
    if case.startswith("another"):
        assert not err  # a detail line, shown only with --verbose
    else:
        assert f"dataset cache {path}: {found}; reading dataset.json again" in err
        assert len(err.strip().splitlines()) == 1
    assert isinstance(dataset_cache.read_rows_cache(path, sha256), tuple)  # replaced by a good one


def resave_keeping_the_digest(path: Path, change) -> None:
    """What a tool that does not know the digest does: load the arrays, change some, ``np.savez`` them all."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    change(arrays)
    np.savez(path, **arrays)


def test_an_edit_its_digest_does_not_match_is_one_warning_then_parsed_and_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41.2: 'red' -> 'blu' in the text column (same length: the offsets still fit, every structural
    check passes, and the recorded SHA-256 of dataset.json still matches) changed every caption, silently."""
    data = make_prepared(tmp_path / "d")
    PreparedDataset.load(data)
    path = rows_file(data)

    def red_to_blu(arrays: dict) -> None:
        text = arrays["raws.text"].tobytes()
        assert b"red" in text
        arrays["raws.text"] = np.frombuffer(text.replace(b"red", b"blu"), dtype=np.uint8)

    resave_keeping_the_digest(path, red_to_blu)
    capsys.readouterr()
    ds = PreparedDataset.load(data)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "does not match its digest" in err[0], err
    words = [w for s in ds.sentences for w in s.raw.split()]
    assert "blu" not in words and "red" in words
    assert_same_as_reference(data)
    assert isinstance(dataset_cache.read_rows_cache(path, ds.dataset_sha256), tuple)
    assert not capsys.readouterr().err


def test_a_cache_of_the_version_before_digests_is_a_detail_then_replaced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = make_prepared(tmp_path / "d")
    sha256 = PreparedDataset.load(data).dataset_sha256
    path = rows_file(data)
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != DIGEST}
    record_edit(arrays, version=1)
    np.savez(path, **arrays)  # as version 1 wrote it: no digest
    assert dataset_cache.read_rows_cache(path, sha256) == "made by another version (no digest)"
    capsys.readouterr()
    assert_same_as_reference(data)
    assert not capsys.readouterr().err
    assert isinstance(dataset_cache.read_rows_cache(path, sha256), tuple)


def test_declared_lengths_are_bounded_by_the_dataset_json_before_any_read(tmp_path: Path) -> None:
    """Each length a member declares is checked against what a dataset.json of its size can hold, from the
    headers (a header declaring 10**11 bytes, and a 3 GiB bomb: tests/test_containers.py's command table)."""
    data = make_prepared(tmp_path / "d")
    sha256 = PreparedDataset.load(data).dataset_sha256
    path = rows_file(data)
    size = (data / DATASET_FILE).stat().st_size
    assert isinstance(dataset_cache.read_rows_cache(path, sha256, size), tuple)
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != DIGEST}
    arrays["raws.text"] = np.zeros(2 * size, dtype=np.uint8)  # no dataset.json of that size holds that much
    write_npz(path, arrays)
    found = dataset_cache.read_rows_cache(path, sha256, size)
    assert f"raws_bytes = {2 * size:,}, more than the {size:,}" in found, found
    # without the size of dataset.json, the file's own size bounds them (and the other checks refuse it)
    assert "more than the" not in dataset_cache.read_rows_cache(path, sha256)


def test_off_small_and_unwritable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = make_prepared(tmp_path / "d")
    monkeypatch.setenv(CACHE_ENV, "0")
    assert_same_as_reference(data)
    assert not (tmp_path / "d.vse-captions").exists()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "caches"))
    PreparedDataset.load(data)
    assert (cache_folder(data.resolve()) / ROWS_FILE).is_file()
    assert cache_folder(data.resolve()).parent == tmp_path / "caches"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setattr(dataset_cache, "MIN_CACHED_BYTES", (data / DATASET_FILE).stat().st_size + 1)
    PreparedDataset.load(data)
    assert not (tmp_path / "d.vse-captions").exists()
    monkeypatch.setattr(dataset_cache, "MIN_CACHED_BYTES", 0)
    blocker = tmp_path / "blocked"
    monkeypatch.setenv(CACHE_ENV, str(blocker))
    blocker.write_text("a file where the cache folder would go")
    assert_same_as_reference(data)  # not written, still read
