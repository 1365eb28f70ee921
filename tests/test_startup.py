"""Issue 43.4: the ``train`` command answers ``--help`` and a bad option without importing torch (2-3 s on the
development machine): the commands' options are declared from the settings and the families' light
declarations, and a command imports its library, and torch, when it runs. Which modules load is checked
here; how long a start takes is ``bench/bench_startup.py``'s (a timed test would fail on a busy machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: what must answer without torch: the ``train`` console command's help, a family's, evaluate's, the
#: pipeline command's, and argument errors argparse reports
LIGHT = (["--help"], ["chain", "--help"], ["evaluate", "--help"], ["classify", "--help"],
         ["pipeline", "--help"], ["chain", "--bogus"], ["chain", "--d", "notanumber"],
         ["evaluate", "--protocol"])

PROBE = """
import contextlib, io, json, sys
from train.cli import main
loaded = {}
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code
    loaded[" ".join(argv)] = [code, sorted({m.split(".")[0] for m in sys.modules} & {"torch", "torchvision"})]
print(json.dumps(loaded))
"""


def test_help_and_argument_errors_import_no_torch() -> None:
    import json

    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(LIGHT)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout)
    for argv in LIGHT:
        code, heavy = loaded[" ".join(argv)]
        assert code == (0 if argv[-1] == "--help" else 2), (argv, code)
        assert heavy == [], f"train {' '.join(argv)} imported {heavy}"


def test_python_m_train_is_the_train_command() -> None:
    """``python -m train`` is the console command (``train.cli``), ``train pipeline`` included."""
    done = subprocess.run([sys.executable, "-m", "train", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "pipeline" in done.stdout and "evaluate" in done.stdout, done.stderr


def test_a_family_declaration_imports_no_torch() -> None:
    """Every built-in family's settings, defaults and spec rule load without torch; the spec builder imports
    the family's network module (and torch) only when called."""
    code = ("import sys\nfrom train.models import BUILTIN_FAMILIES\nfrom train.models.classifier import "
            "classify_settings_class\nclassify_settings_class()\nbefore = 'torch' in sys.modules\n"
            "from train.models.family import model_spec, train_settings\n"
            "model_spec(train_settings(family='chain', out='r'))\nprint(before, 'torch' in sys.modules, "
            "'train.models.chain_vse' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "True"]
