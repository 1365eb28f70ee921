"""Stage 1 of the toolkit: raw annotations -> prepared dataset (splits, tokens, vocabularies).

Also home of the pieces every stage shares: user-facing errors (:mod:`prep.errors`), atomic
writes (:mod:`prep.io`) and the pipeline schema (:mod:`prep.pipelines`).
"""

__version__ = "0.1.0"
