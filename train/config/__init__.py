"""The train stage's configuration, above the models it names: a run's ``config.json`` (:mod:`.run`:
settings and models rebuilt from it, input fingerprints, resume checks) and the train stage's sections of a
pipelines file (:mod:`.sections`: ``train``, ``classify``, ``compare``, ``evaluate``, validated with train's
own settings, their inputs taken from the upstream stages)."""
