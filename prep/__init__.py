"""Stage 1 of the toolkit: raw annotations -> prepared dataset (splits, tokens, vocabularies).

Also home of the pieces every stage shares: user-facing errors (:mod:`prep.errors`), atomic
writes (:mod:`prep.io`) and the pipeline schema (:mod:`prep.pipelines`).
"""

import contextlib
import sys
from collections.abc import Iterator

__version__ = "0.1.0"


@contextlib.contextmanager
def interrupted_while_loading(prog: str) -> Iterator[None]:
    """Around a command's imports: Ctrl-C (or SIGTERM, once a handler raises
    :class:`prep.errors.Terminated` for it) while they load ends with one line, ``prog: interrupted
    (while starting; nothing was written)``, and status 130 (143 for SIGTERM), not a traceback through
    the libraries being imported. Python 3.11 wraps an exception raised while a class body's
    ``__set_name__`` runs (pydantic has such classes) in a ``RuntimeError``: that one counts too.
    """
    try:
        yield
    except (KeyboardInterrupt, RuntimeError) as exc:
        interrupt = exc if isinstance(exc, KeyboardInterrupt) else exc.__cause__
        if not isinstance(interrupt, KeyboardInterrupt):
            raise
        from prep.errors import Terminated

        word, status = ("terminated", 143) if isinstance(interrupt, Terminated) else ("interrupted", 130)
        print(f"{prog}: {word} (while starting; nothing was written)", file=sys.stderr)
        raise SystemExit(status) from None
