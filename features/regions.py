"""Region features: images -> ``k`` region vectors (and their boxes) per image, for CLMR/LIWE.

Two region mappers with the shape of API of :class:`features.mapper.ImageMapper` (``outputs``,
``provenance``, ``config``, ``from_config``, ``__call__(images) -> dict[name, np.ndarray]``), except that a
row is not a vector: ``outputs`` maps each array name to the shape of ONE image's entry,

====================  ===========  =========  =====================================================
name                  row shape    dtype      meaning
====================  ===========  =========  =====================================================
``regions``           ``(k, D)``   float32    region features; rows ``count..k-1`` are zero padding
``boxes``             ``(k, 4)``   float32    ``x1, y1, x2, y2`` in pixels of the image as loaded
                                              (the BUTD TSV convention); padding rows are zero
``counts``            ``()``       int32      real regions of the image (``<= k``)
``image_size``        ``(2,)``     int32      ``width, height`` of the image as loaded
====================  ===========  =========  =====================================================

and ``mapper(images)`` returns ``{name: (len(images), *row_shape)}``. Images that cannot be decoded never
reach a mapper: :func:`features.extract.read_block` turns them into failure records, exactly as for ``cnn``.

Detectors
---------
``grid`` (:class:`GridRegionMapper`): the cells of a CNN's last feature map are the regions. The whole image
is resized to ``S x S`` (``S`` = the backbone's input size, 224 for EfficientNet-Lite0) **without keeping the
aspect ratio and without cropping**: one view, no 10-crop, because regions need one spatial layout and the
cells should tile the entire picture (a centre crop would drop what captions mention near the borders). The
``C x h x w`` map (EfficientNet-Lite0: ``1280 x 7 x 7`` after its head convolution, BN and ReLU6) gives
``k = h * w`` regions of ``D = C`` features in row-major order (cell ``(i, j)`` is region ``i * w + j``),
and each box is the cell's rectangle mapped back onto the original image:
``(j W / w, i H / h, (j + 1) W / w, (i + 1) H / h)``. Every region is real (``counts = k``). The feature
maps used: timm models' ``forward_features`` (after the head), VGG's ``features`` (pool5, ``512 x 7 x 7``),
torchvision ResNets' ``layer4`` (``2048 x 7 x 7``).

``fasterrcnn`` (:class:`DetectorRegionMapper`): torchvision's ``fasterrcnn_resnet50_fpn`` (COCO weights from
the local torch cache, a file, or ``none`` = seeded random initialisation for tests). Per image:

1. torchvision's own transform (shorter side ``min_size`` = 800, longer at most ``max_size`` = 1333, the
   scale the COCO weights were trained at; ImageNet normalisation), the ResNet-50-FPN backbone and the RPN,
   keeping ``proposals`` = 300 boxes after its NMS (BUTD's test-time ``RPN_POST_NMS_TOP_N``; torchvision's
   own default is 1,000);
2. every proposal is RoIAlign-pooled (7x7, torchvision's ``MultiScaleRoIAlign`` over FPN levels P2-P5, the
   level chosen by box size) and passed through the box head (``fc6``, ``fc7``, each with its ReLU):
   **the region feature is the 1,024-d ``fc7`` output** (``D = 1024``), the vector the detector classifies
   from, as BUTD's 2,048-d ``pool5_flat`` of its ResNet-101 ``res5`` is;
3. the region's score is its best foreground class probability (softmax over the 91 COCO classes, the
   background excluded), and the **bottom-up-attention selection** (:func:`select_regions`) keeps proposals
   after class-agnostic NMS at IoU 0.3 with score >= 0.2, between ``min_boxes`` and ``max_boxes`` of them
   (fixed ``K = 36`` by default: ``min_boxes = max_boxes = 36``; BUTD's adaptive setting is 10..100);
4. the boxes are the selected **proposals** (as in BUTD, whose features are pooled from the RoIs, not from
   the class-regressed boxes), mapped back to the original image size.

Differences from BUTD that matter when comparing numbers: torchvision's detector is trained on COCO's 80
classes, not Visual Genome's 1,600 objects and 400 attributes, and its box feature is 1,024-d, not 2,048-d.
``detectron2`` is not a backend here: it is not installed, and its bottom-up-attention ports write the BUTD
TSV, which :mod:`features.region_formats` reads.

Determinism: on CPU every image goes through the network alone, so a row never depends on the other images
of a call (batching pads images to a common size, which changes features near the borders, and CPU kernels
round differently for other batch shapes). On CUDA, ``grid`` packs ``batch_size`` images per pass.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from features.backbones import Backbone, VGGFc7, load_backbone
from features.crops import normalization_table, normalize_pixels, rgb_pixels
from features.mapper import (
    PreparedImage,
    check_extractor_config,
    check_pass_options,
    pinned_threads,
    prepared,
)
from vsecore.device import resolve_device
from vsecore.errors import UserError

DETECTORS = ("grid", "fasterrcnn")
#: the one Faster R-CNN network supported, and its torchvision COCO weights (``--weights coco``)
FASTERRCNN_NETWORK = "fasterrcnn_resnet50_fpn"
#: bottom-up-attention selection rules (Anderson et al. 2018, ``generate_tsv.py``)
SCORE_THRESHOLD = 0.2
NMS_IOU = 0.3
DEFAULT_BOXES = 36
ADAPTIVE_BOXES = (10, 100)
#: shortest side, in pixels at the detector's scale, of what the detector is shown
MIN_SIDE = 32


def region_outputs(k: int, dim: int) -> dict[str, tuple[int, ...]]:
    """Per-image shapes of the region arrays: ``regions (k, D)``, ``boxes (k, 4)``, ``counts ()``,
    ``image_size (2,)``."""
    return {"regions": (k, dim), "boxes": (k, 4), "counts": (), "image_size": (2,)}


#: dtype of every region array (see the module docstring)
REGION_DTYPES: dict[str, np.dtype] = {
    "regions": np.dtype(np.float32), "boxes": np.dtype(np.float32),
    "counts": np.dtype(np.int32), "image_size": np.dtype(np.int32),
}


def empty_region_rows(n: int, outputs: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Zero-filled ``{name: (n, *shape)}`` arrays of the region outputs, in their dtypes."""
    return {name: np.zeros((n, *shape), dtype=REGION_DTYPES[name]) for name, shape in outputs.items()}


