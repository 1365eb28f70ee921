"""Text encoders (registered by name), the joint visual-semantic embedding model and ``build_model``."""

from train.models.registry import (
    TEXT_INPUTS,
    ModelSpec,
    TextEncoder,
    count_parameters,
    create_image_encoder,
    create_text_encoder,
    list_text_encoders,
    model_spec,
    register_family,
    register_image_encoder,
    register_text_encoder,
)
from train.models.vse import VisualSemanticEmbedding, build_model

__all__ = [
    "TEXT_INPUTS",
    "ModelSpec",
    "TextEncoder",
    "VisualSemanticEmbedding",
    "build_model",
    "count_parameters",
    "create_image_encoder",
    "create_text_encoder",
    "list_text_encoders",
    "model_spec",
    "register_family",
    "register_image_encoder",
    "register_text_encoder",
]
