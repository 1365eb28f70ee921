"""Text encoders (registered by name), the joint visual-semantic embedding model and ``build_model``."""

from train.models.registry import (
    TextEncoder,
    count_parameters,
    create_text_encoder,
    list_text_encoders,
    register_family,
    register_text_encoder,
)
from train.models.vse import VisualSemanticEmbedding, build_model

__all__ = [
    "TextEncoder",
    "VisualSemanticEmbedding",
    "build_model",
    "count_parameters",
    "create_text_encoder",
    "list_text_encoders",
    "register_family",
    "register_text_encoder",
]
