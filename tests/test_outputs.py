"""The output-path rules (vsecore.outputs), the one-line disk errors and SIGTERM of run_cli, and the
removal of dead writers' temporaries (vsecore.io.atomic_file)."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vsecore.errors import UserError, resume_hint, run_cli
from vsecore.io import _host_tag, atomic_file
from vsecore.outputs import (
    PREPARED,
    RUN,
    STORE,
    artifact_kind,
    check_output_file,
    check_output_folder,
    zarr_foreign_entries,
)


def _artifacts(tmp_path: Path) -> dict[str, Path]:
    data = tmp_path / "data"
    data.mkdir()
    (data / ".vse-prepared").write_text("")
    (data / "dataset.json").write_text("{}")
    store = tmp_path / "s.zarr"
    store.mkdir()
    (store / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    return {"data": data, "store": store, "run": run}


def test_artifacts_are_recognised_by_their_markers(tmp_path: Path) -> None:
    a = _artifacts(tmp_path)
    assert [artifact_kind(a[k]) for k in ("data", "store", "run")] == [PREPARED, STORE, RUN]
    assert artifact_kind(tmp_path) is None and artifact_kind(a["data"] / "dataset.json") is None


@pytest.mark.parametrize("target, inputs, owner, expected", [
    ("data/dataset.json", ["data"], None, "is an input"),
    ("data/new.h5", [], None, "inside the prepared dataset"),
    ("s.zarr/zarr.json", [], None, "inside the feature store"),
    ("run/checkpoints/best.pt", [], None, "inside the run directory"),
    ("a.npy", ["a.npy"], None, "is an input"),
    ("data", [], None, "is a folder"),
    ("/", [], None, "root"),
    ("old.json", [], None, "exists; add --overwrite"),
])
def test_output_files_never_replace_inputs_or_artifacts(tmp_path: Path, target: str, inputs: list[str],
                                                        owner: str | None, expected: str) -> None:
    _artifacts(tmp_path)
    (tmp_path / "a.npy").write_bytes(b"x")
    (tmp_path / "old.json").write_text("mine")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    path = target if target == "/" else tmp_path / target
    with pytest.raises(UserError, match=expected):
        check_output_file(path, inputs=[tmp_path / i for i in inputs], owner=owner)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_an_artifacts_own_writer_and_overwrite_are_allowed(tmp_path: Path) -> None:
    a = _artifacts(tmp_path)
    check_output_file(a["run"] / "eval" / "ranks.csv", owner=a["run"])
    (tmp_path / "old.json").write_text("mine")
    check_output_file(tmp_path / "old.json", overwrite=True)
    # a symlink into an artifact is judged by where it points
    (tmp_path / "link").symlink_to(a["data"])
    with pytest.raises(UserError, match="inside the prepared dataset"):
        check_output_file(tmp_path / "link" / "x.json")


def test_output_folders_keep_other_files_and_name_what_they_would_replace(tmp_path: Path) -> None:
    out = tmp_path / "e"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    check_output_folder(out, ["test_img.npy", "test_cap.npy"])
    (out / "test_img.npy").write_bytes(b"mine")
    with pytest.raises(UserError, match="already holds test_img.npy; add --overwrite"):
        check_output_folder(out, ["test_img.npy", "test_cap.npy"])
    check_output_folder(out, ["test_img.npy"], overwrite=True)
    with pytest.raises(UserError, match="not a folder"):
        check_output_folder(out / "notes.txt", ["x"])


def test_an_output_folder_is_no_dangling_link(tmp_path: Path) -> None:
    """issue 41.5: a writer given a symbolic link to nowhere made its folder beside the link and then failed
    renaming it over the link (a NotADirectoryError traceback); now one line, and a link to a folder is
    judged by the folder, as before."""
    (tmp_path / "o.zarr").symlink_to("/nonexistent/o.zarr")
    with pytest.raises(UserError, match=r"^--out .*o\.zarr: is a symbolic link to /nonexistent/o\.zarr, "
                                        r"which does not exist; remove the link or give another folder$"):
        check_output_folder(tmp_path / "o.zarr", [])
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert check_output_folder(tmp_path / "link", []) == tmp_path / "link"


def test_a_zarr_groups_foreign_entries_are_what_its_writer_does_not_make(tmp_path: Path) -> None:
    """The files of a Zarr v3 group follow from its arrays (metadata, chunk trees, Zarr's own write
    temporaries); anything else, at any depth, is the user's (a writer replacing the group refuses)."""
    group = tmp_path / "s.zarr"
    for made in ("zarr.json", "zarr.0123456789abcdef0123456789abcdef.partial", ".write-probe-12",
                 "imgid/zarr.json", "imgid/c/0", "imgid/c/1", "fne/zarr.json", "fne/raw/zarr.json",
                 "fne/raw/c/0/0", "fne/raw/c/0/1.0123456789abcdef0123456789abcdef.partial"):
        (group / made).parent.mkdir(parents=True, exist_ok=True)
        (group / made).write_text("")
    probe = re.compile(r"\.write-probe-\d+")
    assert zarr_foreign_entries(group, ["imgid", "fne/raw", "fne/mean"], beside=probe) == []
    for mine in ("NOTES.txt", "imgid/notes", "fne/raw/c/0/x.npy", "fne/raw/c/old/0", "fne/extra/zarr.json",
                 "global/zarr.json"):
        (group / mine).parent.mkdir(parents=True, exist_ok=True)
        (group / mine).write_text("mine")
    (group / "imgid" / "c" / "2").symlink_to(group / "imgid" / "c" / "0")
    assert zarr_foreign_entries(group, ["imgid", "fne/raw", "fne/mean"], beside=probe) == [
        "NOTES.txt", "fne/extra", "fne/raw/c/0/x.npy", "fne/raw/c/old", "global", "imgid/c/2", "imgid/notes"]
    assert ".write-probe-12" in zarr_foreign_entries(group, ["imgid", "fne/raw"])


