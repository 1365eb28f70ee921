"""Shared atomic-IO helpers: the exclusive writer lock, and the permissions of atomic outputs."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vsecore.errors import UserError
from vsecore.io import atomic_directory, atomic_file, exclusive_lock, lock_path, write_json_atomic


def test_second_writer_refused_and_stale_lock_taken_over(tmp_path):
    target = tmp_path / "store.zarr"
    code = ("import sys,time; from vsecore.io import exclusive_lock\n"
            f"with exclusive_lock({str(target)!r}):\n    print('held', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(UserError, match=f"pid {proc.pid}"):
        with exclusive_lock(target):
            pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert lock_path(target).exists()  # stale file left by the killed holder
    with exclusive_lock(target) as p:
        assert p == lock_path(target)
    assert not lock_path(target).exists()


def test_atomic_outputs_get_the_permissions_of_ordinary_ones(tmp_path):
    """Files and folders written atomically are as readable as ``open`` / ``mkdir`` would make them
    (a prepared dataset or a gallery page shared with others), not the temporary files' 0600/0700."""
    import os

    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "a.json", {"x": 1})
        with atomic_file(tmp_path / "b.bin") as fh:
            fh.write(b"x")
        with atomic_directory(tmp_path / "d") as d:
            (d / "f").write_text("x")
        os.umask(0o077)
        write_json_atomic(tmp_path / "private.json", {})
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.bin").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "private.json").stat().st_mode & 0o777 == 0o600


def test_planted_symlink_or_directory_at_the_lock_path_is_refused(tmp_path, monkeypatch):
    import errno
    import os

    target = tmp_path / "store.zarr"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    lock_path(target).symlink_to(victim)
    with pytest.raises(UserError, match="is a symlink, not a regular file"):
        with exclusive_lock(target):
            pass
    assert victim.read_text() == "precious" and lock_path(target).is_symlink()
    lock_path(target).unlink()
    lock_path(target).symlink_to(tmp_path / "absent")  # dangling: O_CREAT would create it
    with pytest.raises(UserError, match="symlink"):
        with exclusive_lock(target):
            pass
    assert not (tmp_path / "absent").exists()
    lock_path(target).unlink()
    lock_path(target).mkdir()
    with pytest.raises(UserError, match="is a directory, not a regular file"):
        with exclusive_lock(target):
            pass
    lock_path(target).rmdir()

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(UserError, match="cannot create the lock file .*Read-only file system"):
        with exclusive_lock(target):
            pass


@pytest.mark.parametrize("swap", [True, False])
def test_a_replaced_directory_is_never_missing(tmp_path, monkeypatch, swap):
    """An existing folder is swapped with the new one in one step (renameat2 RENAME_EXCHANGE), never
    renamed aside first; where the system cannot swap, the two renames still replace it. Either way nothing
    is left beside it."""
    import os

    from vsecore import io as vio

    final = tmp_path / "d"
    with atomic_directory(final) as d:
        (d / "old").write_text("1")
    real_replace = os.replace

    def replace(src, dst):
        assert not (swap and Path(dst) == final.with_name(f".d.old-{os.getpid()}")), "renamed aside"
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    if not swap:
        monkeypatch.setattr(vio, "exchange", lambda a, b: False)
    else:
        (tmp_path / "x").mkdir()
        (tmp_path / "y").mkdir()
        if not vio.exchange(tmp_path / "x", tmp_path / "y"):
            pytest.skip("this file system cannot swap two paths (renameat2 RENAME_EXCHANGE)")
        (tmp_path / "x").rmdir()
        (tmp_path / "y").rmdir()
    with atomic_directory(final) as d:
        (d / "new").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
