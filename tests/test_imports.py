"""Every ``from PACKAGE import NAME`` of the project (module level or inside a function, in the packages,
``bench/`` and ``tests/``) names something that exists: a module moved or a name renamed without updating
a lazy import would otherwise only fail when that code path runs. And every module imports only down the
packages and layers of ``docs/ARCHITECTURE.md`` (:data:`PACKAGE_ORDER`, :data:`LAYERS`), with no cycle,
counting imports inside functions; and the stage commands start without torch or the later stages."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: ``vse`` (the Python API, another engineer's) is the top package, like the orchestrator: it may import every
#: stage and ``pipelines``; nothing imports it
PACKAGES = ("features", "pipelines", "prep", "train", "vsecore", "vse")


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


# -- the layers --------------------------------------------------------------------------------------------
#: the packages, bottom first (docs/ARCHITECTURE.md): vsecore <- prep <- features <- train <- pipelines
#: <- vse. A module imports its own package or a lower one; only the orchestrator (pipelines) and the Python
#: API (vse, one layer: all of it is on top, like a command) import every stage.
PACKAGE_ORDER = ("vsecore", "prep", "features", "train", "pipelines", "vse")
#: inside each package, its layers, bottom first: a module imports only modules of its own group or of a lower
#: layer of its package. A layer of several groups holds siblings, which never import each other
#: (retrieval and classification). A module belongs to the group of its longest matching prefix:
#: ``train.run.layout`` and ``train.run.checkpoint`` (the files of a run directory, which the trainer writes)
#: sit below the engine, ``train.config`` (a run's config.json and the train stage's pipeline sections, which
#: rebuild settings and models) above the models; the commands on top of their package.
LAYERS: dict[str, tuple[tuple[str, ...], ...]] = {
    "vsecore": (("vsecore",),),
    "prep": (("prep",), ("prep.cli",)),
    "features": (("features",), ("features.cli",)),
    "train": (
        ("train",),
        ("train.run.layout", "train.run.checkpoint"),
        ("train.engine",),
        ("train.models",),
        ("train.config",),
        ("train.retrieval", "train.classification"),
        ("train.cli",),
    ),
    "pipelines": (("pipelines",), ("pipelines.schema",), ("pipelines.runner",), ("pipelines.cli",)),
    "vse": (("vse",),),
}
#: modules of one group that are one concern across two prefixes: the run-directory files sit together, a
#: stage's entry point and its command module too
SAME_GROUP = {"train.run.checkpoint": "train.run.layout", "features.entry": "features.cli"}
#: the console commands of ``pyproject.toml``'s ``[project.scripts]`` (``prep.cli``, ``features.entry``,
#: ``train.cli``): each the top layer of its package. The entry points ``python -m PACKAGE``
#: (``*.__main__``) are the top of their package: one may import any module of it and of lower packages
#: (``train pipeline`` reaches ``train`` through an entry-point group, not an import); nothing imports one.
SCRIPTS = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
CONSOLE_SCRIPTS = tuple(re.findall(r'^\w+ = "([\w.]+):\w+"', SCRIPTS, re.MULTILINE))
#: the only function-level imports of project modules train/ and pipelines/ may hold: each keeps a start-up
#: light (a command's library, torch, a network, a stage's library in the runner) and says so on its line
STARTUP_REASON = "start-up"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for d in PACKAGES for p in sorted((ROOT / d).rglob("*.py"))}


def _package(module: str) -> str:
    return module.split(".")[0]


def is_entry_point(module: str) -> bool:
    """``python -m PACKAGE``: a ``__main__`` module."""
    return module.endswith(".__main__")


def _group(module: str) -> str:
    if module in SAME_GROUP:
        return SAME_GROUP[module]
    layers = LAYERS[_package(module)]
    prefixes = [p for layer in layers for p in layer if module == p or module.startswith(p + ".")]
    return max(prefixes, key=len)


def _layer(module: str) -> int:
    group = _group(module)
    return next(i for i, layer in enumerate(LAYERS[_package(module)]) if group in layer)


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


class _Imports(ast.NodeVisitor):
    """Every project import of a module: ``(imported module, line, inside a function)``; what an
    ``if TYPE_CHECKING:`` block imports only annotates, so it is no import."""

    def __init__(self) -> None:
        self.found: list[tuple[str, int, bool]] = []
        self.depth = 0

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Import(self, node: ast.Import) -> None:
        self._add([a.name for a in node.names], node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            # ``from PACKAGE import submodule`` runs the package first: an edge to both
            self._add([node.module, *(f"{node.module}.{a.name}" for a in node.names)], node.lineno)

    def _add(self, names: list[str], line: int) -> None:
        for name in names:
            if name.split(".")[0] in PACKAGES and (module := _resolve(name)):
                self.found.append((module, line, self.depth > 0))


def _edges() -> dict[str, list[tuple[str, int, bool]]]:
    """module -> its imports of other project modules (module level and inside functions)."""
    edges = {}
    for module, path in MODULES.items():
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        edges[module] = sorted({(m, line, f) for m, line, f in visitor.found if m != module})
    return edges


EDGES = _edges()


def _wrong_way(module: str, other: str) -> str | None:
    """Why ``module`` may not import ``other`` (None when it may)."""
    if is_entry_point(other):
        return "an entry point"
    mine, theirs = PACKAGE_ORDER.index(_package(module)), PACKAGE_ORDER.index(_package(other))
    if theirs != mine:
        return "a higher package" if theirs > mine else None
    if is_entry_point(module):  # the top of its package
        return None
    if _layer(other) > _layer(module):
        return "a higher layer"
    if _layer(other) == _layer(module) and _group(other) != _group(module):
        return "a sibling"
    return None


def _upward(edges: dict[str, list[tuple[str, int, bool]]]) -> list[str]:
    bad = []
    for module, imports in edges.items():
        for other, line, inside in imports:
            if why := _wrong_way(module, other):
                where = "inside a function" if inside else "at module level"
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} ({_group(module)}) imports "
                           f"{other} ({_group(other)}) {where}: {why}")
    return bad


def _cycles(edges: dict[str, list[tuple[str, int, bool]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _, _ in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def _reachable(edges: dict[str, list[tuple[str, int, bool]]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for other, _, _ in edges.get(todo.pop(), []):
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


def test_every_import_goes_down_the_packages_and_the_layers() -> None:
    """Every import, at module level or inside a function, goes to a lower package (vsecore <- prep <-
    features <- train <- pipelines), or to the module's own group or a lower layer of its package; siblings
    never import each other; ``python -m PACKAGE`` imports only its own package and lower ones."""
    assert not (bad := _upward(EDGES)), "\n".join(bad)


def test_no_stage_imports_the_orchestrator() -> None:
    """No module of a stage, nor vsecore, imports ``pipelines`` (the orchestrator) in any way: a stage command
    given ``--pipeline NAME`` reads its section through ``vsecore.pipelines_file``."""
    bad = [f"{m} -> {o}" for m, imports in EDGES.items() for o, _, _ in imports
           if _package(o) == "pipelines" and _package(m) != "pipelines" and not is_entry_point(m)]
    assert not bad, "\n".join(bad)


def test_no_import_cycle_anywhere() -> None:
    """No two modules reach each other, counting the imports inside functions."""
    assert not (cycles := _cycles(EDGES)), "\n".join(" <-> ".join(c) for c in cycles)


#: the command modules: each package's top layer, and the runner (only the pipeline command calls it)
COMMANDS = {m for m in MODULES if _layer(m) == len(LAYERS[_package(m)]) - 1 and _package(m) != "vsecore"
            or is_entry_point(m)} | {"pipelines.runner"}


def test_no_library_reaches_a_command_indirectly() -> None:
    """No library module reaches a command module or the pipeline runner through any chain of imports:
    nothing imports ``train.cli`` but ``python -m train``, and the runner is reached only from
    ``pipelines.cli``."""
    bad = [f"{m} reaches {sorted(_reachable(EDGES, m) & COMMANDS)}" for m in MODULES
           if m not in COMMANDS and _reachable(EDGES, m) & COMMANDS]
    assert not bad, "\n".join(bad)


def test_the_console_commands_are_command_modules() -> None:
    """Each console command of ``pyproject.toml`` is a command module: the top layer of its package."""
    assert CONSOLE_SCRIPTS and set(CONSOLE_SCRIPTS) <= COMMANDS, CONSOLE_SCRIPTS


def test_lazy_project_imports_keep_a_start_up_light() -> None:
    """A function-level import of a project module in ``train/`` or ``pipelines/`` only keeps a start-up
    light, and says so."""
    lazy = []
    for module, imports in EDGES.items():
        if _package(module) not in ("train", "pipelines"):
            continue
        lines = MODULES[module].read_text(encoding="utf-8").splitlines()
        lazy += [f"{MODULES[module].relative_to(ROOT)}:{line}: {other}" for other, line, inside in imports
                 if inside and STARTUP_REASON not in lines[line - 1] + lines[line - 2]]
    assert not lazy, "\n".join(lazy)


def test_the_layer_test_sees_a_wrong_import() -> None:
    """The checks above fail on an upward import (inside a package and across packages), a sibling import, a
    stage importing the orchestrator and a cycle."""
    edges = {m: list(imports) for m, imports in EDGES.items()}
    edges["train.engine.trainer"].append(("train.retrieval.validation", 1, True))
    edges["train.classification.fit"].append(("train.retrieval.fit", 1, False))
    edges["features.run"].append(("train.engine.settings", 1, True))
    edges["prep.cli"].append(("pipelines.schema", 1, True))
    edges["pipelines.runner"].append(("vse", 1, True))  # nothing imports the Python API
    assert len(_upward(edges)) == len(_upward(EDGES)) + 5
    assert _cycles(edges)


def test_test_files_share_helpers_through_helpers_or_fixtures() -> None:
    """A test file never imports another test file: what several of them build lives in ``helpers.py``
    or a ``conftest.py`` fixture (importing a test module re-registers its tests' fixtures and couples
    two files' test data)."""
    import ast

    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}:{node.lineno}: {n}" for n in names if n.split(".")[0].startswith("test_")
                      or n.startswith("tests.test_")]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("stage", ["prep", "features"])
def test_the_first_stages_start_without_torch_or_the_later_stages(stage: str) -> None:
    """``import prep.cli`` / ``import features.cli``, their ``--help`` and their settings (what a pipeline's
    section validates) load neither torch nor ``train`` nor ``pipelines``: a ``--pipeline`` section is read
    through ``vsecore.pipelines_file``, the extractors' declarations import no network."""
    import subprocess
    import sys

    settings = {"prep": "from prep.settings import PrepSection as s", "features": "from features.settings "
                "import features_settings_class as f\ns = f()"}[stage]
    code = (f"import sys\nimport {stage}.cli\n{settings}\n{stage}.cli.build_parser().format_help()\n"
            "loaded = {m.split('.')[0] for m in sys.modules}\n"
            "print(sorted(loaded & {'torch', 'torchvision', 'timm', 'train', 'pipelines'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
