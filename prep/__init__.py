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
    """Around a command's imports: Ctrl-C while they load ends with ``prog: interrupted`` and status 130.

    The same line :func:`prep.errors.run_cli` prints for a Ctrl-C later on, instead of a traceback
    through the libraries being imported. Python 3.11 wraps an exception raised while a class body's
    ``__set_name__`` runs (pydantic has such classes) in a ``RuntimeError``: that one counts too.
    """
    try:
        yield
    except (KeyboardInterrupt, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
