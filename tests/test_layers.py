"""The import graph of tfdist reads bottom-up: no cycles, and no module imports a layer above its own.

Imports are read from the source (every ``import``/``from ... import``, at module level or inside a function
or ``TYPE_CHECKING`` block), so a cycle hidden in a function body fails here too.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfdist"

# Lowest first. A module may import its own layer and the layers below it, never one above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tfdist.errors", "tfdist._names", "tfdist.exit_codes"),
    ("tfdist._compat", "tfdist._address", "tfdist._slurm", "tfdist._cluster_parse", "tfdist._jobset"),
    ("tfdist.cluster", "tfdist.plan", "tfdist.probe", "tfdist.clean_exit", "tfdist.membership"),
    ("tfdist.resolver", "tfdist.collective", "tfdist.strategy", "tfdist.autotune"),
    ("tfdist.data",),
    ("tfdist.launch",),
    ("tfdist.keras",),
    ("tfdist.testing", "tfdist.stack"),
    ("tfdist.cli",),
    ("tfdist",),
)


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The tfdist modules ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in MODULES}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in MODULES:
                    found.add(target)
                elif base in MODULES:
                    found.add(base)
    found.discard(name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _layer(name: str) -> int:
    """The layer of ``name``: the layer of its longest listed prefix (the package itself only by its name)."""
    best, depth = -1, -1
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            covers = name == prefix or (prefix != "tfdist" and name.startswith(prefix + "."))
            if covers and prefix.count(".") > depth:
                best, depth = level, prefix.count(".")
    return best


def test_the_graph_is_read() -> None:
    assert "tfdist.cluster" in GRAPH["tfdist.strategy"]  # sanity: the parser sees real imports
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert _cycles(GRAPH) == []


def test_every_module_has_a_layer() -> None:
    """A new top-level module must be placed in LAYERS (a package's submodules inherit its layer)."""
    assert [name for name in MODULES if _layer(name) < 0] == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name: str) -> None:
    upward = sorted(target for target in GRAPH[name] if _layer(target) > _layer(name))
    assert not upward, f"{name} (layer {_layer(name)}) imports higher layers: {upward}"
