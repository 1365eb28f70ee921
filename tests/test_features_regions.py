"""Region features: grid and Faster R-CNN region mappers on real COCO images, the bottom-up-attention box
selection, and the SCAN precomp / BUTD TSV readers (on files written here in those exact formats)."""

from __future__ import annotations

import base64
import csv
import json

import numpy as np
import pytest
import torch
from helpers import (
    annotated_dataset,
    random_regions,
    write_butd_tsv,
)
from PIL import Image

from features.executors.extract import BlockTask, read_block
from features.extractors.backbones import load_backbone
from features.extractors.crops import to_normalized_tensor
from features.extractors.detector_mapper import DetectorRegionMapper, select_regions
from features.extractors.grid_mapper import GridRegionMapper, grid_boxes
from features.extractors.images import load_image
from features.extractors.registry import get_extractor_of_config
from features.interop.region_formats import (
    ButdTsv,
    RegionRecord,
    dataset_keys,
    image_key,
    read_butd_tsv,
    read_scan_precomp,
)
from vsecore.errors import UserError

# small Faster R-CNN settings: random weights, a small input scale, so a test image takes about a second
SMALL_DETECTOR = {"weights": "none", "min_size": 160, "max_size": 256, "proposals": 300}


def build_region_mapper(config: dict) -> object:
    """The region mapper of a plain config, chosen as a region store's recorded config chooses it."""
    return get_extractor_of_config({"kind": "regions", **config}).build(config)


@pytest.fixture(scope="module")
def coco_images(coco_sample) -> list[Image.Image]:
    paths = sorted((coco_sample / "images").glob("*.jpg"))[:3]
    return [load_image(p) for p in paths]


@pytest.fixture(scope="module")
def grid_mapper() -> GridRegionMapper:
    return GridRegionMapper(load_backbone("efficientnet_lite0", "imagenet"))


@pytest.fixture(scope="module")
def detector() -> DetectorRegionMapper:
    return DetectorRegionMapper(**SMALL_DETECTOR)


# --- grid ---------------------------------------------------------------------------------------------


def test_grid_regions_real_weights(grid_mapper, coco_images):
    images = coco_images[:2]
    out = grid_mapper(images)
    assert grid_mapper.outputs == {"regions": (49, 1280), "boxes": (49, 4), "counts": (), "image_size": (2,)}
    assert out["regions"].shape == (2, 49, 1280) and out["regions"].dtype == np.float32
    assert np.isfinite(out["regions"]).all()
    # the cells are taken after the head's ReLU6
    assert out["regions"].min() >= 0 and out["regions"].max() <= 6 and out["regions"].std() > 0.1
    assert out["counts"].tolist() == [49, 49]
    assert out["image_size"].tolist() == [list(im.size) for im in images]
    prov = grid_mapper.provenance
    assert (prov["k"], prov["dim"], prov["grid"]) == (49, 1280, [7, 7])
    assert prov["weights_sha256"] and "aspect ratio not kept" in prov["view"]


def test_grid_regions_average_to_the_global_feature(grid_mapper, coco_images):
    """The regions are the cells of the map whose average pooling is the network's global feature."""
    img = coco_images[0]
    regions = grid_mapper([img])["regions"][0]
    b = grid_mapper.backbone
    assert b.interpolation == "bicubic"  # timm's config for efficientnet_lite0
    x = to_normalized_tensor(img.resize((224, 224), Image.Resampling.BICUBIC), b.mean, b.std)
    with torch.inference_mode():
        pooled = b.model(x.unsqueeze(0))[0].numpy()  # timm, num_classes=0: global average pool
    np.testing.assert_allclose(regions.mean(axis=0), pooled, rtol=1e-4, atol=1e-5)


def test_grid_boxes_tile_the_original_image(grid_mapper, coco_images):
    img = coco_images[0]
    w, h = img.size
    boxes = grid_mapper([img])["boxes"][0]
    np.testing.assert_allclose(boxes[0], [0, 0, w / 7, h / 7], rtol=1e-6)
    np.testing.assert_allclose(boxes[8], [w / 7, h / 7, 2 * w / 7, 2 * h / 7], rtol=1e-6)  # cell (1, 1)
    np.testing.assert_allclose(boxes[-1], [6 * w / 7, 6 * h / 7, w, h], rtol=1e-6)
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).sum()
    assert area == pytest.approx(w * h, rel=1e-5)
    assert grid_boxes(2, 3, 30, 20).tolist()[4] == [10, 10, 20, 20]  # row 1, column 1


