"""Backbones and weights: shapes per CNN family, FNE widths, weight files, and a real ImageNet check."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch

from features.extractors import weights as W
from features.extractors.backbones import load_backbone
from features.extractors.crop_mapper import ImageMapper
from features.extractors.crops import image_crops
from features.extractors.images import load_image
from vsecore.errors import UserError

SKI, DOGS = 795, range(151, 269)  # ImageNet class indices: "ski", and the dog breeds


@pytest.fixture(scope="module")
def coco_image(coco_sample):
    return load_image(sorted((coco_sample / "images").glob("*.jpg"))[0])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "global_dim", "fne_dim", "input_size"),
    [
        ("vgg16", 4096, 12416, 224),
        ("vgg19", 4096, 13696, 224),
        ("resnet152", 2048, None, 224),  # FNE 71,872 (not probed here: slow on 2 shared cores)
        ("inception_resnet_v2", 1536, None, 299),  # FNE 73,952
        ("resnet18", 512, None, 224),  # any timm name
    ],
)
def test_shapes_per_family_random_weights(coco_image, name, global_dim, fne_dim, input_size):
    backbone = load_backbone(name, "none")
    assert backbone.global_dim == global_dim and backbone.input_size == input_size
    assert backbone.weights_sha256 is None
    mapper = ImageMapper(backbone, kind="global", crops=1, batch_size=1)
    assert mapper.outputs == {"global": global_dim}
    out = mapper([coco_image])["global"]
    assert out.shape == (1, global_dim) and out.dtype == np.float32 and np.isfinite(out).all()
    if name.startswith("vgg"):
        assert (out >= 0).all()  # fc7 is taken after its ReLU
    if fne_dim is None:
        return
    fne = ImageMapper(backbone, kind="fne", crops=1, batch_size=1)
    width = fne.outputs["fne/raw"]
    assert width == fne_dim
    assert sum(layer["width"] for layer in fne.provenance["layers"]) == width
    if name == "vgg16":
        raw = fne([coco_image])["fne/raw"]
        assert raw.shape == (1, 12416) and raw.dtype == np.float32 and (raw >= 0).all()
        names = [layer["name"] for layer in fne.provenance["layers"]]
        assert len(names) == 15 and names[-2:] == ["classifier.1", "classifier.4"]


def test_random_init_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = load_backbone("resnet18", "none", seed=0).model.state_dict()
    assert torch.equal(torch.rand(1), before)
    b = load_backbone("resnet18", "none", seed=0).model.state_dict()
    c = load_backbone("resnet18", "none", seed=1).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["conv1.weight"], c["conv1.weight"])


def test_missing_imagenet_weights_say_where_to_put_them(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(UserError) as info:
        load_backbone("vgg16", "imagenet")
    message = str(info.value)
    assert str(tmp_path / "hub" / "checkpoints" / "vgg16-397923af.pth") in message
    assert "--weights PATH" in message
    with pytest.raises(UserError, match="unknown CNN"):
        load_backbone("not_a_network", "none")


def test_weights_path_checkpoint_and_position_mapping(tmp_path):
    packaged = W.read_state_dict(W.efficientnet_lite0_file())
    wrapped = tmp_path / "ckpt.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in packaged.items()}, "epoch": 3}, wrapped)
    from_path = load_backbone("efficientnet_lite0", str(wrapped))
    imagenet = load_backbone("efficientnet_lite0", "imagenet")
    assert imagenet.weights_sha256 == "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
    assert from_path.weights_sha256 != imagenet.weights_sha256  # a different file
    sa, sb = from_path.model.state_dict(), imagenet.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # every shape is checked: a wrong one is named
    broken = dict(packaged)
    key = list(broken)[5]
    broken[key] = torch.zeros(3, 3)
    bad = tmp_path / "bad.pth"
    torch.save(broken, bad)
    with pytest.raises(UserError, match=f"tensor 5 '{key}'"):
        load_backbone("efficientnet_lite0", str(bad))
    # a file for another network
    short = tmp_path / "short.pth"
    torch.save(dict(list(packaged.items())[:10]), short)
    with pytest.raises(UserError, match="do not fit"):
        load_backbone("efficientnet_lite0", str(short))


def test_efficientnet_lite0_imagenet_classifies_coco_sensibly(coco_sample):
    """The packaged lukemelas file, mapped by position onto timm's model (with its classifier), sees a ski
    in a snowboarder's picture and a dog breed in a dog's."""
    model = timm.create_model("efficientnet_lite0")
    assert W.load_into(model, W.read_state_dict(W.efficientnet_lite0_file()), "packaged") == "by position"
    model.eval()
    captions: dict[str, list[str]] = {}
    for split in ("train", "val"):
        for row in json.loads((coco_sample / f"{split}.json").read_text()):
            captions.setdefault(row["image_id"], []).append(row["caption"].lower())

    def top1(phrase: str) -> int:
        image_id = next(i for i, caps in sorted(captions.items()) if any(phrase in c for c in caps))
        img = load_image(coco_sample / "images" / image_id)
        x = image_crops(img, 256, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 1, "bicubic")
        with torch.inference_mode():
            return int(model(x).argmax(-1))

    assert top1("snowboarder with ski poles") == SKI
    assert top1("snowboarder sitting next to a dog") in DOGS