# --- grid regions -----------------------------------------------------------------------------------


def feature_map(backbone: Backbone, x: torch.Tensor) -> torch.Tensor:
    """The backbone's last convolutional feature map: ``x (B, 3, S, S) -> (B, C, h, w)``.

    timm models: ``forward_features`` (after the head convolution where the model has one); VGG: ``features``
    (pool5); torchvision ResNets: ``layer4``.
    """
    import torchvision

    model = backbone.model
    if isinstance(model, VGGFc7):
        return model.features(x)
    if isinstance(model, torchvision.models.ResNet):
        x = model.maxpool(model.relu(model.bn1(model.conv1(x))))
        return model.layer4(model.layer3(model.layer2(model.layer1(x))))
    if hasattr(model, "forward_features"):
        return model.forward_features(x)
    raise UserError(f"backbone {backbone.name!r} has no feature map the grid regions can use")


def grid_boxes(h: int, w: int, width: int, height: int) -> np.ndarray:
    """Pixel rectangles ``(h * w, 4)`` float32 (``x1, y1, x2, y2``) of an ``h x w`` grid laid over a
    ``width x height`` image, row-major (cell ``(i, j)`` is row ``i * w + j``)."""
    xs = np.arange(w + 1, dtype=np.float64) * width / w
    ys = np.arange(h + 1, dtype=np.float64) * height / h
    x1, y1 = np.meshgrid(xs[:-1], ys[:-1])
    x2, y2 = np.meshgrid(xs[1:], ys[1:])
    return np.stack([x1, y1, x2, y2], axis=-1).reshape(h * w, 4).astype(np.float32)


