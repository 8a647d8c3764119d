"""The import graph of tfdist reads bottom-up: no cycles, and no module uses a floor above its own.

The floors are ``tfdist._layers.LAYERS``, next to the code. Uses are read from the source: every
``import``/``from ... import`` (at module level or inside a function or ``TYPE_CHECKING`` block) and every
string that names a tfdist module (``python -m tfdist.launch.tasks.server``; docstrings are prose and
logger names follow the package, so neither counts), so neither a cycle hidden in a
function body nor a child process started by module name escapes the rule. The programs a launch starts are
one table, :class:`tfdist.launch.tasks.programs.TaskProgram`, which spells their modules: a use of one of its
members (``TaskProgram.SERVER``) is a use of that member's module; the table itself only names them.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfdist"

from tfdist._layers import LAYERS
from tfdist.launch.tasks.programs import TaskProgram


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()
TABLE = TaskProgram.__module__  # The table of task programs: it names their modules, it does not use them.
PROGRAMS = {program.name: program.module for program in TaskProgram}


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The tfdist modules ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and (body := node.body)
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
    }
    # Logger names follow the package ("tfdist.data"), they do not use it.
    docstrings |= {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "getLogger"
        for arg in node.args
    }
    for node in ast.walk(tree):
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
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and name not in ("tfdist._layers", TABLE)
        ):  # The rule itself names every floor, the table every task program.
            found |= _named_modules(node.value)
        elif isinstance(node, ast.Attribute) and _names_table(node.value) and node.attr in PROGRAMS:
            found.add(PROGRAMS[node.attr])  # TaskProgram.SERVER: starts tfdist.launch.tasks.server.
    found.discard(name)
    return found


def _names_table(node: ast.expr) -> bool:
    """Whether ``node`` is the table of task programs (``TaskProgram`` or ``programs.TaskProgram``)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name == TaskProgram.__name__


_NAME = r"tfdist(?:\.[A-Za-z_]\w*)+"
# A string uses a module when it is that dotted name (an argv item, ``importlib``, ``mock.patch``) or runs it
# with ``-m`` (a command line in a template). Prose that mentions a module (an error's hint) is not a use.
_MODULE_USE = re.compile(rf"^\s*({_NAME})\s*$|(?<![\w-])-m\s+({_NAME})")


def _named_modules(text: str) -> set[str]:
    """The tfdist modules a string uses (the longest dotted prefix of each name that is a module)."""
    found = set()
    for match in _MODULE_USE.finditer(text):
        name = match.group(1) or match.group(2)
        parts = name.split(".")
        for end in range(len(parts), 1, -1):
            candidate = ".".join(parts[:end])
            if candidate in MODULES:
                found.add(candidate)
                break
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
    assert "tfdist.cluster.spec" in GRAPH["tfdist.strategy.builders"]  # sanity: the parser sees real imports
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_module_names_in_strings_count_as_uses() -> None:
    assert _named_modules("python -m tfdist.launch.tasks.server --port 1") == {"tfdist.launch.tasks.server"}
    assert _named_modules("tfdist.data.storage.staging.StagedReads") == {"tfdist.data.storage.staging"}
    assert _named_modules('srun "$PYTHON" -m tfdist.launch.tasks.slurm --x') == {"tfdist.launch.tasks.slurm"}
    assert _named_modules("start it with tfdist.launch.run_server()") == set()  # prose, not a use
    assert "tfdist.launch.tasks.server" in GRAPH["tfdist.launch.environment"]  # through TaskProgram.SERVER


def test_the_table_of_task_programs_is_read() -> None:
    """Each program's module exists and is spelled in the table's source, where a reader (and grep) finds it."""
    source = MODULES[TABLE].read_text(encoding="utf-8")
    for member, module in PROGRAMS.items():
        assert module in MODULES, f"TaskProgram.{member} names no module: {module}"
        assert f'{member} = "{module}"' in source, member
    assert GRAPH[TABLE] == set()  # Naming a program is not using it, or every user of the table would use all.
    assert "tfdist.launch.tasks.slurm" in GRAPH["tfdist.launch.emit.slurm"]
    assert "tfdist.launch.tasks.netns" in GRAPH["tfdist.launch.engines._netns"]
    assert "tfdist.launch.tasks.netns" not in GRAPH["tfdist.launch.emit.slurm"]  # Per member, not per table.


def test_no_import_cycles() -> None:
    assert _cycles(GRAPH) == []


def test_every_module_has_a_layer() -> None:
    """A new top-level module must be placed in LAYERS (a package's submodules inherit its layer)."""
    assert [name for name in MODULES if _layer(name) < 0] == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name: str) -> None:
    upward = sorted(target for target in GRAPH[name] if _layer(target) > _layer(name))
    assert not upward, f"{name} (layer {_layer(name)}) imports higher layers: {upward}"
