"""The reader of ``dataset.json`` before its columns (one object per sentence, commit 9e5bbee), kept as the
reference that ``PreparedDataset.load`` is checked against, from a parse (tests/test_dataset_load.py) and
from its rows cache (tests/test_dataset_cache.py), with the files both tests read: a rich dataset and the
hostile edits."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from helpers import make_prepared

from prep.dataset import DATASET_FILE, SPLITS, ImageEntry, PreparedDataset, Sentence, _load_pair
from prep.dataset_rows import TOKEN_SEP
from vsecore.errors import UserError


def _field(obj: Any, key: str, file: Path, where: str) -> Any:
    try:
        return obj[key]
    except (KeyError, TypeError):
        raise UserError(f"{file}: {where}: missing field '{key}'") from None


def reference_load(root: Path) -> dict[str, Any]:
    """The reader before the columns: one Sentence and one ImageEntry per row (commit 9e5bbee)."""
    file = root / DATASET_FILE
    try:
        with open(file, encoding="utf-8") as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise UserError(f"{file}: line {exc.lineno}, column {exc.colno}: malformed JSON: {exc.msg}") from None
    except RecursionError:  # the wording of the one JSON reader (vsecore.jsonfile.parse_json) since issue 42
        raise UserError(f"{file}: JSON nested too deeply to read") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if isinstance(data, dict) and data.get("task") == "textcls":
        raise UserError(f"{root}: a text classification dataset (prep textcls): it has no images; use "
                        "`train classify --data` with it")
    images_root = Path(_field(data, "images_root", file, "top level"))
    images, sentences = [], []
    for row, img in enumerate(_field(data, "images", file, "top level")):
        where = f"images[{row}]"
        imgid = int(_field(img, "imgid", file, where))
        if imgid != row:
            raise UserError(f"{file}: {where}: imgid {imgid} is not its row {row}")
        filepath = img.get("filepath")
        filename = _field(img, "filename", file, where)
        sent_ids = []
        for k, s in enumerate(_field(img, "sentences", file, where)):
            sw = f"{where}.sentences[{k}]"
            sentences.append(Sentence(
                sentid=int(_field(s, "sentid", file, sw)), imgid=imgid,
                raw=_field(s, "raw", file, sw), tokens=tuple(_field(s, "tokens", file, sw)),
                lang=_field(s, "lang", file, sw), original=s.get("original")))
            sent_ids.append(sentences[-1].sentid)
        images.append(ImageEntry(
            imgid=imgid, split=_field(img, "split", file, where), filename=filename,
            path=images_root / filepath / filename if filepath else images_root / filename,
            filepath=filepath, cocoid=img.get("cocoid"), karpathy_split=img.get("karpathy_split"),
            sentids=tuple(sent_ids)))
    pairs = [_load_pair(p, file, k) for k, p in enumerate(data.get("pairs", []))]
    return {"name": data.get("dataset", root.name), "languages": list(data.get("languages", ["en"])),
            "images": images, "sentences": sentences, "pairs": pairs, "images_root": images_root}


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # the same exception, type and text, is what is compared
        return type(exc).__name__, str(exc)


def assert_same_as_reference(root: Path) -> None:
    """Load ``root`` both ways: the same error, or the same content through every reading method."""
    ref, new = outcome(lambda: reference_load(root)), outcome(lambda: PreparedDataset.load(root))
    assert ref[0] == new[0] and (ref[0] == "ok" or ref[1] == new[1]), (ref, new)
    if ref[0] != "ok":
        return
    ref, ds = ref[1], new[1]
    assert (ds.name, ds.languages, ds.pairs, ds.images_root) == (ref["name"], ref["languages"], ref["pairs"],
                                                               ref["images_root"])
    assert list(ds.images) == ref["images"] and list(ds.sentences) == ref["sentences"]
    assert len(ds.images) == len(ref["images"]) and len(ds.sentences) == len(ref["sentences"])
    assert [str(p) for p in ds.image_paths()] == [str(im.path) for im in ref["images"]]
    for split in (None, *SPLITS):
        in_split = [im for im in ref["images"] if split is None or im.split == split]
        assert ds.images_of(split) == in_split and ds.image_rows(split) == [im.imgid for im in in_split]
        if split is not None:
            assert ds.split_mask(split).tolist() == [im.split == split for im in ref["images"]]
        for lang in (None, *ds.languages, ds.languages):
            assert_same_sentences(ds, ref, split, lang)
    rows = [[f"{im.filepath}/{im.filename}" if im.filepath else im.filename, im.split]
            for im in ref["images"]]
    digest = hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()
    assert ds.images_fingerprint() == digest
    assert outcome(ds.counts) == outcome(lambda: reference_counts(ref["images"], ref["pairs"]))


def assert_same_sentences(ds: PreparedDataset, ref: dict[str, Any], split: str | None,
                           lang: str | list[str] | None) -> None:
    langs = None if lang is None else ({lang} if isinstance(lang, str) else set(lang))
    expected = outcome(lambda: [s for s in ref["sentences"] if (
        split is None or ref["images"][s.imgid].split == split) and (langs is None or s.lang in langs)])
    got = outcome(lambda: ds.sentences_of(split, lang))
    assert got == expected, (split, lang)
    if got[0] == "ok":
        assert ds.captions(split, lang) == ([s.raw for s in got[1]], [s.imgid for s in got[1]])
        assert ds.captioned_rows(split, lang).tolist() == sorted({s.imgid for s in got[1]})


def reference_counts(images: list[ImageEntry], pairs: list[Any]) -> dict[str, dict[str, int]]:
    out = {sp: {"images": 0, "sentences": 0, "pairs": 0} for sp in SPLITS}
    for im in images:
        out[im.split]["images"] += 1
        out[im.split]["sentences"] += len(im.sentids)
    for p in pairs:
        out[p.split]["pairs"] += 1
    return out


def rich(tmp_path: Path) -> Path:
    """make_prepared, plus what it lacks: a second language with originals, file paths, COCO ids, pairs,
    tokens that are empty, hold the packing separator or an empty token."""
    data = make_prepared(tmp_path / "rich", n_train=6, n_val=2, n_test=2)
    content = json.loads((data / DATASET_FILE).read_text())
    sentid = 100
    for im in content["images"]:
        im["filepath"] = "train2014" if im["split"] == "train" else ""
        im["cocoid"] = 1000 + im["imgid"]
        im["karpathy_split"] = "restval" if im["imgid"] == 1 else im["split"]
        im["sentences"].append({"sentid": sentid, "imgid": im["imgid"], "raw": "ネコ", "lang": "ja",
                                "tokens": ["neko"], "original": "猫"})
        sentid += 1
    content["images"][0]["sentences"][0]["tokens"] = []
    content["images"][1]["sentences"][0]["tokens"] = ["a" + TOKEN_SEP + "b", "c"]
    content["images"][2]["sentences"][0]["tokens"] = ["", "x", ""]
    content["languages"] = ["en", "ja"]
    content["pairs"] = [{"pairid": 0, "imgid": 0, "split": "train",
                         "en": {"raw": "a cat", "tokens": ["a", "cat"]},
                         "ja": {"raw": "ネコ", "tokens": ["neko"], "original": "猫", "sentid": 3}}]
    (data / DATASET_FILE).write_text(json.dumps(content))
    return data


def edit(data: Path, change: Any) -> Path:
    content = json.loads((data / DATASET_FILE).read_text())
    change(content)
    (data / DATASET_FILE).write_text(json.dumps(content))
    return data


def sentence(i: int, k: int, **values: Any) -> Any:
    def change(content: dict) -> None:
        s = content["images"][i]["sentences"][k]
        for key, value in values.items():
            if value is KeyError:
                del s[key]
            else:
                s[key] = value
    return change


def image(i: int, **values: Any) -> Any:
    def change(content: dict) -> None:
        for key, value in values.items():
            if value is KeyError:
                del content["images"][i][key]
            else:
                content["images"][i][key] = value
    return change


HOSTILE = {
    "no images_root": lambda c: c.pop("images_root"),
    "images not a list": lambda c: c.update(images=7),
    "an image not an object": lambda c: c["images"].__setitem__(1, "x"),
    "imgid not its row": image(2, imgid=5),
    "imgid a string": image(0, imgid="0"),
    "imgid not a number": image(0, imgid="zero"),
    "no filename": image(1, filename=KeyError),
    "no split": image(1, split=KeyError),
    "an unknown split": image(1, split="holdout"),
    "a split that is a list": image(1, split=["train"]),
    "no sentences": image(1, sentences=KeyError),
    "sentences not a list": image(1, sentences=3),
    "filepath a number": image(1, filepath=5),
    "filename a number": image(1, filename=5),
    "a sentence not an object": lambda c: c["images"][1]["sentences"].__setitem__(0, "a cat"),
    "no sentid": sentence(1, 0, sentid=KeyError),
    "sentid a string": sentence(1, 0, sentid="12"),
    "sentid not a number": sentence(1, 0, sentid="twelve"),
    "sentid null": sentence(1, 0, sentid=None),
    "sentid past int64": sentence(1, 0, sentid=10**30),
    "no raw": sentence(1, 1, raw=KeyError),
    "no tokens": sentence(1, 1, tokens=KeyError),
    "tokens a number": sentence(1, 1, tokens=3),
    "tokens a string": sentence(1, 1, tokens="abc"),
    "tokens of numbers": sentence(1, 1, tokens=[1, 2]),
    "tokens an object": sentence(1, 1, tokens={"a": 1}),
    "no lang": sentence(1, 1, lang=KeyError),
    "lang a list": sentence(1, 1, lang=["en"]),
    "a pair without its split": lambda c: c.update(pairs=[{"pairid": 0, "imgid": 0}]),
    "a text classification dataset": lambda c: c.update(task="textcls"),
    "not an object": lambda c: c.clear(),
}
