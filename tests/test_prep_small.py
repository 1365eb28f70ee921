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
    assert main(args) == 0
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
    err = _run(["coco", "--karpathy", str(path), "--images", str(images), "--out", str(out), "--strict"],
               capsys)
    assert "2 of 3 images missing" in err
    assert (out / "dataset.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_options_and_help(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = _run(["coco", "--out", str(tmp_path / "o")], capsys)
    assert "--karpathy" in err
    err = _run(["multi30k", "--root", str(tmp_path), "--out", str(tmp_path / "o")], capsys)
    assert "no such file" in err
    with pytest.raises(SystemExit) as exc:
        main(["synthetic", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--num-images", "--image-size", "--seed", "--pipeline", "--strict", "--min-char-count"):
        assert option in text