class GridRegionMapper:
    """Images -> grid regions of a CNN's last feature map (see the module docstring).

    Args:
        backbone: from :func:`features.backbones.load_backbone` (its ``input_size`` is the side ``S`` the
            whole image is resized to).
        batch_size: images per forward pass on CUDA (on CPU one image per pass, see the module docstring).
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
        amp: bfloat16 autocast on CUDA.
        threads: torch threads of every call (``None``: unchanged), see
            :func:`features.mapper.pinned_threads`.
    """

    detector = "grid"

    def __init__(self, backbone: Backbone, batch_size: int = 32, device: str | torch.device | None = "cpu",
                 amp: bool = False, threads: int | None = None) -> None:
        check_pass_options(batch_size, threads)
        self.threads = threads
        self.backbone = backbone
        self.batch_size = batch_size
        self.device = resolve_device(device)
        self.amp = bool(amp) and self.device.type == "cuda"
        self.images_per_pass = batch_size if self.device.type == "cuda" else 1
        self.model = backbone.model.to(self.device).eval()
        self._table = normalization_table(backbone.mean, backbone.std, self.device)
        self._build_kw: dict[str, Any] = {}
        size = backbone.input_size
        with torch.inference_mode():
            c, h, w = feature_map(backbone, torch.zeros(1, 3, size, size, device=self.device)).shape[1:]
        self.grid = (int(h), int(w))
        self.outputs = region_outputs(int(h * w), int(c))

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GridRegionMapper:
        """Build from :attr:`config`'s plain dict (``cnn``, ``weights``, ``input_size``, ``batch_size``,
        ``device``, ``amp``, optional ``allow_download``, ``seed``), checked first
        (:func:`features.mapper.check_extractor_config`)."""
        check_extractor_config(config)
        backbone = load_backbone(config["cnn"], config.get("weights", "imagenet"),
                                 bool(config.get("allow_download", False)),
                                 input_size=config.get("input_size"), seed=int(config.get("seed", 0)))
        mapper = cls(backbone, batch_size=int(config.get("batch_size", 32)),
                     device=config.get("device", "cpu"), amp=bool(config.get("amp", False)),
                     threads=config.get("threads"))
        mapper._build_kw = {"allow_download": bool(config.get("allow_download", False)),
                            "seed": int(config.get("seed", 0))}
        return mapper

    @property
    def config(self) -> dict[str, Any]:
        """Plain, JSON-able dict that :meth:`from_config` turns back into an equal mapper."""
        b = self.backbone
        return {"detector": "grid", "cnn": b.name, "weights": "none" if b.weights.startswith("none") else
                b.weights, "allow_download": self._build_kw.get("allow_download", False),
                "seed": self._build_kw.get("seed", 0), "input_size": b.input_size,
                "batch_size": self.batch_size, "device": str(self.device), "amp": self.amp,
                "threads": self.threads}

    @property
    def dtypes(self) -> dict[str, str]:
        """Numpy dtype name of each output (:data:`REGION_DTYPES`)."""
        return {name: REGION_DTYPES[name].name for name in self.outputs}

    @property
    def provenance(self) -> dict[str, Any]:
        """Network, weights checksum, the single resized view, grid and feature sizes."""
        import timm
        import torchvision

        b = self.backbone
        k, dim = self.outputs["regions"]
        return {
            "detector": "grid", "network": b.name, "weights": b.weights, "weights_file": b.weights_file,
            "weights_sha256": b.weights_sha256, "input_size": b.input_size,
            "view": f"whole image resized to {b.input_size}x{b.input_size} (aspect ratio not kept, no crop)",
            "interpolation": b.interpolation, "mean": list(b.mean), "std": list(b.std),
            "grid": list(self.grid), "k": k, "dim": dim,
            "features": "cells of the last feature map, row-major",
            "boxes": "cell rectangles in pixels of the loaded image, x1 y1 x2 y2",
            "outputs": {n: list(s) for n, s in self.outputs.items()}, "amp": self.amp,
            "torch": torch.__version__, "torchvision": torchvision.__version__, "timm": timm.__version__,
        }

    @property
    def recipe(self) -> tuple[Any, ...]:
        """How :meth:`prepare` resizes: ``("square", input_size, interpolation)``."""
        return ("square", self.backbone.input_size, self.backbone.interpolation)

    def prepare(self, img: Image.Image) -> PreparedImage:
        """The host's part (thread-safe; the extraction's decode threads call it): the image resized to the
        network's input, ``(size, size, 3)`` uint8 pixels (normalised on the device)."""
        b = self.backbone
        size = b.input_size
        resized = img.convert("RGB").resize((size, size), Image.Resampling[b.interpolation.upper()])
        return PreparedImage(rgb_pixels(resized), img.size, self.recipe)

    def __call__(self, images: list[Image.Image | PreparedImage]) -> dict[str, np.ndarray]:
        """RGB PIL images (or their :meth:`prepare`) -> ``{regions (B, k, D), boxes (B, k, 4), counts (B,),
        image_size (B, 2)}``."""
        with pinned_threads(self.threads):
            return self._map(images)

    def _map(self, images: list[Image.Image | PreparedImage]) -> dict[str, np.ndarray]:
        items = [prepared(self, img) for img in images]
        out = empty_region_rows(len(items), self.outputs)
        h, w = self.grid
        with torch.inference_mode():
            for start in range(0, len(items), self.images_per_pass):
                group = items[start : start + self.images_per_pass]
                pixels = torch.stack([item.pixels for item in group]).to(self.device, non_blocking=True)
                x = normalize_pixels(pixels, self._table)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.amp):
                    fmap = feature_map(self.backbone, x)
                # (B, C, h, w) -> (B, h * w, C): region i * w + j is cell (i, j)
                out["regions"][start : start + len(group)] = (
                    fmap.float().flatten(2).transpose(1, 2).cpu().numpy())
        for i, item in enumerate(items):
            out["boxes"][i] = grid_boxes(h, w, *item.size)
            out["counts"][i] = h * w
            out["image_size"][i] = item.size
        return out


