"""Stage 1 of the toolkit: raw annotations -> prepared dataset (splits, tokens, vocabularies).

The infrastructure every stage shares (errors, atomic writes, output rules, console, device) is the
package :mod:`vsecore`, below all stages.
"""

from vsecore.version import __version__  # noqa: E402,F401  (one release number, recorded by every stage)
