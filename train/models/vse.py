"""The joint visual-semantic embedding: a text encoder and two linear maps into ``R_+^d``.

CHAIN-VSE Eq. 1 / OECC Eq. 3: images are projected by ``f_i(I) = |W_i . C(I)|`` with
``W_i in R^(d x c)`` (c = 4096 for VGG-19 fc7, 1536 IRv2, 2048 ResNet-152); captions by
``f_t(T) = |W_t . g(T)|`` with ``W_t in R^(d x l)`` over the text encoder's ``l``-long output. The
absolute value puts both in the non-negative orthant the order embedding needs. Both are then
scaled to unit norm (section 2.4 / 2.3: "we first scale m and v to have unit norm"). Neither
projection has a bias, as in the equations.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from train.models.registry import TextEncoder, count_parameters, create_text_encoder, encoder_for


class VisualSemanticEmbedding(nn.Module):
    """Text encoder + ``W_t`` and image projection ``W_i`` into a shared, L2-normalised space.

    Args:
        text_encoder: a registered ``TextEncoder`` with ``output_dim = l``.
        image_dim: ``c``, width of the image features.
        d: size of the joint embedding space.
        absolute: take ``|.|`` after both projections (order embeddings); ``False`` for cosine-only
            models that do not need the non-negative orthant.
    """

    def __init__(self, text_encoder: TextEncoder, image_dim: int, d: int, absolute: bool = True) -> None:
        super().__init__()
        self.text_encoder = text_encoder
        self.text_projection = nn.Linear(text_encoder.output_dim, d, bias=False)
        self.image_projection = nn.Linear(image_dim, d, bias=False)
        self.absolute = absolute
        self.d = d
        self.image_dim = image_dim
        for projection in (self.text_projection, self.image_projection):
            nn.init.xavier_uniform_(projection.weight)

    def _finish(self, z: torch.Tensor) -> torch.Tensor:
        if self.absolute:
            z = z.abs()
        return F.normalize(z, dim=1)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``images (B, c) float -> (B, d)`` unit-norm ``|W_i x|``."""
        return self._finish(self.image_projection(images))

    def encode_captions(self, chars: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``chars (B, T) long, lengths (B,) long -> (B, d)`` unit-norm ``|W_t f_t(T)|``."""
        return self._finish(self.text_projection(self.text_encoder(chars, lengths)))

    def forward(self, images: torch.Tensor, chars: torch.Tensor, lengths: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both sides of a batch: ``(images (B, d), captions (B', d))``."""
        return self.encode_images(images), self.encode_captions(chars, lengths)

    def parameter_report(self) -> dict[str, int]:
        """Trainable parameters per part: ``text_encoder``, ``text_projection``, ``image_projection``,
        ``total``."""
        report = {
            "text_encoder": count_parameters(self.text_encoder),
            "text_projection": count_parameters(self.text_projection),
            "image_projection": count_parameters(self.image_projection),
        }
        report["total"] = count_parameters(self)
        return report


def build_model(settings, alphabet_size: int, image_dim: int) -> VisualSemanticEmbedding:
    """The model of a ``TrainSection``: the family's text encoder (``chain``: ``chain_<version>``
    with width ``p``; ``oecc``: ``oecc_<arch>``) and projections into ``settings.d`` dimensions.

    Args:
        settings: ``prep.pipelines.TrainSection`` (``family``, ``version``, ``p``, ``arch``, ``d``,
            ``measure``).
        alphabet_size: symbols of the train-split alphabet (``len(chars.json["symbols"])``).
        image_dim: ``c``, width of the image feature matrix.
    """
    name, kwargs = encoder_for(settings)
    encoder = create_text_encoder(name, alphabet_size, **kwargs)
    # |.| is what makes order embeddings well defined; every family here keeps it (the papers do)
    return VisualSemanticEmbedding(encoder, image_dim, settings.d, absolute=True)