def test_grid_row_does_not_depend_on_the_other_images(grid_mapper, coco_images):
    alone = grid_mapper([coco_images[1]])["regions"][0]
    together = grid_mapper(coco_images[:2])["regions"][1]
    np.testing.assert_array_equal(alone, together)


def test_grid_config_round_trip_and_odd_images(grid_mapper):
    small = GridRegionMapper(load_backbone("efficientnet_lite0", "none", input_size=64))
    again = build_region_mapper(json.loads(json.dumps(small.config)))
    assert isinstance(again, GridRegionMapper) and again.outputs["regions"] == (4, 1280)  # 64 px: 2x2 cells
    img = Image.new("RGB", (40, 30), (10, 200, 30))
    np.testing.assert_array_equal(again([img])["regions"], small([img])["regions"])
    odd = [Image.new("RGB", (1, 1), (10, 200, 30)), Image.new("RGB", (3000, 4), (200, 10, 30))]
    out = grid_mapper(odd)
    assert np.isfinite(out["regions"]).all() and out["counts"].tolist() == [49, 49]
    assert out["boxes"][1, -1, 2:].tolist() == [3000, 4] and out["boxes"][0, -1, 2:].tolist() == [1, 1]


# --- Faster R-CNN ------------------------------------------------------------------------------------


def test_fasterrcnn_random_weights_k_boxes_inside_the_image(detector, coco_images):
    images = coco_images[:2]
    out = detector(images)
    assert detector.outputs["regions"] == (36, 1024)
    assert out["regions"].shape == (2, 36, 1024) and out["boxes"].shape == (2, 36, 4)
    assert out["counts"].tolist() == [36, 36] and np.isfinite(out["regions"]).all()
    assert (out["regions"] >= 0).all()  # fc7 after its ReLU
    for boxes, img in zip(out["boxes"], images, strict=True):
        w, h = img.size
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 1] >= 0).all()
        assert (boxes[:, 2] <= w + 1e-3).all() and (boxes[:, 3] <= h + 1e-3).all()
        assert (boxes[:, 2] >= boxes[:, 0]).all() and (boxes[:, 3] >= boxes[:, 1]).all()
    prov = detector.provenance
    assert prov["dim"] == 1024 and prov["k"] == 36 and prov["weights_sha256"] is None
    assert prov["selection"]["nms_iou"] == 0.3 and prov["selection"]["score_threshold"] == 0.2


def test_fasterrcnn_features_are_the_box_head_output_of_the_boxes(detector, coco_images):
    """Re-pool the returned boxes through the detector: the same vectors come out."""
    from torchvision.models.detection.transform import resize_boxes

    img = coco_images[0]
    feats, boxes, scores = detector.detect(img)
    assert feats.shape == (36, 1024) and (np.diff(scores) <= 0).all()
    m = detector.model
    with torch.inference_mode():
        batch, _ = m.transform([to_normalized_tensor(img, (0, 0, 0), (1, 1, 1))])
        fmaps = m.backbone(batch.tensors)
        rois = resize_boxes(torch.from_numpy(boxes), [img.height, img.width], list(batch.image_sizes[0]))
        again = m.roi_heads.box_head(m.roi_heads.box_roi_pool(fmaps, [rois], batch.image_sizes))
    np.testing.assert_allclose(again.numpy(), feats, rtol=1e-3, atol=1e-4)


def test_fasterrcnn_weights_from_a_file_and_missing_coco_weights(detector, tmp_path, monkeypatch):
    path = tmp_path / "frcnn.pth"
    torch.save(detector.model.state_dict(), path)
    loaded = DetectorRegionMapper(**{**SMALL_DETECTOR, "weights": str(path)}, seed=7)
    assert loaded.weights_sha256 and loaded.provenance["weights_file"] == str(path)
    other = DetectorRegionMapper(**SMALL_DETECTOR, seed=7)
    for name, value in detector.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], value), name
    assert not torch.equal(other.model.state_dict()["roi_heads.box_head.fc6.weight"],
                           detector.model.state_dict()["roi_heads.box_head.fc6.weight"])
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    with pytest.raises(UserError, match="COCO weights of fasterrcnn_resnet50_fpn not found: .*"
                                        "fasterrcnn_resnet50_fpn_coco-258fb6c6.pth"):
        DetectorRegionMapper(weights="coco")
    torch.save({"not": torch.zeros(2)}, tmp_path / "wrong.pth")
    with pytest.raises(UserError, match="do not fit the model"):
        DetectorRegionMapper(weights=str(tmp_path / "wrong.pth"))


