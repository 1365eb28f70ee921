"""Named pipelines, the orchestrator above every stage: the schema of ``pipelines.yaml``
(:mod:`pipelines.schema`: every pipeline of a file, each section validated by its stage's own reader), the
runner of ``train pipeline NAME`` (:mod:`pipelines.runner`), which runs the stages in order and skips those
up to date, and the ``train`` console command with ``train pipeline`` added (:mod:`pipelines.cli`).

A package of its own, at the top of the package graph (vsecore <- prep <- features <- train <- pipelines): it
imports the stages it runs, and no stage imports it; a stage command given ``--pipeline NAME`` reads its own
section through :mod:`vsecore.pipelines_file`.
"""
