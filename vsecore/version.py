"""The toolkit's version as stores, runs and model folders record it."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

#: the release (``pyproject.toml``'s version); ``prep.__version__`` is this
__version__ = "0.1.0"


@functools.cache
def code_version() -> str:
    """The release plus the git commit of the project (``+dirty`` if modified), if known."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        # --no-optional-locks: reading the version must not touch the repository's index
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__}+g{commit}{'.dirty' if dirty else ''}" if commit else __version__
