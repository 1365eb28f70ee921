"""Every ``from PACKAGE import NAME`` of the project (module level or inside a function, in the packages,
``bench/`` and ``tests/``) names something that exists: a module moved or a name renamed without updating
a lazy import would otherwise only fail when that code path runs. And the packages import only down the
stages (``docs/ARCHITECTURE.md``)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("features", "pipelines", "prep", "train", "vsecore")


def test_every_project_import_resolves() -> None:
    missing = []
    files = [p for d in (*PACKAGES, "bench", "tests") for p in sorted((ROOT / d).rglob("*.py"))]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] in PACKAGES):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            try:
                module = importlib.import_module(node.module)
            except ImportError as exc:
                missing.append(f"{where}: {node.module} ({exc})")
                continue
            for alias in node.names:
                if alias.name != "*" and not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        missing.append(f"{where}: {node.module}.{alias.name}")
    assert not missing, "\n".join(missing)


#: what each package may import of the others: the stages in order, ``vsecore`` below them all
MAY_IMPORT = {"vsecore": {"vsecore"}, "prep": {"vsecore", "prep"},
              "features": {"vsecore", "prep", "features"}, "train": {"vsecore", "prep", "features", "train"},
              "pipelines": set(PACKAGES)}
#: the command modules, which read ``--pipeline NAME`` (and ``train compare``, whose entries may name
#: pipelines): they alone may import ``pipelines``; a stage's library never does
COMMAND_MODULES = {"prep/cli.py", "features/cli.py", "train/fit_cli.py", "train/fit_options.py",
                   "train/classify_cli.py", "train/evaluate/cli.py", "train/run_args.py", "train/compare.py"}


def _imported_packages(path: Path) -> set[tuple[str, int]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        found |= {(name.split(".")[0], node.lineno) for name in names if name.split(".")[0] in PACKAGES}
    return found


def test_packages_import_only_down_the_stages() -> None:
    upward = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            allowed = MAY_IMPORT[package] | ({"pipelines"} if name in COMMAND_MODULES else set())
            upward += [f"{name}:{line} imports {other}" for other, line in _imported_packages(path)
                       if other not in allowed]
    assert not upward, "\n".join(sorted(upward))
