"""Shared atomic-IO helpers: the exclusive writer lock."""

import signal
import subprocess
import sys

import pytest

from prep.errors import UserError
from prep.io import exclusive_lock, lock_path


def test_second_writer_refused_and_stale_lock_taken_over(tmp_path):
    target = tmp_path / "store.zarr"
    code = ("import sys,time; from prep.io import exclusive_lock\n"
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