def test_fasterrcnn_adaptive_boxes_and_odd_images():
    mapper = build_region_mapper({"detector": "fasterrcnn", **SMALL_DETECTOR, "min_size": 128,
                                  "max_size": 256, "min_boxes": 10, "max_boxes": 100})
    assert mapper.outputs["regions"] == (100, 1024)
    odd = [Image.new("RGB", (1, 1), (10, 200, 30)), Image.new("RGB", (2000, 5), (200, 10, 30))]
    out = mapper(odd)
    for i, (w, h) in enumerate([(1, 1), (2000, 5)]):
        n = int(out["counts"][i])
        assert 10 <= n <= 100
        assert (out["regions"][i, n:] == 0).all() and (out["boxes"][i, n:] == 0).all()
        assert out["boxes"][i, :n, 2].max() <= w + 1e-3 and out["boxes"][i, :n, 3].max() <= h + 1e-3
        assert out["image_size"][i].tolist() == [w, h]


def test_unknown_and_unavailable_detectors():
    with pytest.raises(UserError, match="detectron2 is not installed"):
        build_region_mapper({"detector": "detectron2"})
    with pytest.raises(UserError, match="unknown detector 'yolo'"):
        build_region_mapper({"detector": "yolo"})
    with pytest.raises(UserError, match="min-boxes"):
        DetectorRegionMapper(weights="none", min_boxes=40, max_boxes=36)


def test_bad_images_become_failure_records_like_cnn(grid_mapper, coco_sample, tmp_path):
    good = sorted((coco_sample / "images").glob("*.jpg"))[:2]
    bad = tmp_path / "truncated.jpg"
    bad.write_bytes(good[0].read_bytes()[:500])
    task = BlockTask(str(tmp_path / "x.zarr"), 0, 10, (str(good[0]), str(bad), str(good[1])))
    block = read_block(task)
    assert block.good == [0, 2] and [f["imgid"] for f in block.failures] == [11]
    out = grid_mapper(block.images)
    assert out["regions"].shape == (2, 49, 1280)
    with pytest.raises(UserError, match="truncated.jpg"):
        read_block(BlockTask(task.store, 0, 10, task.paths, on_error="fail"))


# --- bottom-up-attention selection ---------------------------------------------------------------------


def _disjoint_boxes(n: int) -> torch.Tensor:
    x = torch.arange(n, dtype=torch.float32) * 20
    return torch.stack([x, torch.zeros(n), x + 10, torch.full((n,), 10.0)], dim=1)


def test_select_regions_nms_threshold_and_bounds():
    boxes = _disjoint_boxes(6)
    boxes = torch.cat([boxes, boxes[:1] + torch.tensor([1.0, 0, 1.0, 0])])  # overlaps box 0 (IoU 0.82)
    scores = torch.tensor([0.9, 0.1, 0.5, 0.05, 0.3, 0.15, 0.8])
    # NMS drops box 6 (0.8, overlapping 0.9); above 0.2: boxes 0, 2, 4
    assert select_regions(boxes, scores, 1, 10).tolist() == [0, 2, 4]
    # fewer than the minimum pass: the best below the threshold fill up, suppressed boxes never come back
    assert select_regions(boxes, scores, 5, 10).tolist() == [0, 2, 4, 5, 1]
    assert select_regions(boxes, scores, 1, 2).tolist() == [0, 2]
    # fewer survivors than the minimum: all survivors
    assert select_regions(boxes, scores, 10, 10).tolist() == [0, 2, 4, 5, 1, 3]
    # class-agnostic NMS at 0.3: IoU 0.25 keeps both, IoU 0.43 does not
    pair = torch.tensor([[0.0, 0, 10, 10], [6.0, 0, 16, 10], [4.0, 0, 14, 10]])
    assert select_regions(pair[:2], torch.tensor([0.9, 0.8]), 1, 5).tolist() == [0, 1]
    assert select_regions(pair[[0, 2]], torch.tensor([0.9, 0.8]), 1, 5).tolist() == [0]


