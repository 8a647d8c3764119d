"""docs/design.md's "Map of the package" names every module under tfdist/ (pure Python: no TensorFlow).

The map is a table with one row per folder (``launch/engines/``) or per top-level file (``plan.py``). A module
is named when its path appears in backticks anywhere in the map (``data/order/claims`` or
``data/order/claims.py``), or when its bare name appears in backticks in the row of its folder (``claims`` in
the ``data/order/`` row). A package's ``__init__.py`` is named by its folder's row; the top-level one as
``__init__.py``.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfdist"
DESIGN = ROOT / "docs" / "design.md"
_TICKED = re.compile(r"`([^`]+)`")


def _map_rows() -> list[tuple[str, str]]:
    """(where, what) of every row of the map's table."""
    text = DESIGN.read_text(encoding="utf-8")
    start = text.index("## Map of the package")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and not set(cells[0]) <= set("-: ") and cells[0] != "where":
            rows.append((cells[0], " | ".join(cells[1:])))
    return rows


def _named(rows: list[tuple[str, str]]) -> tuple[set[str], dict[str, set[str]]]:
    """Paths named anywhere in the map, and the bare names each folder's row names."""
    paths: set[str] = set()
    by_folder: dict[str, set[str]] = {}
    for where, what in rows:
        ticked = _TICKED.findall(where) + _TICKED.findall(what)
        paths.update(name.strip().removesuffix(".py") for name in ticked)
        for folder in (name.strip().rstrip("/") for name in _TICKED.findall(where) if name.strip().endswith("/")):
            by_folder.setdefault(folder, set()).update(
                word for name in ticked for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", name)
            )
    return paths, by_folder


def _modules() -> list[str]:
    """Every module under tfdist/, as a path relative to it without ``.py`` (``data/order/claims``)."""
    return sorted(str(path.relative_to(PACKAGE).with_suffix("")) for path in PACKAGE.rglob("*.py"))


def _missing(modules: list[str], rows: list[tuple[str, str]]) -> list[str]:
    paths, by_folder = _named(rows)
    missing = []
    for module in modules:
        folder, _, name = module.rpartition("/")
        if name == "__init__":
            found = folder in by_folder if folder else "__init__" in paths
        else:
            found = module in paths or name in by_folder.get(folder, set())
        if not found:
            missing.append(f"{module}.py")
    return missing


def test_the_map_names_every_module() -> None:
    missing = _missing(_modules(), _map_rows())
    assert not missing, (
        f"docs/design.md's map of the package does not name {missing}: add each, in backticks, to its folder's "
        "row (a new folder gets a row of its own)"
    )


def test_every_folder_in_the_map_exists() -> None:
    folders = {name.strip().rstrip("/") for where, _ in _map_rows() for name in _TICKED.findall(where)}
    gone = sorted(name for name in folders if not (PACKAGE / name).exists())
    assert not gone, f"docs/design.md's map names folders or files that are not under tfdist/: {gone}"


def test_the_check_reads_rows_as_the_map_writes_them() -> None:
    rows = [
        ("`__init__.py`, `plan.py`", "the top level"),
        ("`data/order/`", "the order (`plan`), claims (`claims`)"),
        ("`keras/`", "stages (`keras/stages.py`)"),
    ]
    modules = ["__init__", "plan", "data/order/__init__", "data/order/claims", "data/order/index", "keras/stages"]
    assert _missing(modules, rows) == ["data/order/index.py"]
    # A bare name counts only in its own folder's row.
    assert _missing(["keras/plan"], rows) == ["keras/plan.py"]
    # A folder without a row leaves its __init__ unnamed.
    assert _missing(["parallel/__init__"], rows) == ["parallel/__init__.py"]
