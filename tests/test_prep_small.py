"""``prep`` on small fixtures: YJ Captions, synthetic, and every bad-input case."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from prep.cli import main
from prep.dataset import PreparedDataset
from prep.sources.synthetic import COLOURS, SHAPES

FIXTURES = Path(__file__).parent / "fixtures" / "prep"
YJ = FIXTURES / "yjcaptions_small.json"


def _karpathy(tmp_path: Path, images: list[dict], name: str = "karpathy.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"dataset": "coco", "images": images}), encoding="utf-8")
    return path


def _image(cocoid: int, split: str, captions: list[str], sent0: int = 0, filepath: str = "train2014") -> dict:
    return {"filepath": filepath, "filename": f"COCO_{filepath}_{cocoid:012d}.jpg", "cocoid": cocoid,
            "split": split, "sentences": [{"raw": c, "sentid": sent0 + k} for k, c in enumerate(captions)]}


def _coco_for_yj(tmp_path: Path) -> Path:
    ids = [im["id"] for im in json.loads(YJ.read_text(encoding="utf-8"))["images"]]
    return _karpathy(tmp_path, [_image(c, "restval", [f"an english caption {k}", f"another one {k}"], 10 * k)
                                for k, c in enumerate(ids)])


def test_yjcaptions(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "yj"
    args = ["yjcaptions", "--yj", str(YJ), "--coco-karpathy", str(_coco_for_yj(tmp_path)), "--out", str(out),
            "--val-images", "2", "--test-images", "2", "--seed", "3"]
    assert main(args) == 0
    assert "dropped: 1 empty captions" in capsys.readouterr().out
    ds = PreparedDataset.load(out)
    assert ds.languages == ["en", "ja"]
    assert {sp: c["images"] for sp, c in ds.counts().items()} == {"train": 4, "val": 2, "test": 2}
    ja = [s for s in ds.sentences if s.lang == "ja"]
    assert len(ja) == 16 and all(s.original for s in ja)
    bus = next(s for s in ja if s.original == "街の中を赤いバスが走る。")
    assert bus.raw == "machi no naka wo akai basu ga hashiru." and bus.tokens[-2:] == ("hashiru", ".")
    assert all(c.isascii() for s in ja for c in s.raw)
    # image-level pairs: k-th Japanese with k-th English caption of the same image
    pair = next(p for p in ds.pairs if p.sides["ja"].original == "街の中を赤いバスが走る。")
    assert pair.sides["en"].raw.startswith("another one") and pair.imgid == bus.imgid
    assert ds.record["notes"]["split_seed"] == 3
    # the same seed gives the same split; the vocabulary has romaji only
    first = [im.split for im in ds.images]
    assert main([*args, "--overwrite"]) == 0
    assert [im.split for im in PreparedDataset.load(out).images] == first
    assert all(c.isascii() for c in ds.chars.symbols[2:])


def test_synthetic_is_deterministic_and_describes_the_images(tmp_path: Path) -> None:
    from PIL import Image

    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert main(["synthetic", "--out", str(out), "--num-images", "36", "--image-size", "64"]) == 0
    da, db = (json.loads((d / "dataset.json").read_text()) for d in (a, b))
    assert da.pop("images_root") == str(a) and db.pop("images_root") == str(b)
    assert da == db
    png = Path("images") / "synthetic_000007.png"
    assert (a / png).read_bytes() == (b / png).read_bytes()
    ds = PreparedDataset.load(a)
    assert {sp: c["images"] for sp, c in ds.counts().items()} == {"train": 30, "val": 3, "test": 3}
    for im in ds.images:
        en = [s.raw for s in ds.sentences if s.imgid == im.imgid and s.lang == "en"]
        assert len(en) == 5 and len(set(en)) == 5
        assert len([s for s in ds.sentences if s.imgid == im.imgid and s.lang == "ja"]) == 5
        # the colours a caption names are drawn in the image
        rgb = np.asarray(Image.open(im.path).convert("RGB")).reshape(-1, 3)
        pixels = {tuple(int(v) for v in p) for p in np.unique(rgb, axis=0)}
        named = {c for c in COLOURS if any(f" {c} " in f" {t} " for t in en)}
        assert named and all(COLOURS[c][0] in pixels for c in named)
        assert any(k in en[0] for k in SHAPES)


def _run(args: list[str], capsys: pytest.CaptureFixture) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("prep: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_malformed_json_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "dataset_coco.json"
    bad.write_text('{"images": [\n {"split": "train",}\n]}')
    err = _run(["coco", "--karpathy", str(bad), "--out", str(tmp_path / "o")], capsys)
    assert str(bad) in err and "line 2" in err
    assert not (tmp_path / "o").exists()


def test_missing_field(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    img = _image(1, "train", ["a dog"])
    del img["filename"]
    path = _karpathy(tmp_path, [_image(2, "train", ["a cat"]), img])
    err = _run(["coco", "--karpathy", str(path), "--out", str(tmp_path / "o")], capsys)
    assert f"{path}: images[1]: missing field 'filename'" in err


def test_duplicate_ids_are_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _karpathy(tmp_path, [_image(1, "train", ["a dog"]), _image(1, "test", ["a dog"], sent0=5)])
    assert "duplicate image" in _run(["coco", "--karpathy", str(path), "--out", str(tmp_path / "o")], capsys)
    path = _karpathy(tmp_path, [_image(1, "train", ["a dog"]), _image(2, "test", ["a cat"])], "dup_sent.json")
    err = _run(["coco", "--karpathy", str(path), "--out", str(tmp_path / "o")], capsys)
    assert "duplicate sentence id 0" in err and "images[1]" in err
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("a.jpg#0\tone\na.jpg#0\ttwo\n")
    err = _run(["f8k", "--token-file", str(tokens), "--out", str(tmp_path / "o")], capsys)
    assert f"{tokens}: line 2: duplicate caption id 'a.jpg#0'" in err


def test_empty_captions_dropped_and_missing_images(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    images = tmp_path / "imgs"
    (images / "train2014").mkdir(parents=True)
    (images / "train2014" / "COCO_train2014_000000000001.jpg").write_bytes(b"x")
    path = _karpathy(tmp_path, [_image(1, "train", ["A dog.", "  ", ""]),
                                _image(2, "val", ["a cat", "\t"], 10), _image(3, "test", ["a bird"], 20)])
    out = tmp_path / "o"
    assert main(["coco", "--karpathy", str(path), "--images", str(images), "--out", str(out)]) == 0
    summary = capsys.readouterr().out
    assert "dropped: 3 empty captions" in summary and "2 images missing" in summary
    ds = PreparedDataset.load(out)
    assert [s.raw for s in ds.sentences] == ["A dog.", "a cat", "a bird"]
    assert ds.sentences[0].tokens == ("a", "dog", ".")
    assert ds.record["missing_images"] == {"count": 2, "first": ["train2014/COCO_train2014_000000000002.jpg",
                                                                 "train2014/COCO_train2014_000000000003.jpg"]}
    # --strict: an error, and the earlier output stays as it was
    before = (out / "dataset.json").read_bytes()
    err = _run(["coco", "--karpathy", str(path), "--images", str(images), "--out", str(out), "--strict",
                "--overwrite"], capsys)
    assert "2 of 3 images missing" in err
    assert (out / "dataset.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_options_and_help(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = _run(["coco", "--out", str(tmp_path / "o")], capsys)
    assert "--karpathy" in err
    (tmp_path / "m30k").mkdir()
    err = _run(["multi30k", "--root", str(tmp_path / "m30k"), "--out", str(tmp_path / "o")], capsys)
    assert "no such file" in err
    with pytest.raises(SystemExit) as exc:
        main(["synthetic", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--num-images", "--image-size", "--seed", "--pipeline", "--strict", "--min-char-count"):
        assert option in text


# -- captions per image (COCO: the first 5, as VSE++/SCAN) ------------------------------------------

CAPTIONS = {1: ["c0", "", "c2", "c3", "c4", "c5", "c6"], 2: [f"d{k}" for k in range(6)],
            3: ["e0", "e1", "e2"], 4: [f"f{k}" for k in range(5)]}
SPLIT = {1: "train", 2: "train", 3: "val", 4: "test"}


def _images(tmp_path: Path) -> Path:
    (tmp_path / "images").mkdir(exist_ok=True)
    return tmp_path / "images"


def _coco_inputs(tmp_path: Path) -> dict[str, list[str]]:
    """The same four images and captions as a Karpathy JSON, official files + split file, flat lists."""
    karpathy = _karpathy(tmp_path, [_image(c, SPLIT[c], CAPTIONS[c], 10 * c) for c in CAPTIONS])
    name = {c: f"COCO_train2014_{c:012d}.jpg" for c in CAPTIONS}
    official = tmp_path / "captions_train2014.json"
    official.write_text(json.dumps({
        "images": [{"id": c, "file_name": name[c]} for c in CAPTIONS],
        "annotations": [{"image_id": c, "id": 10 * c + k, "caption": t}
                        for c, caps in CAPTIONS.items() for k, t in enumerate(caps)]}))
    split_file = tmp_path / "splits.json"
    split_file.write_text(json.dumps({sp: [c for c in CAPTIONS if SPLIT[c] == sp] for sp in ("train", "val",
                                                                                            "test")}))
    flat = {}
    for kind, ids in (("train", [1, 2]), ("val", [3, 4])):
        flat[kind] = tmp_path / f"{kind}.json"
        flat[kind].write_text(json.dumps([{"image_path": f"images/{name[c]}", "caption": t,
                                           "image_id": name[c]} for c in ids for t in CAPTIONS[c]]))
    return {"karpathy": ["--karpathy", str(karpathy)],
            "official": ["--annotations", str(official), "--split-file", str(split_file)],
            "flat": ["--flat", str(flat["train"]), str(flat["val"]), "--flat-val-images", "1"]}


@pytest.mark.parametrize("source", ["karpathy", "official", "flat"])
def test_coco_keeps_the_first_five_captions_of_an_image(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        source: str) -> None:
    inputs = [*_coco_inputs(tmp_path)[source], "--images", str(_images(tmp_path))]
    out = tmp_path / "o"
    assert main(["coco", *inputs, "--out", str(out)]) == 0
    assert "dropped: 1 empty captions, 2 captions beyond 5;" in capsys.readouterr().out
    ds = PreparedDataset.load(out)
    kept = {im.cocoid: [s.raw for s in ds.sentences if s.imgid == im.imgid] for im in ds.images}
    # the first five non-empty captions in the source's order; images with fewer keep them all
    assert kept == {1: ["c0", "c2", "c3", "c4", "c5"], 2: ["d0", "d1", "d2", "d3", "d4"],
                    3: ["e0", "e1", "e2"], 4: ["f0", "f1", "f2", "f3", "f4"]}
    assert ds.record["dropped"] == {"empty_captions": 1, "captions_beyond_5": 2}
    assert ds.record["counts"]["train"]["sentences"] == 10

    assert main(["coco", *inputs, "--out", str(out), "--overwrite", "--all-captions"]) == 0
    assert "dropped: 1 empty captions;" in capsys.readouterr().out
    ds = PreparedDataset.load(out)
    assert len(ds.sentences) == 6 + 6 + 3 + 5 and ds.record["options"]["all_captions"] is True

    assert main(["coco", *inputs, "--out", str(out), "--overwrite", "--captions-per-image", "3"]) == 0
    dropped = PreparedDataset.load(out).record["dropped"]
    assert dropped == {"empty_captions": 1, "captions_beyond_3": 3 + 3 + 2}


def test_other_datasets_keep_every_caption(tmp_path: Path) -> None:
    tokens = tmp_path / "Flickr8k.token.txt"
    tokens.write_text("".join(f"{n}.jpg#{k}\tcaption {k} of {n}\n"
                              for n in "abc" for k in range(6 if n == "a" else 5)))
    for name, n in (("train", "a"), ("dev", "b"), ("test", "c")):
        (tmp_path / f"Flickr_8k.{name}Images.txt").write_text(f"{n}.jpg\n")
    out = tmp_path / "f8k"
    assert main(["f8k", "--token-file", str(tokens), "--out", str(out)]) == 0
    ds = PreparedDataset.load(out)
    assert [len(im.sentids) for im in ds.images] == [6, 5, 5]
    assert "captions_beyond_5" not in ds.record["dropped"]


def test_prep_karpathy_reads_ones_own_data_in_any_language(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    images = [{"filename": f"{n}.jpg", "split": split,
               "sentences": [{"raw": f"Ein Hund Nummer {n} läuft."}] * 6}
              for n, split in (("a", "train"), ("b", "restval"), ("c", "val"), ("d", "test"))]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"images": images}), encoding="utf-8")
    (tmp_path / "imgs").mkdir()
    out = tmp_path / "mine"
    assert main(["karpathy", "--karpathy", str(path), "--images", str(tmp_path / "imgs"), "--lang", "de",
                 "--name", "dogs", "--out", str(out)]) == 0
    assert "prep karpathy: train 2 images / 12 sentences" in capsys.readouterr().out
    ds = PreparedDataset.load(out)
    assert ds.name == "dogs" and ds.languages == ["de"]
    assert [im.split for im in ds.images] == ["train", "train", "val", "test"]
    assert [len(im.sentids) for im in ds.images] == [6, 6, 6, 6]  # one's own data: nothing cut
    assert ds.sentences[0].lang == "de"
    assert ds.sentences[0].tokens == ("ein", "hund", "nummer", "a", "läuft", ".")
    assert main(["karpathy", "--out", str(tmp_path / "x")]) == 2
    assert "--karpathy FILE is required" in capsys.readouterr().err


# -- ids, encodings and image paths: one-line errors ---------------------------------------------------

@pytest.mark.parametrize("bad", [[1, 2], {"a": 1}])
def test_an_id_that_is_a_list_or_object_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                             bad: object) -> None:
    img = _image(2, "train", ["a cat", "a dog"])
    img["sentences"][1]["sentid"] = bad
    path = _karpathy(tmp_path, [_image(1, "train", ["a bird"], 10), img])
    err = _run(["coco", "--karpathy", str(path), "--out", str(tmp_path / "o")], capsys)
    assert f"{path}: images[1].sentences[1]: field 'sentid' must be an integer or a string id" in err
    img = _image(2, "train", ["a cat"])
    img["cocoid"] = bad
    path = _karpathy(tmp_path, [img], "cocoid.json")
    assert f"{path}: images[0]: field 'cocoid'" in _run(["coco", "--karpathy", str(path), "--out",
                                                         str(tmp_path / "o")], capsys)
    # the Karpathy file of yjcaptions, the ids of a COCO-format caption file and of a split file
    coco = _karpathy(tmp_path, [_image(1, "train", ["a cat"])], "coco.json")
    data = json.loads(coco.read_text())
    data["images"][0]["sentences"][0]["sentid"] = bad
    coco.write_text(json.dumps(data))
    err = _run(["yjcaptions", "--yj", str(YJ), "--coco-karpathy", str(coco), "--out", str(tmp_path / "o")],
               capsys)
    assert f"{coco}: images[0].sentences[0]: field 'sentid'" in err
    yj = tmp_path / "yj.json"
    yj.write_text(json.dumps({"annotations": [{"image_id": 1, "id": bad, "caption": "猫"}]}))
    err = _run(["yjcaptions", "--yj", str(yj), "--coco-karpathy", str(coco), "--out", str(tmp_path / "o")],
               capsys)
    assert f"{yj}: annotations[0]: field 'id'" in err
    split_file = tmp_path / "bad_splits.json"
    split_file.write_text(json.dumps({"train": [1, bad]}))
    official = _coco_inputs(tmp_path)["official"][1]
    err = _run(["coco", "--annotations", official, "--split-file", str(split_file),
                "--out", str(tmp_path / "o")], capsys)
    assert f"{split_file}: train[1]: field 'id'" in err
    assert not (tmp_path / "o").exists()


def test_split_lists_that_are_not_utf8_are_one_line_errors(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    tokens = tmp_path / "Flickr8k.token.txt"
    tokens.write_text("a.jpg#0\ta dog\n")
    for name in ("train", "dev", "test"):
        (tmp_path / f"Flickr_8k.{name}Images.txt").write_text("a.jpg\n")
    bad = tmp_path / "Flickr_8k.devImages.txt"
    bad.write_bytes(b"caf\xe9.jpg\n")
    err = _run(["f8k", "--token-file", str(tokens), "--out", str(tmp_path / "o")], capsys)
    assert err.startswith(f"prep: error: {bad}: not UTF-8 text")
    split_file = tmp_path / "bad_splits.json"
    split_file.write_bytes(b'{"train": ["caf\xe9.jpg"]}')
    official = _coco_inputs(tmp_path)["official"][1]
    err = _run(["coco", "--annotations", official, "--split-file", str(split_file),
                "--out", str(tmp_path / "o")], capsys)
    assert err.startswith(f"prep: error: {split_file}: not UTF-8 text")
    image_list = tmp_path / "m30k" / "task2" / "image_splits" / "train_images.txt"
    image_list.parent.mkdir(parents=True)
    image_list.write_bytes(b"\xff\xfe1.jpg\n")
    err = _run(["multi30k", "--root", str(tmp_path / "m30k"), "--out", str(tmp_path / "o")], capsys)
    assert err.startswith(f"prep: error: {image_list}: not UTF-8 text")


@pytest.mark.parametrize(("key", "value"), [("filename", "../../etc/passwd"), ("filename", "/etc/passwd"),
                                            ("filepath", ".."), ("filepath", "train2014/../../x"),
                                            ("filepath", "/data/coco")])
def test_image_paths_must_stay_inside_the_images_folder(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        key: str, value: str) -> None:
    img = _image(2, "train", ["a cat"], 5)
    img[key] = value
    path = _karpathy(tmp_path, [_image(1, "train", ["a dog"]), img])
    err = _run(["coco", "--karpathy", str(path), "--images", str(_images(tmp_path)), "--out",
                str(tmp_path / "o")], capsys)
    assert f"{path}: images[1]: {key} '{value}'" in err
    assert "absolute path" in err if value.startswith("/") else "'..' component" in err


def test_image_paths_of_line_based_sources_are_checked_too(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    tokens = tmp_path / "Flickr8k.token.txt"
    tokens.write_text("../a.jpg#0\ta dog\nb.jpg#0\ta cat\n")
    for name, n in (("train", "../a"), ("dev", "b"), ("test", "b")):
        (tmp_path / f"Flickr_8k.{name}Images.txt").write_text(f"{n}.jpg\n")
    (tmp_path / "Flickr_8k.testImages.txt").write_text("")
    err = _run(["f8k", "--token-file", str(tokens), "--out", str(tmp_path / "o")], capsys)
    assert "Flickr_8k.trainImages.txt: line 1: filename '../a.jpg' has a '..' component" in err