def test_select_regions_fixed_k():
    scores = torch.linspace(0.01, 0.99, 50)
    keep = select_regions(_disjoint_boxes(50), scores, 36, 36)
    assert keep.tolist() == list(range(49, 13, -1))


# --- readers ------------------------------------------------------------------------------------------


def test_butd_tsv_matched_in_row_order_with_missing_and_extra(tmp_path):
    names = [f"COCO_val2014_{i:012d}.jpg" for i in (391895, 522418, 184613, 318219)]
    data = annotated_dataset(tmp_path, names, ["train", "train", "val", "test"])
    rng = np.random.default_rng(0)
    regions = {cid: random_regions(rng, 36, 2048) for cid in (318219, 391895, 184613, 999999)}
    # one features field is ~393 KB: far beyond csv.field_size_limit() (131,072)
    assert len(base64.b64encode(regions[391895][1].tobytes())) > csv.field_size_limit()
    write_butd_tsv(tmp_path / "a.tsv", [(cid, 640, 480, *regions[cid]) for cid in (318219, 391895)])
    write_butd_tsv(tmp_path / "b.tsv", [(cid, 640, 480, *regions[cid]) for cid in (184613, 999999)],
               python3_bytes=True)
    source = read_butd_tsv([tmp_path / "a.tsv", tmp_path / "b.tsv"], data)
    assert (source.k, source.dim, source.has_boxes) == (36, 2048, True)
    assert source.rows.tolist() == [0, 2, 3] and source.missing == [1] and source.extra == ["999999"]
    got = list(source.iter_rows())
    assert [row for row, _ in got] == [0, 2, 3]
    for (_, rec), cid in zip(got, (391895, 184613, 318219), strict=True):
        np.testing.assert_array_equal(rec.boxes, regions[cid][0])
        np.testing.assert_array_equal(rec.features, regions[cid][1])
        assert rec.image_size == (640, 480)
    assert "3 images matched" in source.summary() and "1 missing (imgid 1)" in source.summary()
    only_val = read_butd_tsv([tmp_path / "a.tsv", tmp_path / "b.tsv"], data, splits=["val"])
    assert only_val.rows.tolist() == [2] and only_val.missing == []


def test_butd_tsv_adaptive_boxes_pad_to_the_largest(tmp_path):
    data = annotated_dataset(tmp_path, ["a.jpg", "b.jpg"], ["train", "test"], cocoids=[7, 8])
    rng = np.random.default_rng(1)
    small, large = random_regions(rng, 10, 16), random_regions(rng, 23, 16)
    write_butd_tsv(tmp_path / "x.tsv", [(8, 100, 50, *large), ("000007", 100, 50, *small)])
    source = ButdTsv(tmp_path / "x.tsv").source(data)
    assert (source.k, source.dim) == (23, 16) and source.rows.tolist() == [0, 1]
    feats, boxes, count = source.read(0).padded(source.k)
    assert count == 10 and feats.shape == (23, 16) and (feats[10:] == 0).all() and (boxes[10:] == 0).all()
    np.testing.assert_array_equal(feats[:10], small[1])


def test_butd_tsv_bad_input_names_the_line(tmp_path):
    data = annotated_dataset(tmp_path, ["a.jpg"], ["train"], cocoids=[5])
    rng = np.random.default_rng(2)
    boxes, feats = random_regions(rng, 3, 8)
    write_butd_tsv(tmp_path / "dup.tsv", [(5, 10, 10, boxes, feats), (5, 10, 10, boxes, feats)])
    with pytest.raises(UserError, match=r"dup.tsv:2: image_id 5 already at .*dup.tsv:1"):
        ButdTsv(tmp_path / "dup.tsv")
    (tmp_path / "short.tsv").write_text("5\t10\t10\n")
    with pytest.raises(UserError, match=r"short.tsv:1: expected the tab-separated fields"):
        ButdTsv(tmp_path / "short.tsv")
    b64 = [base64.b64encode(a.tobytes()).decode() for a in (boxes, feats)]
    (tmp_path / "count.tsv").write_text("\t".join(["5", "10", "10", "4", *b64]) + "\n")
    with pytest.raises(UserError, match=r"count.tsv:1: 12 box values for num_boxes 4"):
        ButdTsv(tmp_path / "count.tsv").source(data)
    (tmp_path / "b64.tsv").write_text("5\t10\t10\t3\t@@@@\tAAAA\n")
    with pytest.raises(UserError, match=r"b64.tsv:1: field 'boxes' is not base64"):
        read_butd_tsv(tmp_path / "b64.tsv", data)
    with pytest.raises(UserError, match="cannot open"):
        ButdTsv(tmp_path / "absent.tsv")


