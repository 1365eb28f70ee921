"""Named pipelines: the schema of ``pipelines.yaml`` (:mod:`pipelines.schema`, also the defaults of every
stage command through :func:`pipelines.schema.stage_settings`) and the runner of ``train pipeline NAME``
(:mod:`pipelines.runner`), which runs the stages in order and skips those up to date.

A package of its own, above the stages: the schema describes all of them (``prep``, ``features``,
``train``, ``classify``, ``evaluate``) and the runner calls each, so it belongs to none; ``prep`` and
``features`` import the schema without importing ``train``'s models.
"""