def _raises(exc: BaseException):
    def main(argv):
        with resume_hint(lambda: "3 blocks kept: re-run to resume"):
            raise exc
    return main


@pytest.mark.parametrize("err, text", [(errno.ENOSPC, "no space left"), (errno.EROFS, "read-only"),
                                       (errno.EACCES, "permission denied")])
def test_disk_errors_are_one_line_with_what_was_kept(err: int, text: str, capsys) -> None:
    assert run_cli(_raises(OSError(err, os.strerror(err), "/x/y.npy")), [], "prog") == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and line.startswith("prog: error: /x/y.npy: " + text)
    assert line.rstrip().endswith("(3 blocks kept: re-run to resume)")


def test_other_os_errors_keep_their_traceback() -> None:
    with pytest.raises(OSError):
        run_cli(_raises(OSError(errno.ENOENT, "gone", "/x")), [], "prog")


def test_sigterm_runs_cleanups_and_is_one_line(tmp_path: Path) -> None:
    code = f"""
import os, signal, sys
from vsecore.errors import run_cli
from vsecore.io import atomic_file
def main(argv):
    with atomic_file({str(tmp_path / 'out.bin')!r}) as fh:
        fh.write(b'x' * 10)
        os.kill(os.getpid(), signal.SIGTERM)
        fh.write(b'never')
sys.exit(run_cli(main, [], 'prog'))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.returncode == 143 and proc.stderr == "prog: terminated\n"
    assert list(tmp_path.iterdir()) == []  # no temporary left, no output


def test_the_next_writer_removes_temporaries_of_dead_writers(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".x.npy.{_host_tag()}-{dead.pid}.abcd1234.tmp"
    live = tmp_path / f".x.npy.{_host_tag()}-{os.getpid()}.abcd1234.tmp"
    foreign = tmp_path / f".x.npy.otherhost-{dead.pid}.abcd1234.tmp"
    for p in (stale, live, foreign):
        p.write_text("partial")
    with atomic_file(tmp_path / "x.npy", "w") as fh:
        fh.write("ok")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, foreign.name, "x.npy"])
    assert signal.SIGTERM  # the module is used by the test above