def test_scan_precomp_memory_mapped_in_split_order(tmp_path):
    splits = ["train", "test", "train", "test", "val", "test"]
    data = annotated_dataset(tmp_path, [f"{i}.jpg" for i in range(6)], splits)
    x = np.random.default_rng(3).standard_normal((3, 36, 32)).astype(np.float32)
    np.save(tmp_path / "test_ims.npy", x)
    source = read_scan_precomp(tmp_path / "test_ims.npy", data, "test")
    assert isinstance(source._reader.array, np.memmap)  # nothing copied up front
    assert (source.format, source.k, source.dim, source.has_boxes) == ("scan-precomp", 36, 32, False)
    assert source.rows.tolist() == [1, 3, 5] and source.missing == [] and source.extra == []
    for (row, rec), i in zip(source.iter_rows(), range(3), strict=True):
        np.testing.assert_array_equal(rec.features, x[i])
        assert rec.boxes is None and row == [1, 3, 5][i]
    # one row per caption (5 copies of each image) is recognised
    np.save(tmp_path / "rep_ims.npy", np.repeat(x, 5, axis=0))
    rep = read_scan_precomp(tmp_path / "rep_ims.npy", data, "test")
    np.testing.assert_array_equal(rep.read(5).features, x[2])
    np.save(tmp_path / "bad_ims.npy", x[:2])
    with pytest.raises(UserError, match="2 rows, but the split has 3 images"):
        read_scan_precomp(tmp_path / "bad_ims.npy", data, "test")
    np.save(tmp_path / "flat_ims.npy", x[:, 0])
    with pytest.raises(UserError, match=r"expected \(images, regions, features\)"):
        read_scan_precomp(tmp_path / "flat_ims.npy", data, "test")


def test_scan_precomp_matched_by_ids(tmp_path):
    data = annotated_dataset(tmp_path, [f"{i}.jpg" for i in range(4)], ["test"] * 3 + ["train"],
                    cocoids=[11, 12, 13, 14])
    x = np.random.default_rng(4).standard_normal((3, 2, 4)).astype(np.float32)
    np.save(tmp_path / "test_ims.npy", x)
    (tmp_path / "test_ids.txt").write_text("13\n11\n99\n")
    source = read_scan_precomp(tmp_path / "test_ims.npy", data, "test", ids=tmp_path / "test_ids.txt")
    assert source.rows.tolist() == [0, 2] and source.missing == [1] and source.extra == ["99"]
    np.testing.assert_array_equal(source.read(0).features, x[1])
    np.testing.assert_array_equal(source.read(2).features, x[0])
    # ids repeated per caption collapse onto image rows
    np.save(tmp_path / "rep_ims.npy", np.repeat(x, 2, axis=0))
    rep = read_scan_precomp(tmp_path / "rep_ims.npy", data, "test", ids=[13, 13, 11, 11, 12, 12])
    np.testing.assert_array_equal(rep.read(1).features, x[2])
    with pytest.raises(UserError, match="ids: 2 ids for 3 rows"):
        read_scan_precomp(tmp_path / "test_ims.npy", data, "test", ids=[13, 11])
    with pytest.raises(UserError, match="ids: id 13 appears at rows 0 and 1"):
        read_scan_precomp(tmp_path / "test_ims.npy", data, "test", ids=[13, 13, 11])


def test_image_keys():
    assert image_key("COCO_train2014_000000057870.jpg") == "57870"
    assert image_key("000391895") == "391895" and image_key(391895) == "391895"
    assert image_key("1000092795.jpg") == "1000092795" and image_key("img_7.png") == "img_7"


def test_duplicate_dataset_keys_are_an_error(tmp_path):
    data = annotated_dataset(tmp_path, ["1.jpg", "001.jpg"], ["train", "test"])
    with pytest.raises(UserError, match="share the id '1'"):
        dataset_keys(data)


def test_region_record_padding_too_many():
    rec = RegionRecord(np.ones((5, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="5 regions do not fit in k = 4"):
        rec.padded(4)