# --- detector regions --------------------------------------------------------------------------------


def select_regions(boxes: torch.Tensor, scores: torch.Tensor, min_boxes: int = DEFAULT_BOXES,
                   max_boxes: int = DEFAULT_BOXES, score_threshold: float = SCORE_THRESHOLD,
                   nms_iou: float = NMS_IOU) -> torch.Tensor:
    """Bottom-up-attention box selection: indices (n,) long into ``boxes (P, 4)`` / ``scores (P,)``.

    Class-agnostic NMS at ``nms_iou`` over all boxes by score; of the survivors, those scoring at least
    ``score_threshold``, at most ``max_boxes``; when fewer than ``min_boxes`` pass the threshold, the
    best-scoring survivors below it fill up to ``min_boxes`` (BUTD sorts the detector's confidences and
    takes the top ``MIN_BOXES``). Fewer than ``min_boxes`` only when fewer boxes survive the NMS.
    Indices are in decreasing score order (ties: lower index first).
    """
    from torchvision.ops import nms

    if min_boxes < 1 or max_boxes < min_boxes:
        raise UserError(f"need 1 <= min boxes <= max boxes, got {min_boxes} and {max_boxes}")
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    keep = nms(boxes.float(), scores.float(), nms_iou)  # decreasing score
    # a stable order for equal scores, so the choice does not depend on NMS internals
    order = torch.from_numpy(np.lexsort((keep.cpu().numpy(), -scores[keep].cpu().double().numpy())))
    keep = keep.cpu()[order]
    passing = int((scores.cpu()[keep] >= score_threshold).sum())
    n = min(max(passing, min_boxes), max_boxes, len(keep))
    return keep[:n]


def _fasterrcnn(seed: int) -> nn.Module:
    """torchvision's ``fasterrcnn_resnet50_fpn`` layout with frozen batch norms (the layout its COCO
    checkpoint was saved from), seeded random initialisation, eval mode."""
    import torchvision
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
    from torchvision.ops import misc

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        resnet = torchvision.models.resnet50(weights=None, norm_layer=misc.FrozenBatchNorm2d)
        model = FasterRCNN(_resnet_fpn_extractor(resnet, 3), num_classes=91)
    return model.eval()


