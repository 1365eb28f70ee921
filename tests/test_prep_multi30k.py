"""``prep multi30k`` on the real Multi30k files of ``../shared/data`` (skipped when absent)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from prep.cli import main
from prep.dataset import PreparedDataset


@pytest.fixture(scope="module")
def multi30k(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PreparedDataset:
    out = tmp_path_factory.mktemp("m30k") / "multi30k"
    assert main(["multi30k", "--root", str(multi30k_dir), "--out", str(out)]) == 0
    return PreparedDataset.load(out)


def test_multi30k_counts(multi30k: PreparedDataset) -> None:
    counts = multi30k.counts()
    assert {sp: c["images"] for sp, c in counts.items()} == {"train": 29000, "val": 1014, "test": 1000}
    assert counts["train"]["pairs"] == 29000
    assert multi30k.languages == ["en", "de"]
    per_image = Counter((s.imgid, s.lang) for s in multi30k.sentences)
    assert set(per_image.values()) == {5} and len(per_image) == 2 * 31014


def test_multi30k_pairs_are_task1_translations(multi30k: PreparedDataset, multi30k_dir: Path) -> None:
    import gzip

    with gzip.open(multi30k_dir / "task1" / "raw" / "train.de.gz", "rt", encoding="utf-8") as fh:
        first_de = fh.readline().strip()
    pair = multi30k.pairs_of("train")[0]
    assert pair.sides["de"].raw == first_de
    assert pair.sides["de"].tokens[0] == first_de.split()[0].lower()
    assert multi30k.images[pair.imgid].filename == "1000092795.jpg"
    # task2 test English captions are the standard Flickr30k test captions, in the test image order
    test = multi30k.images_of("test")
    assert [s.lang for s in multi30k.sentences_of("test", "en")][:5] == ["en"] * 5
    assert len(multi30k.sentences_of("test", "de")) == 5 * len(test)
