"""Infrastructure every stage shares, below all of them: one-line user errors and the command wrapper
(:mod:`vsecore.errors`), atomic writes, locks and temporaries (:mod:`vsecore.io`), the output-path rules
(:mod:`vsecore.outputs`), messages and progress (:mod:`vsecore.console`) and the compute device
(:mod:`vsecore.device`). It imports nothing of ``prep``, ``features`` or ``train``.
"""
