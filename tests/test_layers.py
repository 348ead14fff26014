"""The layers, as a specification of which module may import which (read from the source).

The rules are README's layer table ("Architecture"), read from README.md itself: a row per layer,
its modules, and the layers (or single modules) it may import besides its own. Every import
counts: at module level, inside a function, under `if TYPE_CHECKING:`. On top of the table, no
import circle anywhere (a lazy import is still a circle) and no module uses another module's
`_private` names, by `from m import _name` or by `m._name`.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "sandboxes", "proxy", "harness_adapters", "stores_inspector",
            "solver_model")
EVERYTHING = "everything"
NOTHING = "nothing else"


@dataclass(frozen=True)
class Layer:
    name: str
    modules: tuple[str, ...]  # module prefixes: "orchestrator.run" holds orchestrator.run.*
    may_import: tuple[str, ...]  # layer names, module prefixes, or EVERYTHING


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _dotted(path: str) -> str:
    """`orchestrator/run/` or `proxy/journal.py` as a module name."""
    return path.removesuffix("/").removesuffix(".py").replace("/", ".")


def readme_layers(readme: Path = ROOT / "README.md") -> list[Layer]:
    """The rows of README's table `| layer | modules | owns | may import |`. Modules are backticked
    paths, the later ones relative to the first one's folder; "may import" lists layer names and
    backticked paths (a remark in parentheses is prose), or says "everything" or "nothing else"."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    start = lines.index("| layer | modules | owns | may import |")
    layers = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        name, modules, _owns, may = (cell.strip() for cell in line.strip("|").split("|"))
        paths = re.findall(r"`([^`]+)`", modules)
        folder = paths[0] if paths[0].endswith("/") else paths[0].rpartition("/")[0] + "/"
        dotted = [_dotted(paths[0])] + [_dotted(folder + p) for p in paths[1:]]
        allowed = [item.strip().strip("`") for item in re.sub(r"\([^)]*\)", "", may).split(",")]
        layers.append(Layer(name, tuple(dotted),
                            tuple(_dotted(a) if "/" in a else a for a in allowed if a != NOTHING)))
    return layers


@dataclass
class Imports:
    graph: dict[str, set[str]]  # module -> the project modules it imports
    private: list[str]  # "module:line uses other._name"


