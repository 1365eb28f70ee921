"""``features export --format precomp`` interrupted leaves no temporary file (issue 29, item 5).

The signal is sent by the process to itself at the named moment, right after a temporary file of
``atomic_file`` is created (a patched ``tempfile.mkstemp``), the instant at which it was left behind
before: the handler ran before the code that removes the file on an exception was entered.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
from helpers import imported_store, minimal_prepared

from features.entry import main
from vsecore import io
from vsecore.io import _host_tag


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("signum, status, word", [(signal.SIGINT, 130, "interrupted"),
                                                  (signal.SIGTERM, 143, "terminated")])
@pytest.mark.parametrize("target", ["train_ims.npy", "train_caps.txt", "test_ims.npy"])
def test_an_interrupted_precomp_export_leaves_no_temporary(tmp_path, monkeypatch, capsys, signum, status,
                                                           word, target) -> None:
    data = minimal_prepared(tmp_path / "data", 8, 4)
    imported_store(data, tmp_path / "s.zarr")
    out = tmp_path / "out"
    real = tempfile.mkstemp

    def mkstemp(*args: object, **kwargs: object) -> tuple[int, str]:
        made = real(*args, **kwargs)
        if str(kwargs.get("prefix", "")).startswith(f".{target}."):
            os.kill(os.getpid(), signum)  # the handler runs here, before mkstemp returns its file
        return made

    monkeypatch.setattr(io.tempfile, "mkstemp", mkstemp)
    export = ["export", "--store", str(tmp_path / "s.zarr"), "--data", str(data), "--format", "precomp",
              "--out", str(out)]
    assert main(export) == status
    assert capsys.readouterr().err.strip() == f"features: {word}"
    assert temporaries(out) == []
    monkeypatch.undo()

    # a temporary of an export killed outright (SIGKILL: nothing of it ran) goes with the next export
    dead = out / f".train_ims.npy.{_host_tag()}-{2**22 + 12345}.a1b2c3.tmp"
    dead.write_bytes(b"\x93NUMPY torn")
    assert main([*export, "--overwrite"]) == 0
    assert temporaries(out) == [] and np.load(out / "train_ims.npy").shape == (8, 16)
