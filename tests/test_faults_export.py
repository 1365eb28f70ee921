"""``train export-model`` and ``train convert-checkpoints`` under faults (issue 29, items 3, 4 and 7).

A killed export leaves the temporary siblings of its atomic folder (``.NAME.XXXXXXXX.partial``, and
``.NAME.old-PID`` between the two renames of an ``--overwrite``): the process is SIGKILLed by a patched
writer at that very moment, and the next export removes them. A full disk is a patched writer raising
the exception the real one raises (safetensors' ``SafetensorError``, an ``OSError`` of ENOSPC, torch's
``RuntimeError`` whose context is the ``OSError``), and must be one line that says the disk is full and
what was kept.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import CLASSIFY_TINY, FullDisk, legacy_copy
from safetensors import SafetensorError

from train.cli import main as train_main
from train.retrieval import model_folder
from train.run import checkpoint
from train.run.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
#: runs ``train ARGV`` after patching ``os.replace`` or the safetensors writer of export-model to SIGKILL
#: the process at the named moment (argv[1]: ``after-weights``, ``after-swap`` or ``between-renames``)
KILLER = """
import os, signal, sys
from train.retrieval import model_folder
moment = sys.argv[1]
if moment == "after-weights":
    real_save = model_folder.save_file
    def save_file(tensors, path, metadata=None):
        real_save(tensors, path, metadata=metadata)
        os.kill(os.getpid(), signal.SIGKILL)
    model_folder.save_file = save_file
elif moment == "after-swap":
    from vsecore import io as vio
    real_exchange = vio.exchange
    def exchange(a, b):
        done = real_exchange(a, b)
        os.kill(os.getpid(), signal.SIGKILL)
        return done
    vio.exchange = exchange
else:  # between-renames, on a file system that cannot swap two folders in one step
    from vsecore import io as vio
    vio.exchange = lambda a, b: False
    real_replace = os.replace
    def replace(src, dst):
        real_replace(src, dst)
        if ".old-" in os.fspath(dst):
            os.kill(os.getpid(), signal.SIGKILL)
    os.replace = replace
from train.cli import main
sys.exit(main(sys.argv[2:]))
"""


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial" in p.name or ".old-" in p.name)


def killed_export(moment: str, argv: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", KILLER, moment, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_an_export_removes_what_killed_exports_left(tiny_chain_run, tmp_path, capsys) -> None:
    out = tmp_path / "model"
    export = ["export-model", "--run", str(tiny_chain_run), "--out", str(out)]
    killed_export("after-weights", export)
    assert not out.exists() and len(leftovers(tmp_path)) == 1  # .model.XXXXXXXX.partial
    assert train_main(export) == 0
    assert leftovers(tmp_path) == [] and (out / "model.json").is_file()
    killed_export("after-swap", [*export, "--overwrite"])  # swapped in one step: the old model left behind
    assert (out / "model.json").is_file() and len(leftovers(tmp_path)) == 1  # .model.XXXXXXXX.partial
    capsys.readouterr()
    assert train_main([*export, "--overwrite"]) == 0
    assert leftovers(tmp_path) == [] and ".partial (left by a killed export)" in capsys.readouterr().err
    killed_export("between-renames", [*export, "--overwrite"])  # the old folder moved aside, not the new in
    kinds = [name.rsplit("-", 1)[0] if ".old-" in name else name.rsplit(".", 1)[1]
             for name in leftovers(tmp_path)]
    assert sorted(kinds) == [".model.old", "partial"] and not out.exists()
    capsys.readouterr()
    assert train_main([*export, "--overwrite"]) == 0
    assert leftovers(tmp_path) == [] and (out / "model.json").is_file()
    err = capsys.readouterr().err
    assert "export-model: removed .model.old-" in err and ".partial (left by a killed export)" in err


@pytest.mark.parametrize("fault", ["safetensors", "model.json"])
@pytest.mark.parametrize("existing", [False, True])
def test_a_full_disk_during_an_export_is_one_line(tiny_chain_run, tmp_path, capsys, monkeypatch, fault,
                                                  existing) -> None:
    out = tmp_path / "model"
    export = ["export-model", "--run", str(tiny_chain_run), "--out", str(out)]
    if existing:
        assert train_main(export) == 0
        before = (out / "weights.safetensors").read_bytes()
        export.append("--overwrite")

    def full_safetensors(tensors: object, path: str, metadata: object = None) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28) at "
                              f'path "{Path(path).parent}/.tmpQ1w2E3"')

    def full_json(path: object, obj: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    if fault == "safetensors":
        monkeypatch.setattr(model_folder, "save_file", full_safetensors)
    else:
        monkeypatch.setattr(model_folder, "write_json_atomic", full_json)
    capsys.readouterr()
    assert train_main(export) == 2
    where = out if fault == "safetensors" else out / "model.json"
    kept = f"the model folder already at {out} is unchanged" if existing else "nothing was written"
    assert capsys.readouterr().err.strip() == (f"train: error: {where}: no space left on the device: free "
                                               f"space there (or write elsewhere) and run again; {kept}")
    assert leftovers(tmp_path) == []
    if existing:
        assert (out / "weights.safetensors").read_bytes() == before
    else:
        assert not out.exists()


def test_export_model_of_a_classification_run_is_one_line(request, tmp_path, capsys) -> None:
    prepared = request.getfixturevalue("textcls_prepared")
    run = tmp_path / "cls"
    assert train_main(["classify", "--data", str(prepared), *CLASSIFY_TINY, "--epochs", "1", "-q", "--out",
                       str(run)]) == 0
    capsys.readouterr()
    assert train_main(["export-model", "--run", str(run), "--out", str(tmp_path / "model")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"train: error: {run}: a text classification run; export-model writes retrieval models only "
        "(evaluate it with `train evaluate --run`, predict with `train predict`)")
    assert not (tmp_path / "model").exists()


def test_a_full_disk_while_converting_checkpoints_says_so(tiny_chain_run, tmp_path, capsys,
                                                          monkeypatch) -> None:
    import shutil
    from contextlib import contextmanager

    run = Path(shutil.copytree(tiny_chain_run, tmp_path / "old"))
    for name in ("best.pt", "last.pt"):
        path = run / "checkpoints" / name
        torch.save(legacy_copy(load_checkpoint(path)), path)
    real, opened = checkpoint.atomic_file, []

    @contextmanager
    def atomic_file(path, mode="wb"):
        opened.append(path)
        with real(path, mode) as fh:
            yield fh if len(opened) < 2 else FullDisk(fh, 4096)  # best.pt converts, last.pt finds no room

    monkeypatch.setattr(checkpoint, "atomic_file", atomic_file)
    capsys.readouterr()
    assert train_main(["convert-checkpoints", "--run", str(run)]) == 2
    last = run / "checkpoints" / "last.pt"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"train: error: {last}: could not write the checkpoint (no space left on the device: free space "
        "there (or write elsewhere) and run again); the previous checkpoint, if any, is unchanged (best.pt "
        "converted, the others unchanged: run convert-checkpoints again to convert them)")
    assert load_checkpoint(run / "checkpoints" / "best.pt")["format"] == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.pt", "last.pt"]
