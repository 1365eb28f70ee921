"""Detector regions: the bottom-up-attention selection of torchvision's Faster R-CNN boxes.

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
TSV, which :mod:`features.interop.region_formats` reads.

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

from features.extractors.crops import normalization_table, normalize_pixels, rgb_pixels
from features.extractors.mapper import pinned_threads
from features.extractors.regions import (
    DEFAULT_BOXES,
    FASTERRCNN_NETWORK,
    NMS_IOU,
    REGION_DTYPES,
    SCORE_THRESHOLD,
    empty_region_rows,
    region_outputs,
)
from vsecore.device import autocast, resolve_device, uses_amp
from vsecore.errors import UserError

#: shortest side, in pixels at the detector's scale, of what the detector is shown
MIN_SIDE = 32


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
        import features.extractors.weights as W
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
        self.amp = uses_amp(self.device, amp)
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
        with torch.inference_mode(), autocast(self.device, self.amp):
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

    #: images the block runner hands over at a time (each goes through the detector alone anyway)
    images_per_call = 1

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
