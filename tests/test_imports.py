"""Every ``from PACKAGE import NAME`` of the project (module level or inside a function, in the packages,
``bench/`` and ``tests/``) names something that exists: a module moved or a name renamed without updating
a lazy import would otherwise only fail when that code path runs. And every module imports only down the
layers of ``docs/ARCHITECTURE.md`` (:data:`LAYERS`), with no cycle, counting imports inside functions."""

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


# -- the layers --------------------------------------------------------------------------------------------
#: the layers of the project, bottom first (docs/ARCHITECTURE.md): a module imports only modules of its own
#: group or of a lower layer. A layer of several groups holds siblings, which never import each other
#: (retrieval and classification; the command modules of the three stages). A module belongs to the group
#: of its longest matching prefix: ``train.run.layout`` and ``train.run.checkpoint`` (the files of a run
#: directory, which the trainer writes) sit below the engine, the rest of ``train.run`` (config,
#: fingerprints, which rebuild settings and models) above the models.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("vsecore",),
    ("prep",),
    ("features",),
    ("train.run.layout", "train.run.checkpoint"),
    ("train.engine",),
    ("train.models",),
    ("train.run",),
    ("pipelines.schema",),
    ("train.retrieval", "train.classification"),
    ("pipelines",),
    ("prep.cli", "features.cli", "train.cli"),
    ("train",),
)
#: modules of one group that are one concern across two prefixes: the run-directory files sit together,
#: a stage's entry point and its command module too
SAME_GROUP = {"train.run.checkpoint": "train.run.layout", "features.entry": "features.cli",
              "features.__main__": "features.cli", "prep.__main__": "prep.cli", "train.__main__": "train"}
#: the only function-level imports of project modules train/ may hold: each keeps a start-up light and says
#: so on its line ("start-up")
STARTUP_REASON = "start-up"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for d in PACKAGES for p in sorted((ROOT / d).rglob("*.py"))}


def _group(module: str) -> str:
    if module in SAME_GROUP:
        return SAME_GROUP[module]
    prefixes = [p for layer in LAYERS for p in layer if module == p or module.startswith(p + ".")]
    return max(prefixes, key=len)


def _layer(module: str) -> int:
    group = _group(module)
    return next(i for i, layer in enumerate(LAYERS) if group in layer)


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
            self._add([f"{node.module}.{a.name}" for a in node.names], node.lineno)

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


def _upward(edges: dict[str, list[tuple[str, int, bool]]]) -> list[str]:
    bad = []
    for module, imports in edges.items():
        for other, line, _ in imports:
            up = _layer(other) > _layer(module)
            sibling = _layer(other) == _layer(module) and _group(other) != _group(module)
            if up or sibling:
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} ({_group(module)}) imports "
                           f"{other} ({_group(other)}): {'a higher layer' if up else 'a sibling'}")
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


def test_every_import_goes_down_the_layers() -> None:
    """Every import, at module level or inside a function, goes to the module's own group or a lower
    layer; siblings never import each other."""
    assert not (bad := _upward(EDGES)), "\n".join(bad)


def test_no_import_cycle_anywhere() -> None:
    """No two modules reach each other, counting the imports inside functions."""
    assert not (cycles := _cycles(EDGES)), "\n".join(" <-> ".join(c) for c in cycles)


def test_no_library_reaches_a_command_indirectly() -> None:
    """No library module reaches a command module or the pipeline runner through any chain of imports:
    nothing imports ``train.cli``, and the runner is reached only from ``train.cli.pipeline``."""
    commands = {m for m in MODULES if _layer(m) >= _layer("train.cli")} | {"pipelines.runner"}
    bad = [f"{m} reaches {sorted(_reachable(EDGES, m) & commands)}" for m in MODULES
           if m not in commands and _reachable(EDGES, m) & commands]
    assert not bad, "\n".join(bad)


def test_train_imports_project_modules_at_module_level() -> None:
    """A function-level import of a project module in ``train/`` only keeps a start-up light, and says so."""
    lazy = []
    for module, imports in EDGES.items():
        if not module.startswith("train"):
            continue
        lines = MODULES[module].read_text(encoding="utf-8").splitlines()
        lazy += [f"{MODULES[module].relative_to(ROOT)}:{line}: {other}" for other, line, inside in imports
                 if inside and STARTUP_REASON not in lines[line - 1] + lines[line - 2]]
    assert not lazy, "\n".join(lazy)


def test_the_layer_test_sees_an_upward_import() -> None:
    """The checks above fail on an upward import, a sibling import, a cycle and a lazy import."""
    edges = {m: list(imports) for m, imports in EDGES.items()}
    edges["train.engine.trainer"].append(("train.retrieval.validation", 1, True))
    edges["train.classification.fit"].append(("train.retrieval.fit", 1, False))
    assert len(_upward(edges)) == len(_upward(EDGES)) + 2
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


def test_the_features_command_starts_without_torch_or_train() -> None:
    """``import features.cli``, ``features --help`` and the stage's settings (what ``pipelines.yaml``
    validates) load neither torch nor the training package: the extractors' declarations import no network,
    and the pipeline schema loads only when a command runs."""
    import subprocess
    import sys

    code = ("import sys\nimport features.cli\nfrom features.settings import features_settings_class\n"
            "features.cli.build_parser().format_help()\nfeatures_settings_class()\n"
            "loaded = {m.split('.')[0] for m in sys.modules}\n"
            "print(sorted(loaded & {'torch', 'torchvision', 'timm', 'train'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
