"""Stage 1 of the toolkit: raw annotations -> prepared dataset (splits, tokens, vocabularies).

The infrastructure every stage shares (errors, atomic writes, output rules, console, device) is the
package :mod:`vsecore`, below all stages.
"""

__version__ = "0.1.0"
