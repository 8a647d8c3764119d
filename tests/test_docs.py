"""Every ```python block in docs/*.md runs as written, unless a `<!-- not-run: reason -->` line precedes it.

Each block runs in its own process, as ``python -c`` in a temporary directory: forked from the session's fork
server, which has imported TensorFlow (``tfdist.testing.run_python``), so a block finds what a script finds
after ``import tensorflow``. A block marked not-run is reported as skipped with its reason, so the reasons stay
visible.
"""

from __future__ import annotations

import pathlib
import re
import sys
import tempfile

import pytest

from tfdist import testing

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
_FENCE = re.compile(r"^```python[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>.+?)\s*-->\s*$")


def _blocks() -> list[tuple[str, str, str | None]]:
    """(id, code, skip reason or None) for every python block in docs/."""
    found = []
    for page in DOCS:
        text = page.read_text(encoding="utf-8")
        for _number, match in enumerate(_FENCE.finditer(text), start=1):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _NOT_RUN.search(before)
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.name}:{line}", match.group("code"), marker.group("reason") if marker else None))
    return found


BLOCKS = _blocks()


def test_the_docs_pages_exist() -> None:
    names = {page.name for page in DOCS}
    expected = {
        "cluster.md",
        "strategies.md",
        "data.md",
        "keras.md",
        "launch.md",
        "communication.md",
        "planning.md",
        "recsys.md",
        "design.md",
        "model-parallel.md",
        "spark.md",
    }
    assert expected <= names, f"missing docs pages: {sorted(expected - names)}"
    assert BLOCKS, "no python blocks found in docs/"


def test_not_run_markers_give_a_reason() -> None:
    for page in DOCS:
        for line in page.read_text(encoding="utf-8").splitlines():
            if "not-run" in line:
                assert _NOT_RUN.search(line), f"{page.name}: malformed marker {line!r}"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One HOME for every block: the blocks' environments are then one, and so is their fork server."""
    return str(tmp_path_factory.mktemp("docs-home"))


@pytest.mark.parametrize("where,code,reason", BLOCKS, ids=[block[0] for block in BLOCKS])
def test_python_block_runs(where: str, code: str, reason: str | None, home: str) -> None:
    if reason is not None:
        pytest.skip(f"not-run: {reason}")
    with tempfile.TemporaryDirectory(prefix="tfdist-docs-") as tmp:
        env = {
            "PYTHONPATH": str(ROOT),
            "PATH": "/usr/bin:/bin",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "TF_USE_LEGACY_KERAS": "1",
            "HOME": home,
        }
        done = testing.run_python([sys.executable, "-c", code], cwd=tmp, env=env, timeout=300)
    assert done.returncode == 0, f"{where} failed:\n{done.stderr[-3000:]}"