class DetectorRegionMapper:
    """Images -> bottom-up-attention regions of torchvision's Faster R-CNN (see the module docstring).

    Args:
        weights: ``"coco"`` (torchvision's COCO checkpoint from the local torch cache; downloaded only with
            ``allow_download``), a checkpoint ``PATH``, or ``"none"`` (seeded random init, for tests).
        min_boxes, max_boxes: regions per image (``k = max_boxes``; ``36, 36`` is BUTD's fixed K,
            ``10, 100`` its adaptive setting).
        min_size, max_size: torchvision's resize of the input (shorter side, longer-side cap).
        proposals: RPN boxes kept after its NMS, the candidates of the selection.
        score_threshold, nms_iou: the selection rules (:func:`select_regions`; BUTD's 0.2 and 0.3).
        device, amp, threads: as for :class:`GridRegionMapper` (the selection always runs in float32).
    """

    detector = "fasterrcnn"

    def __init__(self, weights: str = "coco", min_boxes: int = DEFAULT_BOXES, max_boxes: int = DEFAULT_BOXES,
                 min_size: int = 800, max_size: int = 1333, proposals: int = 300,
                 device: str | torch.device | None = "cpu", amp: bool = False, allow_download: bool = False,
                 seed: int = 0, score_threshold: float = SCORE_THRESHOLD, nms_iou: float = NMS_IOU,
                 threads: int | None = None) -> None:
        from features import weights as W
        from vsecore.io import sha256_file

        if min_boxes < 1 or max_boxes < min_boxes:
            raise UserError(f"need 1 <= --min-boxes <= --max-boxes, got {min_boxes} and {max_boxes}")
        if min_size < 32 or max_size < min_size:
            raise UserError(f"need 32 <= min size <= max size, got {min_size} and {max_size}")
        if proposals < max_boxes:
            raise UserError(f"--proposals {proposals} is fewer than --max-boxes {max_boxes}")
        if not 0.0 < nms_iou <= 1.0:
            raise UserError(f"the NMS threshold must be in (0, 1], got {nms_iou}")
        if threads is not None and threads < 1:
            raise UserError(f"--threads must be at least 1, not {threads}")
        self.score_threshold, self.nms_iou, self.threads = float(score_threshold), float(nms_iou), threads
        self.weights, self.allow_download, self.seed = weights, allow_download, seed
        self.min_boxes, self.max_boxes = int(min_boxes), int(max_boxes)
        model = _fasterrcnn(seed)
        self.weights_sha256: str | None = None
        self.weights_file: str | None = None
        if weights != "none":
            if weights == "coco":
                from torchvision.models.detection import FasterRCNN_ResNet50_FPN_Weights

                path = W.torchvision_checkpoint(FasterRCNN_ResNet50_FPN_Weights.COCO_V1.url, allow_download,
                                                what=f"COCO weights of {FASTERRCNN_NETWORK}")
            else:
                from pathlib import Path

                path = Path(weights).expanduser()
            W.load_into(model, W.read_state_dict(path), source=str(path))
            self.weights_sha256, self.weights_file = sha256_file(path), str(path)
        model.transform.min_size, model.transform.max_size = (int(min_size),), int(max_size)
        model.rpn._post_nms_top_n["testing"] = int(proposals)
        self.proposals = int(proposals)
        self.device = resolve_device(device)
        self.amp = bool(amp) and self.device.type == "cuda"
        self.model = model.to(self.device).eval()
        # 8-bit levels -> 0..1: torchvision's detection transform normalises by its own mean and std
        self._unit_table = normalization_table((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), self.device)
        for param in self.model.parameters():
            param.requires_grad_(False)
        dim = int(self.model.roi_heads.box_predictor.cls_score.in_features)
        self.outputs = region_outputs(self.max_boxes, dim)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DetectorRegionMapper:
        """Build from :attr:`config`'s plain dict."""
        return cls(weights=config.get("weights", "coco"),
                   min_boxes=int(config.get("min_boxes", DEFAULT_BOXES)),
                   max_boxes=int(config.get("max_boxes", DEFAULT_BOXES)),
                   min_size=int(config.get("min_size", 800)), max_size=int(config.get("max_size", 1333)),
                   proposals=int(config.get("proposals", 300)),
                   device=config.get("device", "cpu"), amp=bool(config.get("amp", False)),
                   allow_download=bool(config.get("allow_download", False)), seed=int(config.get("seed", 0)),
                   score_threshold=float(config.get("score_threshold", SCORE_THRESHOLD)),
                   nms_iou=float(config.get("nms_iou", NMS_IOU)), threads=config.get("threads"))

    @property
    def config(self) -> dict[str, Any]:
        """Plain, JSON-able dict that :meth:`from_config` turns back into an equal mapper."""
        t = self.model.transform
        return {"detector": "fasterrcnn", "network": FASTERRCNN_NETWORK, "weights": self.weights,
                "allow_download": self.allow_download, "seed": self.seed, "min_boxes": self.min_boxes,
                "max_boxes": self.max_boxes, "min_size": int(t.min_size[0]), "max_size": int(t.max_size),
                "proposals": self.proposals, "score_threshold": self.score_threshold, "nms_iou": self.nms_iou,
                "device": str(self.device), "amp": self.amp, "threads": self.threads}

    @property
    def dtypes(self) -> dict[str, str]:
        """Numpy dtype name of each output (:data:`REGION_DTYPES`)."""
        return {name: REGION_DTYPES[name].name for name in self.outputs}

    @property
    def provenance(self) -> dict[str, Any]:
        """Network, weights checksum, input scale, feature layer and dimension, selection rules."""
        import torchvision

        t = self.model.transform
        k, dim = self.outputs["regions"]
        return {
            "detector": "fasterrcnn", "network": FASTERRCNN_NETWORK,
            "weights": "none (random init)" if self.weights == "none" else self.weights,
            "weights_file": self.weights_file, "weights_sha256": self.weights_sha256,
            "min_size": int(t.min_size[0]), "max_size": int(t.max_size), "proposals": self.proposals,
            "mean": list(t.image_mean), "std": list(t.image_std), "k": k, "dim": dim,
            "features": f"box head fc7 after ReLU ({dim}-d) of 7x7 RoIAlign over FPN P2-P5 "
                        "(MultiScaleRoIAlign)",
            "boxes": "RPN proposals (not class-regressed), pixels of the loaded image, x1 y1 x2 y2",
            "selection": {"score": "max foreground class probability",
                          "score_threshold": self.score_threshold, "nms": "class-agnostic",
                          "nms_iou": self.nms_iou, "min_boxes": self.min_boxes, "max_boxes": self.max_boxes},
            "outputs": {n: list(s) for n, s in self.outputs.items()}, "amp": self.amp,
            "torch": torch.__version__, "torchvision": torchvision.__version__,
        }

    def detect(self, img: Image.Image) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One image -> ``(features (n, D), boxes (n, 4), scores (n,))`` of the selected regions, float32,
        boxes in pixels of ``img``, decreasing score."""
        from torchvision.models.detection.transform import resize_boxes

        m = self.model
        # torchvision scales by min(min_size / short, max_size / long): a 2000x5 strip would shrink to less
        # than a pixel; its short side is stretched so the network sees at least MIN_SIDE pixels (boxes are
        # mapped back to the image as loaded below, axis by axis)
        short = math.ceil(max(img.size) * MIN_SIDE / int(m.transform.max_size))
        view = img if min(img.size) >= short else img.resize(
            (max(img.width, short), max(img.height, short)), Image.Resampling.BILINEAR)
        pixels = rgb_pixels(view).to(self.device)
        x = normalize_pixels(pixels, self._unit_table)
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.amp):
            batch, _ = m.transform([x])
            fmaps = m.backbone(batch.tensors)
            proposals, _ = m.rpn(batch, fmaps)
            pooled = m.roi_heads.box_roi_pool(fmaps, proposals, batch.image_sizes)
            feats = m.roi_heads.box_head(pooled).float()
            logits, _ = m.roi_heads.box_predictor(feats)
        scores = F.softmax(logits.float(), dim=-1)[:, 1:].amax(dim=-1)  # background is class 0
        keep = select_regions(proposals[0].float().cpu(), scores.cpu(), self.min_boxes, self.max_boxes,
                              self.score_threshold, self.nms_iou)
        boxes = resize_boxes(proposals[0].float().cpu()[keep], list(batch.image_sizes[0]),
                             [img.height, img.width])
        return (feats.cpu()[keep].numpy(), boxes.numpy().astype(np.float32),
                scores.cpu()[keep].numpy().astype(np.float32))

    def __call__(self, images: list[Image.Image]) -> dict[str, np.ndarray]:
        """RGB PIL images -> ``{regions (B, k, D), boxes (B, k, 4), counts (B,), image_size (B, 2)}``;
        an image with ``n < k`` regions has zero rows ``n..k-1``."""
        with pinned_threads(self.threads):
            return self._map(images)

    def _map(self, images: list[Image.Image]) -> dict[str, np.ndarray]:
        out = empty_region_rows(len(images), self.outputs)
        for i, img in enumerate(images):
            feats, boxes, _ = self.detect(img.convert("RGB"))
            n = len(feats)
            out["regions"][i, :n] = feats
            out["boxes"][i, :n] = boxes
            out["counts"][i] = n
            out["image_size"][i] = img.size
        return out


def build_region_mapper(config: dict[str, Any]) -> GridRegionMapper | DetectorRegionMapper:
    """The region mapper of a plain config (``detector``: ``grid`` or ``fasterrcnn``, then that mapper's
    keys), e.g. once per Dask worker. ``detectron2`` is refused with the way round it."""
    detector = config.get("detector", "grid")
    if detector == "grid":
        return GridRegionMapper.from_config(config)
    if detector == "fasterrcnn":
        return DetectorRegionMapper.from_config(config)
    if detector == "detectron2":
        import importlib.util

        installed = importlib.util.find_spec("detectron2") is not None
        state = "is not a backend here" if installed else "is not installed"
        raise UserError(
            f"--detector detectron2: detectron2 {state}; use --detector fasterrcnn or grid, or run a "
            "detectron2 bottom-up-attention extractor and import its TSV with --format butd-tsv")
    raise UserError(f"unknown detector {detector!r}: use one of {', '.join(DETECTORS)}")
