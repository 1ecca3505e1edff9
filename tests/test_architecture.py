"""The house rules of the layout, checked on every module's imports (function-level ones too).

- controllers/, routers/ and trace_shapes/ import nothing of ours (pure policies, plain shapes);
- actors/ is the only Ray layer: nothing else imports ray, and loadgen/ never imports actors;
- the run core (loadgen/core) never imports the live side, the analysis or the CLI;
- the simulated engine (loadgen/sim) knows no sessions, no HTTP: it imports only itself;
- the HTTP client knows nothing of the simulated engine;
- no import circles among our modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("loadgen", "controllers", "routers", "trace_shapes", "actors")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_nodes(tree: ast.AST, top_level_only: bool):
    """Import statements of a module; with ``top_level_only``, not those inside functions."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not (top_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))):
            todo.extend(ast.iter_child_nodes(node))


def imports_of(root: Path, path: Path, top_level_only: bool = False) -> set[str]:
    """Absolute names of the modules ``path`` imports, relative imports resolved."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path)), top_level_only):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            # `from pkg import mod` imports pkg.mod when it is a module of ours
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Our modules -> the modules of ours they import."""
    paths = [p for pkg in PACKAGES if (root / pkg).is_dir() for p in sorted((root / pkg).rglob("*.py"))]
    modules = {module_name(root, p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in imports_of(root, path) if m in modules and m != name}
    return graph


def all_imports(root: Path) -> dict[str, set[str]]:
    """Our modules -> every name they import (ours and third-party). The CLI is the top of the
    house: it may reach the Ray layer, but only lazily, inside the commands that need a cluster."""
    paths = [p for pkg in PACKAGES if (root / pkg).is_dir() for p in sorted((root / pkg).rglob("*.py"))]
    return {module_name(root, p): imports_of(root, p, top_level_only=any(_within(module_name(root, p), lazy)
                                                                         for lazy in LAZY_RAY))
            for p in paths}


LAZY_RAY = {"loadgen.cli"}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# (who, may not import, why)
RULES = [
    ("controllers", ("loadgen", "trace_shapes", "actors", "ray", "routers"), "controllers are pure policies"),
    ("routers", ("loadgen", "controllers", "trace_shapes", "actors", "ray"), "routers are pure policies"),
    ("trace_shapes", ("loadgen", "controllers", "routers", "actors", "ray"), "trace shapes are plain data"),
    ("loadgen", ("actors", "ray"), "the core runs without Ray; actors/ is the only Ray layer"),
    ("loadgen.core", ("loadgen.live", "loadgen.analysis", "loadgen.experiment", "loadgen.cli"),
     "the run core does not know the live side, the analysis or the CLI"),
    ("loadgen.sim", ("loadgen.core", "loadgen.live", "loadgen.analysis", "loadgen.experiment", "loadgen.cli",
                     "controllers", "routers", "trace_shapes", "aiohttp"),
     "the simulated engine knows no sessions and no HTTP"),
    ("loadgen.live.http_client", ("loadgen.sim",), "the HTTP client knows nothing of the simulated engine"),
    ("loadgen.live.transport", ("loadgen.sim", "loadgen.core"), "the network seam knows no engine and no session"),
    ("loadgen.live.server_metrics", ("loadgen.sim",), "reading /metrics knows nothing of the simulated engine"),
    ("loadgen.analysis", ("loadgen.live", "loadgen.experiment", "loadgen.cli"),
     "analysis reads recorded files only"),
]


def violations(root: Path) -> list[str]:
    found = []
    for module, imported in all_imports(root).items():
        for who, forbidden, why in RULES:
            if not _within(module, who):
                continue
            for name in sorted(imported):
                if name.rpartition(".")[0] in imported:
                    continue  # `from a import b` also lists a.b: name the module once
                if any(_within(name, f) for f in forbidden):
                    found.append(f"{module} imports {name}: {why}")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_repository_follows_the_import_rules():
    assert violations(REPO) == []


def test_the_repository_has_no_import_circles():
    assert cycles(import_graph(REPO)) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


CLEAN = {
    "loadgen/__init__.py": "",
    "loadgen/core/__init__.py": "",
    "loadgen/core/spec.py": "from controllers import make_policy\nfrom ..sim import engine\n",
    "loadgen/sim/__init__.py": "from .engine import SimEngine\n",
    "loadgen/sim/engine.py": "import heapq\n",
    "loadgen/live/__init__.py": "",
    "loadgen/live/runner.py": "from ..core.spec import X\n",
    "controllers/__init__.py": "import math\n",
    "actors/fleet.py": "import ray\nfrom loadgen.core import spec\n",
    "loadgen/cli.py": "def sweep():\n    from actors import fleet\n",
}


def test_a_clean_tree_passes(tmp_path):
    _write(tmp_path, CLEAN)
    assert violations(tmp_path) == [] and cycles(import_graph(tmp_path)) == []


@pytest.mark.parametrize("rel, line, expected", [
    ("loadgen/core/spec.py", "    from actors import fleet\n", "loadgen.core.spec imports actors"),
    ("loadgen/core/spec.py", "import ray\n", "loadgen.core.spec imports ray"),
    ("loadgen/core/spec.py", "from ..live import runner\n", "loadgen.core.spec imports loadgen.live"),
    ("controllers/__init__.py", "from loadgen.core import spec\n", "controllers imports loadgen.core"),
    ("loadgen/sim/engine.py", "from ..core.spec import X\n", "loadgen.sim.engine imports loadgen.core.spec"),
    ("loadgen/cli.py", "from actors import sweep\n", "loadgen.cli imports actors"),
])
def test_a_forbidden_import_is_named(tmp_path, rel, line, expected):
    files = dict(CLEAN)
    files[rel] += f"def f():\n{line}" if line.startswith(" ") else line
    _write(tmp_path, files)
    assert any(v.startswith(expected) for v in violations(tmp_path)), violations(tmp_path)


def test_an_import_circle_is_found(tmp_path):
    files = dict(CLEAN)
    files["loadgen/live/calibrate.py"] = "from .runner import X\n"
    files["loadgen/live/runner.py"] += "def later():\n    from .calibrate import Y\n"
    _write(tmp_path, files)
    assert cycles(import_graph(tmp_path)) == [["loadgen.live.calibrate", "loadgen.live.runner"]]
