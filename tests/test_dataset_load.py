"""PreparedDataset.load held as columns (prep.dataset_rows): everything a caller reads equals what the reader
of one object per sentence (before issue 33.2b) gave, and every file that reader refused is refused with the
same error, checked against that reader kept as the reference (tests/dataset_reference.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from dataset_reference import HOSTILE, assert_same_as_reference, edit, rich
from helpers import make_prepared

from prep.dataset import DATASET_FILE, PreparedDataset
from prep.dataset_rows import TOKEN_SEP, RowView, gc_paused
from vsecore.errors import UserError


def test_a_dataset_reads_as_the_reader_of_one_object_per_sentence(tmp_path: Path) -> None:
    assert_same_as_reference(make_prepared(tmp_path / "tiny"))
    data = rich(tmp_path)
    assert_same_as_reference(data)
    ds = PreparedDataset.load(data)
    assert ds.sentences[0].tokens == () and ds.sentences[3].tokens == ("a" + TOKEN_SEP + "b", "c")
    assert ds.sentences[-1] == list(ds.sentences)[-1] and ds.images[-1].imgid == len(ds.images) - 1
    assert ds.sentences[1:3] == list(ds.sentences)[1:3]
    with pytest.raises(IndexError):
        ds.images[len(ds.images)]


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_dataset_json_is_refused_or_read_as_before(tmp_path: Path, case: str) -> None:
    assert_same_as_reference(edit(make_prepared(tmp_path / "d", 4, 2, 2), HOSTILE[case]))


@pytest.mark.parametrize("text", [b"\xef\xbb\xbf{}", b'{\r\n"images":\r\n [1,\r\n', b'{"a": "\xff"}',
                                  b"[" * 100000, b""])
def test_an_unreadable_dataset_json_is_the_same_one_line(tmp_path: Path, text: bytes) -> None:
    (tmp_path / DATASET_FILE).write_bytes(text)
    assert_same_as_reference(tmp_path)


def test_the_digest_is_of_the_bytes_read_and_the_collector_comes_back(tmp_path: Path) -> None:
    import gc

    data = make_prepared(tmp_path / "tiny")
    ds = PreparedDataset.load(data)
    assert ds.dataset_sha256 == hashlib.sha256((data / DATASET_FILE).read_bytes()).hexdigest()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()
    with pytest.raises(UserError), gc_paused():
        raise UserError("x")
    assert gc.isenabled()


def test_row_view_is_a_read_only_sequence() -> None:
    view = RowView(3, lambda i: i * 10)
    assert list(view) == [0, 10, 20] and view[-1] == 20 and view[np.int64(1)] == 10 and view[::2] == [0, 20]
    assert view == [0, 10, 20] and len(view) == 3 and 10 in view
    with pytest.raises(IndexError):
        view[-4]