def read_imports(root: Path = ROOT) -> Imports:
    """Every import of a project module by a project module, at any depth, TYPE_CHECKING too."""
    modules = {_module(p, root): p for package in PACKAGES for p in (root / package).rglob("*.py")
               if "recipes" not in p.parts and "scaffold" not in p.parts[:-1]
               or p.name == "__init__.py"}
    graph: dict[str, set[str]] = defaultdict(set)
    private: list[str] = []

    def is_private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound: dict[str, str] = {}  # a name this module binds to a project module -> that module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        graph[name].add(alias.name)
                        bound[alias.asname or alias.name] = alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    # `from package import submodule` depends on the submodule, else on the module
                    submodule = f"{node.module}.{alias.name}"
                    if submodule in modules:
                        graph[name].add(submodule)
                        bound[alias.asname or alias.name] = submodule
                    elif node.module in modules:
                        graph[name].add(node.module)
                        if is_private(alias.name) and node.module != name:
                            private.append(
                                f"{name}:{node.lineno} imports {node.module}.{alias.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and is_private(node.attr):
                target = bound.get(ast.unparse(node.value))
                if target is not None and target != name:
                    private.append(f"{name}:{node.lineno} uses {target}.{node.attr}")
        graph[name].discard(name)
        graph.setdefault(name, set())
    return Imports(dict(graph), private)


def layer_violations(root: Path = ROOT, layers: list[Layer] | None = None) -> list[str]:
    """What breaks the layer table, the private names used across modules, and the circles."""
    layers = readme_layers() if layers is None else layers
    imports = read_imports(root)

    def layer_of(module: str) -> Layer | None:
        # the longest prefix wins: orchestrator.run.* is run's, not the package's
        found = [(len(p), layer) for layer in layers for p in layer.modules if _under(module, (p,))]
        return max(found, key=lambda f: f[0])[1] if found else None

    found = []
    for module, targets in sorted(imports.graph.items()):
        layer = layer_of(module)
        if layer is None:
            if targets:  # one that imports nothing breaks no rule; its importers are checked
                found.append(f"{module} is in no layer of the table")
            continue
        if EVERYTHING in layer.may_import:
            continue
        for target in sorted(targets):
            other = layer_of(target)
            layer_allowed = other is layer or (other is not None and other.name in layer.may_import)
            if not layer_allowed and not _under(target, layer.may_import):
                found.append(f"{module} ({layer.name}) imports {target}")
    return (found + sorted(imports.private)
            + [f"import circle: {' -> '.join(c)}" for c in circles(imports.graph)])


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


def test_the_readme_layers_hold_with_no_private_import_and_no_circle():
    assert layer_violations() == []


def test_the_readme_table_names_a_layer_for_every_package_and_no_unknown_one():
    layers = readme_layers()
    names = {layer.name for layer in layers}
    assert {"core", "run", "analysis", "cli"} <= names
    for layer in layers:
        known = [a in names or a == EVERYTHING or _under(a, PACKAGES) for a in layer.may_import]
        assert all(known), layer
    assert {m.split(".")[0] for layer in layers for m in layer.modules} == set(PACKAGES)


def _tree(root: Path, files: dict[str, str]) -> None:
    """The files, each folder a package."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for folder in path.relative_to(root).parents[:-1]:
            (root / folder / "__init__.py").touch()


LAYERS = [Layer("core", ("orchestrator.protocol",), ()),
          Layer("run", ("orchestrator.run",), ("core", "harness_adapters", "sandboxes")),
          Layer("sandboxes", ("sandboxes",), ()),
          Layer("harnesses", ("harness_adapters",), ("core", "sandboxes")),
          Layer("cli", ("orchestrator",), (EVERYTHING,))]


def test_the_checker_sees_a_circle_and_a_broken_layer_under_type_checking(tmp_path):
    _tree(tmp_path, {
        "orchestrator/protocol.py": "from typing import TYPE_CHECKING\n"
                                    "if TYPE_CHECKING:\n    from orchestrator.run import grid\n",
        "orchestrator/run/grid.py": "def f():\n    import orchestrator.protocol\n",
        "sandboxes/images.py": "import harness_adapters.registry\n",
        "harness_adapters/registry.py": "from orchestrator import cli\n",
        "orchestrator/cli.py": "import sandboxes.images\n"})
    found = layer_violations(tmp_path, LAYERS)
    assert found == [
        "harness_adapters.registry (harnesses) imports orchestrator.cli",
        "orchestrator.protocol (core) imports orchestrator.run.grid",
        "sandboxes.images (sandboxes) imports harness_adapters.registry",
        "import circle: harness_adapters.registry -> orchestrator.cli -> sandboxes.images "
        "-> harness_adapters.registry",
        "import circle: orchestrator.protocol -> orchestrator.run.grid -> orchestrator.protocol"]


def test_the_checker_sees_private_names_taken_from_another_module(tmp_path):
    _tree(tmp_path, {
        "orchestrator/protocol.py": "_LIMIT = 16\n__version__ = '1'\n",
        "orchestrator/run/grid.py": "from orchestrator.protocol import _LIMIT, __version__\n",
        "orchestrator/run/cell.py": "from orchestrator import protocol\nlimit = protocol._LIMIT\n",
        "orchestrator/run/own.py": "_mine = 1\nclass A:\n    _x = _mine\nprint(A._x)\n"})
    assert layer_violations(tmp_path, LAYERS) == [
        "orchestrator.run.cell:2 uses orchestrator.protocol._LIMIT",
        "orchestrator.run.grid:1 imports orchestrator.protocol._LIMIT"]


def test_a_module_that_imports_and_is_in_no_layer_is_reported(tmp_path):
    _tree(tmp_path, {"proxy/journal.py": "from orchestrator import protocol\n",
                     "proxy/host.py": "", "orchestrator/protocol.py": ""})
    assert layer_violations(tmp_path, LAYERS) == ["proxy.journal is in no layer of the table"]


def test_what_the_proxy_image_runs_imports_nothing_outside_proxy():
    """The proxy image holds `proxy/` only (mitmdump loads `proxy/addon.py`): the addon and every
    module it imports, however deep, must not need orchestrator (its errors included)."""
    graph = read_imports().graph
    seen, todo = set(), ["proxy.addon"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph.get(module, ())
    assert len(seen) > 1 and [m for m in sorted(seen) if not _under(m, ("proxy",))] == []
