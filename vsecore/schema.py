"""The base of every settings schema (a stage's section of ``pipelines.yaml``, a family's config)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every stage section: strict keys, no coercion surprises."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    #: fields holding filesystem paths (resolved against the YAML file's folder)
    path_fields: ClassVar[tuple[str, ...]] = ()
