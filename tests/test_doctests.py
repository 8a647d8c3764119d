"""The examples in public docstrings run as written."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import tfdist

# Every module of the package, found, not listed: a listed set missed new modules, and four examples had
# gone stale unnoticed (tfdist.data.order.index, .reader, .strata and tfdist.keras.parallel.tensor).
MODULES = ["tfdist", *sorted(m.name for m in pkgutil.walk_packages(tfdist.__path__, "tfdist."))]


# Examples that need an optional package (the newest stack's Python has no pyspark or Ray to bring it).
NEEDS = {"tfdist.launch.functions": "cloudpickle"}


def test_every_module_is_found() -> None:
    assert len(MODULES) > 140 and "tfdist.data.order.reader" in MODULES and "tfdist._compat.data" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    if name in NEEDS:
        pytest.importorskip(NEEDS[name], reason=f"{name}'s examples pickle a function defined in them")
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
