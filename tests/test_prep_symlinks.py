"""Symbolic links inside ``--images`` are followed; paths written in annotation files may not leave it.

Issue 27: ``ROOT/val2014 -> /datasets/coco/val2014`` is how groups share one COCO download, and ``prep
coco --karpathy K --images ROOT`` must prepare the same ``dataset.json`` from such a root as from one
holding the files. What stays refused is a path written in an annotation, split or token file that
leaves ``--images`` (absolute, ``..``): those files come from elsewhere.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from features.extractors.images import load_image
from prep.cli import main
from prep.dataset import PreparedDataset
from prep.sources.coco import karpathy_from_flat

#: the images of the small COCO layout: (file name, Karpathy split); a train2014 and a val2014 folder
_GENERATED = [(f"COCO_train2014_{k:012d}.jpg", "train") for k in (11, 12, 13)] + [
    (f"COCO_val2014_{k:012d}.jpg", split) for k, split in ((21, "restval"), (22, "val"), (23, "val"),
                                                            (24, "test"), (25, "test"))]


def _folder(filename: str) -> str:
    return "train2014" if "_train2014_" in filename else "val2014"


def _generated_download(tmp_path: Path) -> tuple[Path, list[dict]]:
    """Small real JPEGs in one folder (as a shared download keeps them) and their Karpathy entries."""
    download = tmp_path / "download"
    download.mkdir()
    images = []
    for k, (name, split) in enumerate(_GENERATED):
        Image.new("RGB", (24 + k, 16), (40 * k % 256, 90, 200)).save(download / name, "JPEG")
        sentences = [{"raw": f"a photo number {k} of a {w}", "sentid": 10 * k + j}
                     for j, w in enumerate(("dog", "cat", "bird"))]
        images.append({"filepath": _folder(name), "filename": name, "cocoid": int(name[-16:-4]), "imgid": k,
                       "split": split, "sentences": sentences})
    return download, images


def _real_download(coco_sample: Path) -> tuple[Path, list[dict]]:
    """The real COCO sample's images folder (train2014 and val2014 files side by side, read in place) and
    a Karpathy file of 12 of its images, with the 2014 folders as ``filepath`` and all four splits."""
    data = karpathy_from_flat(coco_sample / "train.json", coco_sample / "val.json")
    train = [im for im in data["images"] if "_train2014_" in im["filename"]][:6]
    val = [im for im in data["images"] if "_val2014_" in im["filename"]][:6]
    for im, split in zip(val, ("restval", "restval", "val", "val", "test", "test"), strict=True):
        im["split"] = split
    for im in train + val:
        im["filepath"] = _folder(im["filename"])
    return coco_sample / "images", train + val


def _copied_root(root: Path, download: Path, images: list[dict]) -> Path:
    """``root/train2014`` and ``root/val2014`` holding copies of the files."""
    for im in images:
        (root / im["filepath"]).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(download / im["filename"], root / im["filepath"] / im["filename"])
    return root


def _linked_root(root: Path, download: Path, images: list[dict]) -> Path:
    """``root/val2014`` a link to the download folder; ``root/train2014`` a real folder of links to its
    files (the first relative, the others absolute)."""
    root.mkdir()
    (root / "val2014").symlink_to(download, target_is_directory=True)
    (root / "train2014").mkdir()
    for k, im in enumerate(im for im in images if im["filepath"] == "train2014"):
        target = download / im["filename"]
        link = root / "train2014" / im["filename"]
        link.symlink_to(os.path.relpath(target, link.parent) if k == 0 else target)
    return root


def _prep_both(tmp_path: Path, download: Path, images: list[dict]) -> tuple[Path, Path, Path, Path]:
    karpathy = tmp_path / "dataset_coco.json"
    karpathy.write_text(json.dumps({"dataset": "coco", "images": images}), encoding="utf-8")
    copied = _copied_root(tmp_path / "copied", download, images)
    linked = _linked_root(tmp_path / "linked", download, images)
    outs = []
    for root in (copied, linked):
        out = tmp_path / f"out-{root.name}"
        assert main(["coco", "--karpathy", str(karpathy), "--images", str(root), "--out", str(out)]) == 0
        outs.append(out)
    return copied, linked, outs[0], outs[1]


def _check_same_dataset(copied: Path, linked: Path, out_copied: Path, out_linked: Path, n: int) -> None:
    """The two prepared datasets are the same but for the recorded images root (and ``--images``)."""
    a, b = ((out / "dataset.json").read_bytes() for out in (out_copied, out_linked))
    da, db = json.loads(a), json.loads(b)
    # what differs: dataset.json's images_root (the --images folder itself, not a link's target) ...
    assert (da["images_root"], db["images_root"]) == (str(copied.resolve()), str(linked.resolve()))
    assert a != b and a.replace(json.dumps(str(copied.resolve())).encode(),
                                json.dumps(str(linked.resolve())).encode()) == b
    assert {k: v for k, v in da.items() if k != "images_root"} == {k: v for k, v in db.items()
                                                                   if k != "images_root"}
    for name in ("chars.json", "words.json"):
        assert (out_copied / name).read_bytes() == (out_linked / name).read_bytes()
    # ... and prep.json's images_root and options.images; nothing else
    ra, rb = (json.loads((out / "prep.json").read_text(encoding="utf-8")) for out in (out_copied, out_linked))
    assert (ra["options"]["images"], rb["options"]["images"]) == (str(copied), str(linked))
    for record in (ra, rb):
        del record["images_root"], record["options"]["images"]
        record["options"].pop("out")
        assert record["missing_images"] == {"count": 0, "first": []}
    assert ra == rb
    # the consumers: features reads ROOT/filepath/filename through the same links, with the same identity
    ds_a, ds_b = PreparedDataset.load(out_copied), PreparedDataset.load(out_linked)
    assert len(ds_b.images) == n and ds_a.images_fingerprint() == ds_b.images_fingerprint()
    for im_a, im_b in zip(ds_a.images, ds_b.images, strict=True):
        assert im_b.path == linked.resolve() / im_b.filepath / im_b.filename  # not the link's target
        assert im_b.path.read_bytes() == im_a.path.read_bytes()
    assert load_image(ds_b.images[-1].path).size == load_image(ds_a.images[-1].path).size


def test_coco_root_with_linked_folders_and_files_prepares_the_same_dataset_real_images(
        coco_sample: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    download, images = _real_download(coco_sample)
    copied, linked, out_copied, out_linked = _prep_both(tmp_path, download, images)
    summaries = capsys.readouterr().out.splitlines()
    assert summaries[0].replace(str(out_copied), "OUT") == summaries[1].replace(str(out_linked), "OUT")
    assert "0 images missing" in summaries[1]
    # 6 train2014 images, 2 restval folded into train, 2 val, 2 test
    _check_same_dataset(copied, linked, out_copied, out_linked, 12)


def test_coco_root_with_linked_folders_and_files_prepares_the_same_dataset(tmp_path: Path) -> None:
    download, images = _generated_download(tmp_path)
    copied, linked, out_copied, out_linked = _prep_both(tmp_path, download, images)
    _check_same_dataset(copied, linked, out_copied, out_linked, len(_GENERATED))


def test_a_dangling_link_is_a_missing_image(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    download, images = _generated_download(tmp_path)
    karpathy = tmp_path / "k.json"
    karpathy.write_text(json.dumps({"images": images}), encoding="utf-8")
    root = _linked_root(tmp_path / "root", download, images)
    name = images[0]["filename"]
    (download / name).unlink()  # root/train2014/NAME now points nowhere
    args = ["coco", "--karpathy", str(karpathy), "--images", str(root)]
    assert main([*args, "--out", str(tmp_path / "o")]) == 0
    assert PreparedDataset.load(tmp_path / "o").record["missing_images"] == {"count": 1,
                                                                             "first": [f"train2014/{name}"]}
    assert main([*args, "--out", str(tmp_path / "s"), "--strict"]) == 2
    assert "1 of 8 images missing" in capsys.readouterr().err


def test_f8k_follows_links_inside_images_too(tmp_path: Path) -> None:
    """Flickr (and f30k, multi30k, yjcaptions: the same check) follow links in --images as COCO does."""
    download = tmp_path / "download"
    download.mkdir()
    lines = []
    for k in range(3):
        Image.new("RGB", (20, 20), (k * 60, 0, 0)).save(download / f"{k}.jpg", "JPEG")
        lines.append(f"{k}.jpg#0\ta picture of thing {k}")
    (tmp_path / "Flickr8k.token.txt").write_text("\n".join(lines) + "\n")
    for k, name in enumerate(("train", "dev", "test")):
        (tmp_path / f"Flickr_8k.{name}Images.txt").write_text(f"{k}.jpg\n")
    root = tmp_path / "Flicker8k_Dataset"
    root.mkdir()
    for k in range(3):
        (root / f"{k}.jpg").symlink_to(download / f"{k}.jpg")
    assert main(["f8k", "--token-file", str(tmp_path / "Flickr8k.token.txt"), "--images", str(root),
                 "--out", str(tmp_path / "o")]) == 0
    ds = PreparedDataset.load(tmp_path / "o")
    assert ds.record["missing_images"]["count"] == 0 and [im.path.parent for im in ds.images] == [root] * 3


# -- paths written in annotation, split and token files may not leave --images ----------------------
def _escaping_karpathy(key: str, value: str, name: str = "dataset_coco.json"):
    def make(tmp_path: Path, root: Path, images: list[dict]) -> list[str]:
        images[3][key] = value
        path = tmp_path / name
        path.write_text(json.dumps({"images": images}), encoding="utf-8")
        return ["coco", "--karpathy", str(path), "--images", str(root)]
    return make


def _escaping_annotations(tmp_path: Path, root: Path, images: list[dict]) -> list[str]:
    official = {"images": [{"id": im["cocoid"], "file_name": im["filename"]} for im in images],
                "annotations": [{"id": 100 + k, "image_id": im["cocoid"], "caption": "a thing"}
                                for k, im in enumerate(images)]}
    official["images"][1]["file_name"] = "../outside/secret.jpg"
    (tmp_path / "captions_train2014.json").write_text(json.dumps(official), encoding="utf-8")
    (tmp_path / "split.json").write_text(json.dumps({"train": [im["cocoid"] for im in images]}))
    return ["coco", "--annotations", str(tmp_path / "captions_train2014.json"), "--split-file",
            str(tmp_path / "split.json"), "--images", str(root)]


def _escaping_yjcaptions(tmp_path: Path, root: Path, images: list[dict]) -> list[str]:
    images[0]["filepath"] = "val2014/../../outside"
    (tmp_path / "coco.json").write_text(json.dumps({"images": images}), encoding="utf-8")
    yj = {"images": [{"id": im["cocoid"]} for im in images],
          "annotations": [{"id": k, "image_id": im["cocoid"], "caption": "犬が走る"}
                          for k, im in enumerate(images)]}
    (tmp_path / "yj.json").write_text(json.dumps(yj, ensure_ascii=False), encoding="utf-8")
    return ["yjcaptions", "--yj", str(tmp_path / "yj.json"), "--coco-karpathy", str(tmp_path / "coco.json"),
            "--images", str(root), "--val-images", "1", "--test-images", "1"]


def _escaping_f8k(tmp_path: Path, root: Path, images: list[dict]) -> list[str]:
    (tmp_path / "Flickr8k.token.txt").write_text("a.jpg#0\ta dog\n/abs/b.jpg#0\ta cat\nc.jpg#0\ta hat\n")
    for name, image in (("train", "a.jpg"), ("dev", "/abs/b.jpg"), ("test", "c.jpg")):
        (tmp_path / f"Flickr_8k.{name}Images.txt").write_text(f"{image}\n")
    return ["f8k", "--token-file", str(tmp_path / "Flickr8k.token.txt"), "--images", str(root)]


def _escaping_multi30k(tmp_path: Path, root: Path, images: list[dict]) -> list[str]:
    m30k = tmp_path / "m30k"
    names = {"train": ["a.jpg", "../outside/secret.jpg"], "val": ["c.jpg"], "test_2016": ["d.jpg"]}
    t1 = {"train": "train", "val": "val", "test_2016": "test_2016_flickr"}
    for stem, files in names.items():
        for task, list_name, n in (("task2", f"{stem}_images.txt", 5), ("task1", f"{t1[stem]}.txt", 0)):
            (m30k / task / "image_splits").mkdir(parents=True, exist_ok=True)
            (m30k / task / "raw").mkdir(exist_ok=True)
            (m30k / task / "image_splits" / list_name).write_text("\n".join(files) + "\n")
            for lang in ("en", "de"):
                raw = [f"{stem}.{k}.{lang}.gz" for k in range(1, n + 1)] if n else [f"{t1[stem]}.{lang}.gz"]
                for name in raw:
                    with gzip.open(m30k / task / "raw" / name, "wt", encoding="utf-8") as fh:
                        fh.write("".join(f"words {lang} {f}\n" for f in files))
    return ["multi30k", "--root", str(m30k), "--images", str(root)]


ESCAPES = [
    ("absolute filepath", _escaping_karpathy("filepath", "/datasets/coco/val2014"),
     "images[3]: filepath '/datasets/coco/val2014' is an absolute path"),
    ("absolute filename", _escaping_karpathy("filename", "/etc/passwd"),
     "images[3]: filename '/etc/passwd' is an absolute path"),
    ("Windows drive", _escaping_karpathy("filepath", "C:\\coco"), "is an absolute path"),
    (".. through a linked folder", _escaping_karpathy("filepath", "val2014/../../outside"),
     "images[3]: filepath 'val2014/../../outside' has a '..' component"),
    (".. in a file name", _escaping_karpathy("filename", "../outside/secret.jpg"),
     "images[3]: filename '../outside/secret.jpg' has a '..' component"),
    (".. with backslashes", _escaping_karpathy("filename", "..\\outside\\secret.jpg"),
     "has a '..' component"),
    (".. that normalises back inside", _escaping_karpathy("filepath", "val2014/../val2014"),
     "has a '..' component"),
    ("NUL in a file name", _escaping_karpathy("filename", "x\0.jpg"), "holds a NUL character"),
    ("official caption file", _escaping_annotations,
     "captions_train2014.json: images[1]: filename '../outside/secret.jpg' has a '..' component"),
    ("yjcaptions' COCO file", _escaping_yjcaptions,
     "filepath 'val2014/../../outside' has a '..' component"),
    ("Flickr list file", _escaping_f8k,
     "Flickr_8k.devImages.txt: line 1: filename '/abs/b.jpg' is an absolute"),
    ("Multi30k image list", _escaping_multi30k,
     "train_images.txt: line 2: filename '../outside/secret.jpg' has a '..' component"),
]


def _tree(path: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(path.rglob("*"))}


@pytest.mark.parametrize("case, make, words", ESCAPES, ids=[c[0] for c in ESCAPES])
def test_paths_written_in_annotation_files_may_not_leave_images(
        tmp_path: Path, capsys: pytest.CaptureFixture, case: str, make, words: str) -> None:
    """Refused in one line with exit status 2 and nothing written, though --images links elsewhere and
    the outside file the path names exists."""
    download, images = _generated_download(tmp_path)
    root = _linked_root(tmp_path / "root", download, images)
    (tmp_path / "outside").mkdir()
    shutil.copyfile(download / images[0]["filename"], tmp_path / "outside" / "secret.jpg")
    args = make(tmp_path, root, images)
    before = _tree(tmp_path)
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("prep: error: ") and "\n" not in err and "Traceback" not in err, err
    assert words in err, err
    assert _tree(tmp_path) == before
