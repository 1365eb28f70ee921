"""Progress without a terminal (:class:`vsecore.console.PlainProgress`): rates in the unit that reads, one
line per event, the 100% line once and with the last postfix (issue 43.6)."""

from __future__ import annotations

import re

import pytest

from vsecore import console
from vsecore.console import PlainProgress


def _line(done: int, seconds: float, total: int | None = 100, unit: str = "batch") -> str:
    """The line of a progress at ``done`` after ``seconds``."""
    bar = PlainProgress(total=total, desc="epoch 1/3", unit=unit, interval=1e9)
    bar.n = done
    return bar._line(bar.t0 + seconds)


@pytest.mark.parametrize(("done", "seconds", "rate"), [
    (10, 25.0, "2.50 s/batch"),    # 0.4 batch/s: was "0.4 batch/s"
    (1, 300.0, "300 s/batch"),     # 0.0033 batch/s: was "0.0 batch/s"
    (3, 100.0, "33.3 s/batch"),
    (1, 1.0, "1.0 batch/s"),
    (25, 10.0, "2.5 batch/s"),
    (2000, 10.0, "200 batch/s"),
    (0, 10.0, "? batch/s"),
])
def test_rates_read_in_the_unit_that_fits(done: int, seconds: float, rate: str) -> None:
    line = _line(done, seconds)
    assert f", {rate}, elapsed" in line, line
    assert f": {done:,} img, {rate.replace('batch', 'img')}" in _line(done, seconds, total=None, unit="img")


def test_the_percentage_is_100_only_at_the_end() -> None:
    assert "999/1,000 batch (99%)" in _line(999, 10.0, total=1000)
    assert "1,000/1,000 batch (100%)" in _line(1000, 10.0, total=1000)


def _epoch(capsys: pytest.CaptureFixture[str], steps: int, interval: float) -> list[str]:
    """The lines of one epoch driven as the trainer drives its bar (``train.engine.trainer``): each step's
    loss is added one step late, after the next update, and the last one after the last update."""
    bar = PlainProgress(total=steps, desc="epoch 1/1", unit="batch", interval=interval)
    bar.t0 -= 5.0  # five seconds in: past the second a final line needs
    pending = None
    for step in range(1, steps + 1):
        if pending is not None:
            bar.set_postfix(loss=f"{pending:.4f}", refresh=False)
        pending = 1.0 / step
        bar.update(1)
    bar.set_postfix(loss=f"{pending:.4f}", refresh=False)
    bar.close()
    bar.close()
    return capsys.readouterr().out.splitlines()


def test_the_end_of_an_epoch_is_one_line_with_its_last_loss(capsys: pytest.CaptureFixture[str]) -> None:
    """A line after every step (``VSE_PROGRESS_SECONDS=0``): before, the last update printed ``100%`` with
    the loss of the step before, and closing printed ``100%`` again with the last one."""
    lines = _epoch(capsys, steps=4, interval=0.0)
    assert [re.search(r"\((\d+)%\)", line).group(1) for line in lines] == ["25", "50", "75", "100"]
    assert lines[-1].endswith("loss 0.2500") and "4/4 batch" in lines[-1]
    # every 30 s (nothing printed on the way): the one final line after the second it took
    assert _epoch(capsys, steps=4, interval=30.0) == [lines[-1]]


def test_no_line_is_printed_twice(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a total, a close right after a printed line does not repeat it; a new postfix is a new line."""
    bar = PlainProgress(desc="reading", unit="row", interval=0.0)
    bar.update(3)
    bar.close()
    assert len(capsys.readouterr().out.splitlines()) == 1
    bar = PlainProgress(desc="reading", unit="row", interval=0.0)
    bar.update(3)
    bar.set_postfix_str("done")
    bar.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].endswith("done")


def test_quick_work_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """Under a second and no line on the way: no line at all (a progress that was never needed)."""
    for _ in console.progress(range(5), desc="quick", unit="it"):
        pass
    assert capsys.readouterr().out == ""
