"""The models: the model families (what ``train <family>`` trains), their networks (text and image encoders,
registered by name), the joint embedding model.

A family is declared in a light file of its own (``chain``, ``oecc``, ``seam``, ``vse``, ``liwe``: clmr and
liwe), imported here explicitly and registered below, in the order ``train --help`` lists them; its networks
(torch) are a module named after the paper's model, which its spec imports when a model is built, so
``train --help`` and ``pipelines.yaml`` read the families without torch. The names of the networks' side
(``create_text_encoder``, ``build_model``, ...) come from :mod:`train.models.networks`, which imports every
built-in network, when first asked for. A family of one's own: ``register_family(module.FAMILY)``.
"""

from typing import Any

from train.models import chain, liwe, oecc, seam, vse
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
from train.models.spec import TEXT_INPUTS, ModelSpec

#: the families that ship with the toolkit, in ``train --help`` order
BUILTIN_FAMILIES: tuple[Family, ...] = (chain.FAMILY, oecc.FAMILY, seam.FAMILY, vse.FAMILY, liwe.CLMR,
                                        liwe.LIWE)
for _family in BUILTIN_FAMILIES:
    register_family(_family)

#: the names of the networks' side, read from :mod:`train.models.networks` when first asked for
NETWORK_NAMES = ("TextEncoder", "VisualSemanticEmbedding", "build_model", "count_parameters",
                 "create_image_encoder", "create_text_encoder", "list_text_encoders",
                 "register_image_encoder", "register_text_encoder", "regions")


def __getattr__(name: str) -> Any:
    """``from train.models import create_text_encoder`` (and the other :data:`NETWORK_NAMES`): the networks
    and torch load only when one of them is asked for."""
    if name not in NETWORK_NAMES:
        raise AttributeError(f"module 'train.models' has no attribute {name!r}")
    from train.models import networks  # start-up: torch only when a network is asked for

    return getattr(networks, name)


__all__ = [
    "BUILTIN_FAMILIES",
    "TEXT_INPUTS",
    "Family",
    "ModelSpec",
    *NETWORK_NAMES,
    "build_objective",
    "family_names",
    "get_family",
    "model_spec",
    "register_family",
    "settings_class",
    "train_settings",
    "with_family_defaults",
]
