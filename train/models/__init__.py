"""The models: text and image encoders (registered by name), the model families, the joint embedding model.

Every model file is imported here, explicitly (timm's way), so the encoder registries are complete as
soon as any ``train.models`` module is imported; the built-in families are registered below, in the
order ``train --help`` lists them. A family of one's own: ``register_family(module.FAMILY)``.
"""

from train.models import chain, liwe, oecc, regions, seam, vse
from train.models.family import (
    Family,
    build_objective,
    family_names,
    get_family,
    model_spec,
    register_family,
    settings_class,
    train_settings,
    with_family_defaults,
)
from train.models.joint import VisualSemanticEmbedding, build_model
from train.models.registry import (
    TEXT_INPUTS,
    ModelSpec,
    TextEncoder,
    count_parameters,
    create_image_encoder,
    create_text_encoder,
    list_text_encoders,
    register_image_encoder,
    register_text_encoder,
)

#: the families that ship with the toolkit, in ``train --help`` order
BUILTIN_FAMILIES: tuple[Family, ...] = (chain.FAMILY, oecc.FAMILY, seam.FAMILY, vse.FAMILY, liwe.CLMR,
                                        liwe.LIWE)
for _family in BUILTIN_FAMILIES:
    register_family(_family)

__all__ = [
    "BUILTIN_FAMILIES",
    "TEXT_INPUTS",
    "Family",
    "ModelSpec",
    "TextEncoder",
    "VisualSemanticEmbedding",
    "build_model",
    "build_objective",
    "count_parameters",
    "create_image_encoder",
    "create_text_encoder",
    "family_names",
    "get_family",
    "list_text_encoders",
    "model_spec",
    "register_family",
    "register_image_encoder",
    "register_text_encoder",
    "regions",
    "settings_class",
    "train_settings",
    "with_family_defaults",
]
