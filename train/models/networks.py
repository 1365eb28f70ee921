"""Every built-in network, imported explicitly (timm's way): once this module is imported the text and image
encoder registries hold all of them, whatever family was built first. ``from train.models import
create_text_encoder`` reads it; a family's spec imports only its own network module."""

import train.models.chain_vse as chain_vse
import train.models.ctt as ctt
import train.models.language_agnostic as language_agnostic
import train.models.regions as regions
import train.models.self_attention as self_attention
import train.models.uvs as uvs
from train.models.joint import VisualSemanticEmbedding, build_model
from train.models.registry import (
    TextEncoder,
    count_parameters,
    create_image_encoder,
    create_text_encoder,
    list_text_encoders,
    register_image_encoder,
    register_text_encoder,
)

#: the built-in network modules (each registers its encoders when imported)
BUILTIN_NETWORKS = (chain_vse, ctt, language_agnostic, regions, self_attention, uvs)

__all__ = ["BUILTIN_NETWORKS", "TextEncoder", "VisualSemanticEmbedding", "build_model", "count_parameters",
           "create_image_encoder", "create_text_encoder", "list_text_encoders", "register_image_encoder",
           "register_text_encoder", "regions"]
