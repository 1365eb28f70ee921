"""Every ``from PACKAGE import NAME`` of the project (module level or inside a function, in the packages,
``bench/`` and ``tests/``) names something that exists: a module moved or a name renamed without updating
a lazy import would otherwise only fail when that code path runs."""

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
