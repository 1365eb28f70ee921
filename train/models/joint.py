"""The joint visual-semantic embedding: a text encoder and an image encoder mapped into one space.

CHAIN-VSE Eq. 1 / OECC Eq. 3: images are projected by ``f_i(I) = |W_i . C(I)|`` with
``W_i in R^(d x c)`` (c = 4096 for VGG-19 fc7, 1536 IRv2, 2048 ResNet-152); captions by
``f_t(T) = |W_t . g(T)|`` with ``W_t in R^(d x l)`` over the text encoder's ``l``-long output. The
absolute value puts both in the non-negative orthant the order embedding needs. Both are then
scaled to unit norm (section 2.4 / 2.3: "we first scale m and v to have unit norm"). Neither
projection has a bias, as in the equations.

Other families change the parts, not the shape of the model (:class:`train.models.registry.ModelSpec`):
the image side is any registered image encoder (``linear`` is ``W_i``; region features take a
region encoder), ``W_t`` may be absent (a GRU whose size is ``d``) or carry a bias (SEAM), and
cosine models may drop ``|.|``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from train.models.family import model_spec
from train.models.registry import (
    ModelSpec,
    TextEncoder,
    count_parameters,
    create_image_encoder,
    create_text_encoder,
)


class VisualSemanticEmbedding(nn.Module):
    """Text encoder (+ ``W_t``) and image encoder into a shared, L2-normalised space of size ``d``.

    Args:
        text_encoder: a registered ``TextEncoder`` with ``output_dim = l``.
        image_encoder: a registered image encoder, ``(B, *feature_shape) -> (B, d)``.
        d: size of the joint embedding space.
        text_projection: add ``W_t`` (``d x l``); without it the encoder must output ``d``.
        text_projection_bias: give ``W_t`` a bias.
        absolute: take ``|.|`` on both sides before normalising (order embeddings).
    """

    def __init__(self, text_encoder: TextEncoder, image_encoder: nn.Module, d: int,
                 text_projection: bool = True, text_projection_bias: bool = False,
                 absolute: bool = True) -> None:
        super().__init__()
        self.text_encoder = text_encoder
        self.image_encoder = image_encoder
        if text_projection:
            self.text_projection = nn.Linear(text_encoder.output_dim, d, bias=text_projection_bias)
            nn.init.xavier_uniform_(self.text_projection.weight)
            if text_projection_bias:
                nn.init.zeros_(self.text_projection.bias)
        elif text_encoder.output_dim != d:
            raise ValueError(f"the text encoder outputs {text_encoder.output_dim} dimensions, the joint "
                             f"space has {d}: it needs a text projection")
        else:
            self.text_projection = nn.Identity()
        self.absolute = absolute
        self.d = d
        self._register_load_state_dict_pre_hook(_rename_old_keys)

    def _finish(self, z: torch.Tensor) -> torch.Tensor:
        if self.absolute:
            z = z.abs()
        return F.normalize(z, dim=1)

    def encode_images(self, images: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """``images (B, *feature_shape) float -> (B, d)`` unit-norm (``|.|`` first when ``absolute``).

        ``counts`` (B,) int64: real regions of region features (the others are padding), passed to the
        region encoder; None: every region is real (and the only form other image encoders take).
        """
        if counts is None:
            return self._finish(self.image_encoder(images))
        return self._finish(self.image_encoder(images, counts))

    def encode_captions(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``tokens (B, T) or (B, T, C) long, lengths (B,) long -> (B, d)`` unit-norm ``|W_t f_t(T)|``."""
        return self._finish(self.text_projection(self.text_encoder(tokens, lengths)))

    def penalty(self) -> torch.Tensor | None:
        """The text encoder's regulariser of its last forward pass (SEAM), or ``None``."""
        return getattr(self.text_encoder, "penalty", None)

    def forward(self, images: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both sides of a batch: ``(images (B, d), captions (B', d))``."""
        return self.encode_images(images), self.encode_captions(tokens, lengths)

    def parameter_report(self) -> dict[str, int]:
        """Trainable parameters: ``text_encoder``, ``text_projection``, ``image_encoder`` and ``total``.

        A text encoder with its own ``parameter_report()`` (CLMR, LIWE: word embeddings and the GRU) adds
        its parts right after ``text_encoder`` as ``text_encoder.<part>``.
        """
        report = {"text_encoder": count_parameters(self.text_encoder)}
        parts = getattr(self.text_encoder, "parameter_report", None)
        if callable(parts):
            report.update({f"text_encoder.{k}": int(v) for k, v in parts().items()})
        report["text_projection"] = count_parameters(self.text_projection)
        report["image_encoder"] = count_parameters(self.image_encoder)
        report["total"] = count_parameters(self)
        return report


def _rename_old_keys(state_dict: dict, prefix: str, *args: object) -> None:
    """Checkpoints written before image encoders were registered named ``W_i`` ``image_projection``."""
    old = prefix + "image_projection.weight"
    if old in state_dict:
        state_dict[prefix + "image_encoder.projection.weight"] = state_dict.pop(old)


def build_model(settings, vocab_size: int, feature_shape: int | Sequence[int],
                spec: ModelSpec | None = None) -> VisualSemanticEmbedding:
    """The model of a ``TrainSection``: the family's :class:`ModelSpec` with joint size ``settings.d``.

    Args:
        settings: a family's settings (:func:`train.models.family.train_settings`: ``family``, the
            family's keys, ``d``).
        vocab_size: symbols of the train-split alphabet (character input) or word vocabulary (words).
        feature_shape: shape of one image's features: ``C`` (or ``(C,)``) for global/FNE features,
            ``(k, D)`` for region features.
        spec: the family's spec when already known (default: :func:`model_spec` of ``settings``).
    """
    spec = spec or model_spec(settings)
    shape = (int(feature_shape),) if isinstance(feature_shape, int) else tuple(int(s) for s in feature_shape)
    encoder = create_text_encoder(spec.text_encoder, vocab_size, **spec.text_kwargs)
    image_encoder = create_image_encoder(spec.image_encoder, shape, settings.d, **spec.image_kwargs)
    return VisualSemanticEmbedding(encoder, image_encoder, settings.d, text_projection=spec.text_projection,
                                   text_projection_bias=spec.text_projection_bias, absolute=spec.absolute)
