"""``train report RUN...``: runs side by side (settings, size, best epoch, test metrics) and a plot.

Reads only what runs wrote (``config.json``, ``metrics.jsonl``, ``eval/test.json``), so it works
on runs of any family, finished or not (a run without a test evaluation shows its best validation
rsum and no test numbers). Every file is validated (one-line errors), and the checkpoints are opened
with the pickle-free loader, so a shared run whose checkpoint would need pickle is refused here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from train.config.run import read_config
from train.run.checkpoint import load_checkpoint
from train.run.layout import RunDir
from vsecore.errors import UserError
from vsecore.io import MAX_TEXT_BYTES
from vsecore.jsonfile import parse_json, read_json
from vsecore.lines import open_lines

#: the settings that tell runs of one family apart in the table
DESCRIBING_KEYS = ("version", "p", "arch", "variant", "hops", "kind", "d", "measure", "loss", "batch_size")


def run_summary(run_dir: str | Path, protocol: str | None = None) -> dict[str, Any]:
    """One run's row: name, family, settings, parameters, epochs, best validation rsum, test metrics.

    ``protocol``: which test protocol to report (default: the first one the run evaluated).
    """
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    if config.get("task") == "classify":
        raise UserError(f"{run_dir}: a text classification run; `train report` compares retrieval runs "
                        "(see its eval/test.json, or `train evaluate --run`)")
    check_checkpoints(run_dir)
    settings = config.get("settings", {})
    metrics_file = RunDir(run_dir).metrics
    history = read_history(metrics_file) if metrics_file.is_file() else []
    row: dict[str, Any] = {
        "name": run_dir.name, "run": str(run_dir), "family": config.get("family", settings.get("family")),
        "settings": {k: settings[k] for k in DESCRIBING_KEYS if k in settings},
        "parameters": int(config.get("parameters", {}).get("total", 0)),
        "epochs": len(history),
        "best_epoch": max(history, key=lambda r: (r["rsum"], -r["epoch"]))["epoch"] if history else None,
        "best_val_rsum": max((r["rsum"] for r in history), default=None),
        "test": None,
    }
    test_file = RunDir(run_dir).test_eval
    if test_file.is_file():
        protocols = read_json(test_file, "a test evaluation", kind=dict).get("protocols")
        if not isinstance(protocols, dict) or not protocols:
            raise UserError(f"{test_file}: not a test evaluation (no protocols)")
        name = protocol or next(iter(protocols))
        if name not in protocols:
            raise UserError(f"{test_file}: no protocol '{name}' (it has {', '.join(protocols)})")
        result = protocols[name]
        directions_ok = isinstance(result, dict) and all(
            isinstance(result.get(d), dict) and _number(result[d].get("r1")) for d in ("i2t", "t2i"))
        if not (directions_ok and _number(result.get("rsum"))):
            raise UserError(f"{test_file}: protocol '{name}' lacks numeric rsum, i2t.r1 and t2i.r1")
        row["test"] = {"protocol": name, **result}
    return row


def check_checkpoints(run_dir: Path) -> None:
    """Open each ``checkpoints/*.pt`` with the pickle-free loader, tensors memory-mapped (cheap): a run
    whose checkpoints would need pickle (a foreign or tampered file) is reported before anyone uses it."""
    for path in sorted(RunDir(run_dir).checkpoints.glob("*.pt")):
        load_checkpoint(path, mmap=True)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_history(path: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl``: one object per epoch with an integer ``epoch`` and a numeric ``rsum``, read a line
    at a time with the bounds of every line-oriented input (:func:`vsecore.lines.open_lines`)."""
    history = []
    with open_lines(path, "a run's metrics.jsonl", most=MAX_TEXT_BYTES) as lines:
        for n, line in enumerate(lines, 1):
            record = parse_json(line, f"{path}: line {n}")
            if not (isinstance(record, dict) and isinstance(record.get("epoch"), int)
                    and _number(record.get("rsum"))):
                raise UserError(f"{path}: line {n} is not an epoch record (integer epoch, numeric rsum)")
            history.append(record)
    return history


def format_summary(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table of :func:`run_summary` rows."""
    head = (f"{'run':<24} {'family':<7} {'settings':<34} {'params':>11} {'ep(best)':>9} {'val rsum':>9} "
            f"{'protocol':>8} {'i2t R@1':>8} {'t2i R@1':>8} {'rsum':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        settings = " ".join(f"{k}={v}" for k, v in r["settings"].items() if k not in ("measure", "loss",
                                                                                   "batch_size"))
        t = r["test"]
        test = (f"{t['protocol']:>8} {t['i2t']['r1']:>8.1f} {t['t2i']['r1']:>8.1f} {t['rsum']:>7.1f}" if t
                else f"{'-':>8} {'-':>8} {'-':>8} {'-':>7}")
        val = f"{r['best_val_rsum']:.1f}" if r["best_val_rsum"] is not None else "-"
        lines.append(f"{r['name'][:24]:<24} {r['family']:<7} {settings[:34]:<34} {r['parameters']:>11,} "
                     f"{r['epochs']:>4}({r['best_epoch'] or '-'}) {val:>9} {test}")
    return "\n".join(lines)
