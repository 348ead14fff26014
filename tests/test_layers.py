"""The layers, as a specification of which package may import which (read from the source, no import).

    orchestrator/{arc,arc3,protocol,prompts,streams,rows,records}.py, orchestrator/tasks/   the pure core
    orchestrator/analysis/, stores_inspector/     read records; never the code that ran them
    orchestrator/run/                             the only layer using harness_adapters, sandboxes, proxy
    orchestrator/cli.py, doctor.py, labelling.py  on top
and no import circle anywhere (function-level imports count: a lazy import is still a circle).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "sandboxes", "proxy", "harness_adapters", "stores_inspector", "solver_model")
PURE = ("orchestrator.arc", "orchestrator.arc3", "orchestrator.protocol", "orchestrator.prompts", "orchestrator.streams",
        "orchestrator.rows", "orchestrator.records", "orchestrator.tasks")
TOP = ("orchestrator.cli", "orchestrator.doctor", "orchestrator.labelling")


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the project modules it imports (any depth, not under `if TYPE_CHECKING:`)."""
    modules = {_module(p, root): p for package in PACKAGES for p in (root / package).rglob("*.py")
               if "recipes" not in p.parts and "scaffold" not in p.parts[:-1] or p.name == "__init__.py"}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from package import submodule` depends on the submodule, anything else on the module
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
        graph.setdefault(name, set())
    return graph


def layer_violations(root: Path = ROOT) -> list[str]:
    graph = import_graph(root)
    found = []
    for module, imports in sorted(graph.items()):
        for target in sorted(imports):
            if _under(module, PURE) and not _under(target, PURE):
                found.append(f"pure core {module} imports {target}")
            if _under(module, ("orchestrator.analysis", "stores_inspector")) and _under(target, ("orchestrator.run",) + TOP):
                found.append(f"{module} reads records only, but imports {target}")
            if _under(module, ("sandboxes",)) and _under(target, ("harness_adapters", "solver_model", "orchestrator")):
                found.append(f"sandboxes module {module} imports {target}")
            if _under(target, ("orchestrator.run",)) and not _under(module, ("orchestrator.run",) + TOP):
                found.append(f"{module} imports the run layer ({target})")
    return found + [f"import circle: {' -> '.join(c)}" for c in circles(graph)]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component) + [sorted(component)[0]])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_layers_hold_and_nothing_imports_in_a_circle():
    assert layer_violations() == []


def test_the_checker_sees_a_circle_and_a_broken_layer(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "orchestrator" / "protocol.py").write_text("from orchestrator.run import grid\n")
    (tmp_path / "orchestrator" / "run").mkdir()
    (tmp_path / "orchestrator" / "run" / "__init__.py").write_text("")
    (tmp_path / "orchestrator" / "run" / "grid.py").write_text("def f():\n    import orchestrator.protocol\n")
    (tmp_path / "sandboxes" / "images.py").write_text("import harness_adapters.registry\n")
    (tmp_path / "harness_adapters" / "registry.py").write_text("")
    found = layer_violations(tmp_path)
    assert "pure core orchestrator.protocol imports orchestrator.run.grid" in found
    assert "sandboxes module sandboxes.images imports harness_adapters.registry" in found
    assert "import circle: orchestrator.protocol -> orchestrator.run.grid -> orchestrator.protocol" in found
