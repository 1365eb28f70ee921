"""A precomp export read with SCAN's own rules: every caption meets its image.

SCAN's ``PrecompDataset`` (and VSE++'s) reads ``{split}_caps.txt`` one caption per line and
``{split}_ims.npy`` one row per image, and pairs caption ``i`` with image ``i // im_div``, where
``im_div = 5`` when there are more captions than images and 1 otherwise. A split whose images do not
all have 5 (or all 1) captions cannot be written so that this holds, so the export refuses it unless
``--captions-per-image K`` picks the policy: each image's first K captions, repeated in order where it
has fewer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import annotated_dataset, make_prepared, make_store, random_regions, write_butd_tsv

from features.cli import main
from prep.dataset import PreparedDataset


def scan_pairs(folder: Path, name: str) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """SCAN's reading of a precomp part: the image rows and ``(image row, caption)`` per caption line."""
    ims = np.load(folder / f"{name}_ims.npy")
    caps = (folder / f"{name}_caps.txt").read_text(encoding="utf-8").splitlines()
    im_div = 5 if ims.shape[0] != len(caps) else 1
    return ims, [(i // im_div, c) for i, c in enumerate(caps)]


@pytest.fixture(scope="module")
def ragged(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ragged")
    prepared = make_prepared(root / "prepared", n_train=6, n_val=4, n_test=5)  # 2 or 3 captions per image
    return prepared, make_store(root / "feats.zarr", prepared)


def test_a_ragged_split_is_refused_without_a_policy(ragged, tmp_path, capsys) -> None:
    prepared, store = ragged
    out = tmp_path / "out"
    assert main(["export", "--store", str(store), "--data", str(prepared), "--format", "precomp",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "images have 2 to 3 captions" in err and "--captions-per-image 5" in err
    assert not out.exists()


@pytest.mark.parametrize("keep", [5, 1])
def test_with_a_policy_every_caption_meets_its_image_under_scans_rules(ragged, tmp_path, keep) -> None:
    prepared, store = ragged
    out = tmp_path / "out"
    assert main(["export", "--store", str(store), "--data", str(prepared), "--format", "precomp",
                 "--out", str(out), "--captions-per-image", str(keep)]) == 0
    dataset = PreparedDataset.load(prepared)
    x = np.asarray(__import__("zarr").open_group(str(store), mode="r")["global"][:])
    for split, name in (("train", "train"), ("val", "dev"), ("test", "test")):
        ims, pairs = scan_pairs(out, name)
        ids = json.loads((out / f"{name}_ids.json").read_text())
        imgids = [im["imgid"] for im in ids["images"]]
        assert imgids == dataset.image_rows(split)
        np.testing.assert_array_equal(ims, x[imgids])  # row k is image imgids[k]
        assert len(pairs) == keep * len(imgids)
        for row, caption in pairs:  # SCAN's image of each caption is the image it describes
            own = [" ".join(s.raw.split()) for s in dataset.sentences if s.imgid == imgids[row]]
            assert caption in own, (split, row, caption)
        for row, imgid in enumerate(imgids):  # its first captions, in order, repeated where fewer
            own = [" ".join(s.raw.split()) for s in dataset.sentences if s.imgid == imgid]
            got = [c for r, c in pairs if r == row]
            assert got == [own[k % len(own)] for k in range(keep)]
        counts = [sum(s.imgid == i for s in dataset.sentences) for i in imgids]
        assert ids["captions_per_image"] == {"en": keep}
        assert ids["captions_policy"]["en"] == {"repeated": sum(max(0, keep - n) for n in counts),
                                                "dropped": sum(max(0, n - keep) for n in counts)}


def test_padded_region_rows_come_with_their_counts(tmp_path, capsys) -> None:
    names = [f"COCO_val2014_{i:012d}.jpg" for i in (391895, 522418, 184613)]
    data = annotated_dataset(tmp_path, names, ["train", "train", "train"])
    rng = np.random.default_rng(1)
    regions = {cid: random_regions(rng, n, 8) for cid, n in ((391895, 6), (522418, 2), (184613, 4))}
    write_butd_tsv(tmp_path / "r.tsv", [(cid, 640, 480, *regions[cid]) for cid in regions])
    store = tmp_path / "r.zarr"
    assert main(["import", "--format", "butd-tsv", "--tsv", str(tmp_path / "r.tsv"), "--data",
                 str(data.root), "--out", str(store)]) == 0
    capsys.readouterr()
    assert main(["export", "--store", str(store), "--data", str(data.root), "--format", "precomp",
                 "--out", str(tmp_path / "exp")]) == 0
    assert "regions per image vary (2 to 6)" in capsys.readouterr().err
    ims = np.load(tmp_path / "exp" / "train_ims.npy")
    counts = np.load(tmp_path / "exp" / "train_counts.npy")
    assert ims.shape == (3, 6, 8) and counts.tolist() == [6, 2, 4]
    for row, cid in enumerate((391895, 522418, 184613)):
        np.testing.assert_array_equal(ims[row, :counts[row]], regions[cid][1])
        assert (ims[row, counts[row]:] == 0).all()


def read_butd_like_the_peer(path: Path) -> dict[str, tuple[int, int, int, np.ndarray, np.ndarray]]:
    """bottom-up-attention's reader, from its description: csv.DictReader over the tab-separated fields
    (field size limit raised), boxes and features base64 float32 reshaped to (num_boxes, -1)."""
    import base64
    import csv
    import sys

    fields = ["image_id", "image_w", "image_h", "num_boxes", "boxes", "features"]
    before = csv.field_size_limit(sys.maxsize)
    try:
        with open(path, newline="") as fh:
            out = {}
            for item in csv.DictReader(fh, delimiter="\t", fieldnames=fields):
                n = int(item["num_boxes"])
                boxes = np.frombuffer(base64.b64decode(item["boxes"]), dtype=np.float32).reshape(n, 4)
                feats = np.frombuffer(base64.b64decode(item["features"]), dtype=np.float32).reshape(n, -1)
                out[item["image_id"]] = (int(item["image_w"]), int(item["image_h"]), n, boxes, feats)
    finally:
        csv.field_size_limit(before)
    return out


def test_a_region_store_round_trips_through_butd_tsv_bit_for_bit(tmp_path, capsys) -> None:
    from features.store.core import FeatureStore

    names = [f"COCO_val2014_{i:012d}.jpg" for i in (391895, 522418, 184613, 318219)]
    data = annotated_dataset(tmp_path, names, ["train", "train", "val", "test"])
    rng = np.random.default_rng(5)
    regions = {cid: random_regions(rng, n, 8) for cid, n in ((391895, 6), (522418, 2), (184613, 4))}
    write_butd_tsv(tmp_path / "in.tsv", [(cid, 640 + n, 480 - n, *regions[cid])
                                     for n, cid in enumerate(regions)])  # 318219 missing: invalid
    store = tmp_path / "a.zarr"
    assert main(["import", "--format", "butd-tsv", "--tsv", str(tmp_path / "in.tsv"), "--data",
                 str(data.root), "--out", str(store)]) == 0
    assert main(["export", "--store", str(store), "--data", str(data.root), "--format", "butd-tsv",
                 "--out", str(tmp_path / "out.tsv")]) == 2  # a failed image: refused by default
    assert "--allow-invalid" in capsys.readouterr().err
    assert main(["export", "--store", str(store), "--data", str(data.root), "--format", "butd-tsv",
                 "--allow-invalid", "--out", str(tmp_path / "out.tsv")]) == 0
    # the peer's reader decodes the toolkit's file to the original arrays
    peer = read_butd_like_the_peer(tmp_path / "out.tsv")
    assert sorted(peer) == sorted(str(c) for c in regions)
    for n, (cid, (boxes, feats)) in enumerate(regions.items()):
        w, h, count, got_boxes, got_feats = peer[str(cid)]
        assert (w, h, count) == (640 + n, 480 - n, len(boxes))
        np.testing.assert_array_equal(got_boxes, boxes)
        np.testing.assert_array_equal(got_feats, feats)
    # and the toolkit reads it back to the same store arrays, bit for bit
    again = tmp_path / "b.zarr"
    assert main(["import", "--format", "butd-tsv", "--tsv", str(tmp_path / "out.tsv"), "--data",
                 str(data.root), "--out", str(again)]) == 0
    a, b = FeatureStore(store), FeatureStore(again)
    for name in ("regions", "boxes", "counts", "image_size", "valid", "imgid"):
        np.testing.assert_array_equal(np.asarray(b.array(name)[:]), np.asarray(a.array(name)[:]), name)
