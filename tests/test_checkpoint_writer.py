"""Checkpoints written off the step's critical path (issue 44): ``train.engine.checkpoint_writer``.

The trainer's own runs (resume after a kill, a full disk, SIGINT during a write) are in
``test_checkpoint_safety.py`` and ``test_faults_resume.py``; here the writer alone, with writes that wait
on events, so every ordering is forced rather than timed.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from train.engine.checkpoint_writer import CheckpointWriter, host_copy
from train.run.checkpoint import load_checkpoint, save_checkpoint

#: how long a test waits for a thread that should finish at once
TIMEOUT_S = 30


class GatedWrites:
    """A ``write(path, state)`` that records what it was given and waits for its gate to open."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.written: list[tuple[str, Any]] = []

    def gate(self, name: str) -> threading.Event:
        self.started.setdefault(name, threading.Event())
        return self.gates.setdefault(name, threading.Event())

    def __call__(self, path: Path, state: dict[str, Any]) -> None:
        self.gate(path.name)
        self.started[path.name].set()
        assert self.gates[path.name].wait(TIMEOUT_S)
        if state.get("fail"):
            raise OSError(28, "No space left on device")
        self.written.append((path.name, state))


def test_the_loop_goes_on_while_a_checkpoint_is_written_and_later_changes_do_not_reach_it(tmp_path) -> None:
    writes = GatedWrites()
    writer = CheckpointWriter()
    weights = torch.zeros(3)
    writer.submit(writes, tmp_path / "a.pt", {"model": {"w": weights}, "epoch": 1})
    assert writes.gate("a.pt") is not None and writes.started["a.pt"].wait(TIMEOUT_S)  # being written...
    weights += 5  # ...while the loop takes its next steps
    assert writes.written == []
    writes.gates["a.pt"].set()
    writer.wait()
    ((name, state),) = writes.written
    assert name == "a.pt" and state["epoch"] == 1 and torch.equal(state["model"]["w"], torch.zeros(3))
    assert writer.seconds > 0 and "s in the background" in writer.since_last_report()


def test_writes_land_in_order_with_at_most_one_waiting(tmp_path) -> None:
    writes = GatedWrites()
    writer = CheckpointWriter()
    writer.submit(writes, tmp_path / "best.pt", {"n": 1})
    writer.submit(writes, tmp_path / "last.pt", {"n": 2})  # waits behind best.pt; submit returns at once
    assert writes.started["best.pt"].wait(TIMEOUT_S) and not writes.gate("last.pt").is_set()
    third = threading.Thread(target=writer.submit, args=(writes, tmp_path / "next.pt", {"n": 3}))
    third.start()
    third.join(0.2)
    assert third.is_alive()  # a third checkpoint waits for the oldest
    writes.gates["best.pt"].set()
    third.join(TIMEOUT_S)
    assert not third.is_alive()
    writes.gate("next.pt").set()
    writes.gates["last.pt"].set()
    writer.wait()
    assert [name for name, _ in writes.written] == ["best.pt", "last.pt", "next.pt"]


def test_a_failed_write_is_raised_in_the_loop_and_no_later_write_is_made(tmp_path) -> None:
    writes = GatedWrites()
    writer = CheckpointWriter()
    writer.submit(writes, tmp_path / "best.pt", {"fail": True})
    writer.submit(writes, tmp_path / "last.pt", {"n": 2})
    writes.gate("best.pt").set()
    writes.gate("last.pt").set()
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    assert writes.written == []
    writer.wait()  # raised once


def test_a_real_checkpoint_written_in_the_background_reads_back(tmp_path) -> None:
    writer = CheckpointWriter()
    state = {"model": {"w": torch.arange(4.0)}, "epoch": 1, "history": [{"loss": 1.5}]}
    writer.submit(save_checkpoint, tmp_path / "last.pt", state)
    writer.wait()
    loaded = load_checkpoint(tmp_path / "last.pt")
    assert torch.equal(loaded["model"]["w"], torch.arange(4.0)) and loaded["history"] == [{"loss": 1.5}]
    copied, event = host_copy(state)
    assert event is None and copied["model"]["w"] is not state["model"]["w"]  # on the CPU: a copy, no event
