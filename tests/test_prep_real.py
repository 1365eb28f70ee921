"""``prep`` on the real data of ``../shared/data`` (skipped when it is absent)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from prep.cli import main
from prep.dataset import PreparedDataset
from prep.sources.coco import karpathy_from_flat


def _prep(args: list[str]) -> None:
    assert main(args) == 0


def test_f8k_token_file(flickr8k_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "f8k"
    _prep(["f8k", "--token-file", str(flickr8k_dir / "Flickr8k.token.txt"),
           "--images", str(flickr8k_dir / "images"), "--out", str(out)])
    summary = capsys.readouterr().out
    assert "train 6000 images / 30000 sentences" in summary
    ds = PreparedDataset.load(out)
    assert {sp: c["images"] for sp, c in ds.counts().items()} == {"train": 6000, "val": 1000, "test": 1000}
    assert all(len(im.sentids) == 5 for im in ds.images)
    # the order of the official lists (and of Karpathy's dataset_flickr8k.json)
    first_train = (flickr8k_dir / "Flickr_8k.trainImages.txt").read_text().split()[0]
    assert ds.images[0].filename == first_train and ds.images[6000].split == "val"
    assert ds.images[0].path == (flickr8k_dir / "images" / first_train).resolve()
    rec = ds.record
    assert rec["excluded"] == {"images_in_no_split": 92}
    assert rec["missing_images"]["count"] == 8000 - 2  # only two images are in the shared folder
    s = ds.sentences_of("train")[0]
    assert s.lang == "en" and s.tokens == tuple(t.lower() for t in s.tokens)


def test_f8k_vocabulary_is_train_only(flickr8k_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "f8k"
    _prep(["f8k", "--token-file", str(flickr8k_dir / "Flickr8k.token.txt"), "--out", str(out),
           "--min-word-count", "2"])
    ds = PreparedDataset.load(out)
    train_counts = Counter(t for s in ds.sentences_of("train") for t in s.tokens)
    test_only = {t for s in ds.sentences_of("test") for t in s.tokens} - set(train_counts)
    assert test_only, "the real test split has words never seen in train"
    assert not test_only & set(ds.words.symbols)
    assert all(train_counts[t] >= 2 for t in ds.words.symbols[2:])
    assert ds.words.symbols[:2] == ["<pad>", "<unk>"] and ds.chars.symbols[:2] == ["<pad>", "<unk>"]
    train_chars = {c for s in ds.sentences_of("train") for c in s.raw.lower()}
    assert set(ds.chars.symbols[2:]) == train_chars


def test_coco_sample_karpathy(coco_sample: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    karpathy = tmp_path / "dataset_coco_sample.json"
    data = karpathy_from_flat(coco_sample / "train.json", coco_sample / "val.json", karpathy)
    assert len(data["images"]) == 801
    per_image = Counter(len(im["sentences"]) for im in data["images"])
    assert per_image[6] == 1 and sum(k * n for k, n in per_image.items()) == 4000  # 2 to 6 captions
    out = tmp_path / "coco"
    _prep(["coco", "--karpathy", str(karpathy), "--images", str(coco_sample / "images"), "--out", str(out)])
    summary = capsys.readouterr().out
    assert ("train 600 images / 2999 sentences; val 100 images / 497 sentences; test 101 images / 503 "
            "sentences; 0 pairs; dropped: 1 captions beyond 5;") in summary
    ds = PreparedDataset.load(out)
    assert {sp: c["images"] for sp, c in ds.counts().items()} == {"train": 600, "val": 100, "test": 101}
    assert ds.record["missing_images"]["count"] == 0
    assert all(im.path.is_file() for im in ds.images)
    first = json.loads((coco_sample / "train.json").read_text())[0]
    assert ds.images[0].cocoid == int(first["image_id"].split("_")[-1].split(".")[0])
    assert ds.sentences[0].raw == first["caption"]
    # at most 5 captions per image: the first 5 of the image with 6 are kept
    assert len(ds.sentences) == 3999 and ds.record["dropped"] == {"captions_beyond_5": 1}
    six = next(im for im in data["images"] if len(im["sentences"]) == 6)
    kept = [s.raw for s in ds.sentences if s.imgid == six["imgid"]]
    assert kept == [s["raw"] for s in six["sentences"][:5]]
    filenames, texts = [im.filename for im in ds.images], [s.raw for s in ds.sentences]
    _prep(["coco", "--karpathy", str(karpathy), "--images", str(coco_sample / "images"), "--out", str(out),
           "--overwrite", "--all-captions"])
    assert len(PreparedDataset.load(out).sentences) == 4000

    # the same from the flat lists directly; the inputs recorded are the two flat files
    flat = tmp_path / "coco_flat"
    _prep(["coco", "--flat", str(coco_sample / "train.json"), str(coco_sample / "val.json"),
           "--out", str(flat)])
    ds_flat = PreparedDataset.load(flat)
    assert [im.filename for im in ds_flat.images] == filenames
    assert [s.raw for s in ds_flat.sentences] == texts
    assert all(im.path.is_file() for im in ds_flat.images)
    recorded = json.dumps(ds_flat.record["inputs"])
    assert "train.json" in recorded and "val.json" in recorded


def test_coco_official_caption_schema(coco_annotation_samples: Path, tmp_path: Path) -> None:
    # The shared samples keep the real schema and values, but their images and annotations are not
    # aligned: give each real annotation to a real image in turn, and split the images 60/20/10/10.
    real = json.loads((coco_annotation_samples / "captions_val2014.json_samples.json").read_text())
    ids = [im["id"] for im in real["images"]]
    for k, ann in enumerate(real["annotations"]):
        ann["image_id"] = ids[k % len(ids)]
    ann_file = tmp_path / "captions_val2014.json"
    ann_file.write_text(json.dumps(real))
    split_file = tmp_path / "splits.json"
    split_file.write_text(json.dumps({"train": ids[:60], "restval": ids[60:80], "val": ids[80:90],
                                      "test": ids[90:]}))
    out = tmp_path / "coco"
    _prep(["coco", "--annotations", str(ann_file), "--split-file", str(split_file), "--out", str(out)])
    ds = PreparedDataset.load(out)
    assert {sp: c["images"] for sp, c in ds.counts().items()} == {"train": 80, "val": 10, "test": 10}
    assert sum(im.karpathy_split == "restval" for im in ds.images) == 20
    assert ds.images[0].filepath == "val2014" and ds.images[0].cocoid == ids[0]
    assert ds.sentences[0].raw == " ".join(real["annotations"][0]["caption"].split())
    _prep(["coco", "--annotations", str(ann_file), "--split-file", str(split_file), "--out", str(out),
           "--no-restval", "--overwrite"])
    ds = PreparedDataset.load(out)
    assert ds.counts()["train"]["images"] == 60 and ds.record["excluded"] == {"restval_images": 20}
