"""Infrastructure every stage shares, below all of them: one-line user errors and the command wrapper
(:mod:`vsecore.errors`), atomic writes, locks and temporaries (:mod:`vsecore.io`), the output-path rules
(:mod:`vsecore.outputs`), messages and progress (:mod:`vsecore.console`), the compute device
(:mod:`vsecore.device`) and the strict base of every settings schema (:mod:`vsecore.schema`). It imports
nothing of ``prep``, ``features`` or ``train``.
"""
