"""Evaluation of image-text retrieval: metrics, ranking kernel, protocols, ``train evaluate``."""

from train.evaluate.ranking import *  # noqa: F403  (temporary: split into modules in the next commit)
from train.evaluate.ranking import (  # noqa: F401
    _as_caption_image,
    _check_caption_image,
)
