"""The public API matches its docs: lazy subpackages, explicit names, keyword-only frozen specs."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pathlib
import pkgutil
import subprocess
import sys
import types
from typing import Any

import pytest

import tfdist


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_import_tfdist_is_light_and_its_subpackages_load_on_use() -> None:
    out = _run(
        "import sys, tfdist\n"
        "light = 'tensorflow' not in sys.modules and 'tf_keras' not in sys.modules\n"
        "names = (tfdist.data.__name__, tfdist.launch.__name__, tfdist.plan.__name__)\n"
        "print(light, 'tensorflow' in sys.modules, *names)\n"
        "print(tfdist.keras.__name__, 'tf_keras' in sys.modules)"  # tf-keras's names are imported by tfdist.keras.
    )
    assert out == "True False tfdist.data tfdist.launch tfdist.plan\ntfdist.keras True"


def test_exports() -> None:
    for name in ("current_cluster", "resolve_cluster", "PlanError", "RuntimeFailure", "StorageError", "keras"):
        assert name in tfdist.__all__ and hasattr(tfdist, name), name
    assert set(tfdist.__all__) <= set(dir(tfdist))
    data = importlib.import_module("tfdist.data")
    for name in (
        "LocalDataService",
        "skew_report",
        "SkewReport",
        "TFRecordPipeline",
        "SourceOptions",
        "ShardOptions",
        "ParseOptions",
        "SampleOptions",
        "EpochOptions",
        "TuningOptions",
    ):
        assert name in data.__all__ and hasattr(data, name), name
    for package, names in (
        ("tfdist.cluster", ("ClusterSpec", "free_ports", "can_connect")),
        ("tfdist.launch", ("LaunchConfig", "RayEngine", "validate_tfjob", "to_yaml")),
        ("tfdist.runtime", ("PREEMPTED", "is_retryable", "exit_cleanly")),
    ):
        module = importlib.import_module(package)
        assert set(names) <= set(module.__all__), (package, sorted(set(names) - set(module.__all__)))
    assert {"cluster", "comm", "runtime", "strategy"} <= set(tfdist.__all__)


# What users import from. Every other module's __all__ lists only names its package re-exports, up to one of
# these or to a private package (``tfdist._compat``: its __all__ serves tfdist's own modules), so a public name
# has one home and everything else is tfdist's own.
PUBLIC = (
    "tfdist",
    "tfdist.cluster",
    "tfdist.comm",
    "tfdist.data",
    "tfdist.keras",
    "tfdist.launch",
    "tfdist.parallel",
    "tfdist.plan",
    "tfdist.runtime",
    "tfdist.strategy",
    "tfdist.testing",
)
PACKAGE = pathlib.Path(tfdist.__file__).parent
# A package __init__ holds a docstring, imports and __all__; "tfdist" also loads its subpackages on first use.
LAZY_INIT_NAMES = {
    # _logs: imported for its one effect, the TFDIST_LOG_LEVEL default of launched tasks (tfdist/runtime/logs.py).
    "tfdist": {"__version__", "_LAZY_MODULES", "_LAZY_NAMES", "__getattr__", "__dir__", "importlib", "Any", "_logs"},
}
# Names an __init__ imports without listing them in __all__.
UNLISTED_IMPORTS = {"tfdist.keras": {"__version__"}}  # tf_keras's version, as tf_keras has it.


def _module_names() -> list[str]:
    """Every tfdist module but the CLI's (entry points run as programs; their source is read instead)."""
    found = ["tfdist"] + [info.name for info in pkgutil.walk_packages(tfdist.__path__, "tfdist.")]
    return [name for name in found if not name.startswith("tfdist.cli")]


def _dotted(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_all_name_exists() -> None:
    for name in _module_names():
        module = importlib.import_module(name)
        listed = list(getattr(module, "__all__", ()))
        assert len(listed) == len(set(listed)), f"{name}.__all__ lists a name twice: {listed}"
        for attr in listed:
            assert hasattr(module, attr), f"{name}.__all__ names {attr!r}, which it lacks"


def test_public_names_are_reexported_up_to_a_public_package() -> None:
    """A module's __all__ holds what its package re-exports (the same object), and so on up to PUBLIC."""
    missing = []
    for name in _module_names():
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            here, value = name, getattr(module, attr)
            while here not in PUBLIC and not here.rpartition(".")[2].startswith("_"):
                parent = here.rpartition(".")[0]
                package = importlib.import_module(parent)
                if attr not in getattr(package, "__all__", ()) or getattr(package, attr, None) is not value:
                    missing.append(f"{name}.{attr} (not re-exported by {parent})")
                    break
                here = parent
    assert not missing, (
        "names in __all__ that no public package re-exports; re-export them, or drop them from "
        f"__all__ (a module's other names are internal): {missing}"
    )
    cli = [
        _dotted(path)
        for path in sorted((PACKAGE / "cli").glob("*.py"))
        if any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets)
            for node in ast.parse(path.read_text(encoding="utf-8")).body
        )
    ]
    assert not cli, f"the CLI exports nothing (users run it): {cli}"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("__init__.py")), ids=_dotted)
def test_package_inits_only_reexport(path: pathlib.Path) -> None:
    name = _dotted(path)
    allowed = LAZY_INIT_NAMES.get(name, set()) | UNLISTED_IMPORTS.get(name, set())
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported, loose = set(), []
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # The docstring.
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = {alias.asname or alias.name.partition(".")[0] for alias in node.names} - {"annotations"}
            imported |= bound - allowed
            continue
        if isinstance(node, ast.FunctionDef):
            bound = {node.name}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            bound = {
                t.id
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Name)
            }
        else:
            bound = set()
        if not bound or not bound <= allowed | {"__all__"}:
            loose.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    assert not loose, f"{path}: an __init__ only re-exports (move the code to a module): {loose}"
    exported = set(getattr(importlib.import_module(name), "__all__", ()))
    assert imported <= exported, f"{name} imports names it does not list in __all__: {sorted(imported - exported)}"
    if name not in LAZY_INIT_NAMES:
        assert exported <= imported, f"{name}.__all__ lists names it does not import: {sorted(exported - imported)}"


def test_keras_lists_its_names_and_resolves_them_to_objects() -> None:
    import tf_keras

    from tfdist import keras

    own = [name for name in keras.__all__ if not hasattr(tf_keras, name)]
    assert "fit_input" in own and "stage_model" in own and len(own) == 29, own
    assert "layers" in keras.__all__ and dir(keras) == sorted(dir(keras)) and "fit_input" in dir(keras)
    import tfdist.keras.cluster_aware  # noqa: F401 - importing the module must not shadow the function.

    for name in own:
        assert not isinstance(getattr(keras, name), types.ModuleType), name
    for name in set(keras.__all__) - set(own):  # tf_keras's public API, passed through unchanged.
        assert getattr(keras, name) is getattr(tf_keras, name), name
    assert keras.Sequential.__module__.startswith("tf_keras") and keras.__version__ == tf_keras.__version__
    with pytest.raises(AttributeError, match="no_such_name"):
        keras.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def _keyword_only_classes() -> list[type]:
    from tfdist.comm import CollectiveConfig, CollectiveTuning
    from tfdist.data import FileInfo, Listing, ShardPlan, SkewReport, TFRecordPipeline
    from tfdist.keras import EmbeddingShard, EmbeddingTable
    from tfdist.launch import KillAt, LaunchConfig, LaunchResult, TaskResult
    from tfdist.plan import EmbeddingTraffic, Plan
    from tfdist.testing import ClusterRun

    return [
        tfdist.ClusterSpec,
        tfdist.Task,
        tfdist.StrategyOptions,
        CollectiveConfig,
        CollectiveTuning,
        Plan,
        EmbeddingTraffic,
        EmbeddingShard,
        EmbeddingTable,
        ClusterRun,
        FileInfo,
        Listing,
        TFRecordPipeline,
        SkewReport,
        ShardPlan,
        KillAt,
        LaunchConfig,
        LaunchResult,
        TaskResult,
    ]


@pytest.mark.parametrize("cls", _keyword_only_classes(), ids=lambda cls: cls.__name__)
def test_dataclasses_are_keyword_only(cls: type) -> None:
    assert all(field.kw_only for field in dataclasses.fields(cls) if field.init), cls


def test_every_dataclass_in_the_package_is_frozen_and_keyword_only() -> None:
    """Private records too (FileCheck and PipelineSlot were positional): read from the source, no import needed."""
    loose = []
    for path in sorted((pathlib.Path(tfdist.__file__).parent).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for decorator in node.decorator_list:
                    text = ast.unparse(decorator)
                    if "dataclass" in text and not ("frozen=True" in text and "kw_only=True" in text):
                        loose.append(f"{path.name}:{node.lineno} {node.name}: @{text}")
    assert not loose, loose


def _spec_classes() -> list[type]:
    from tfdist.comm import CollectiveConfig, CollectiveTuning
    from tfdist.launch import KillAt, LaunchConfig
    from tfdist.plan import Plan

    return [tfdist.StrategyOptions, CollectiveConfig, CollectiveTuning, LaunchConfig, KillAt, Plan]


@pytest.mark.parametrize("cls", _spec_classes(), ids=lambda cls: cls.__name__)
def test_specs_are_frozen_and_hold_no_mutable_mappings(cls: Any) -> None:
    params = dataclasses.fields(cls)
    assert cls.__dataclass_params__.frozen, cls
    for field in params:
        if field.default_factory is not dataclasses.MISSING:
            assert not isinstance(field.default_factory(), (dict, list, set)), f"{cls.__name__}.{field.name}"


def test_frozen_mappings_cannot_be_changed() -> None:
    from tfdist.comm import CollectiveTuning
    from tfdist.launch import LaunchConfig

    tuning = CollectiveTuning(timings_ms={"0": 1.0})
    config = LaunchConfig(command=("true",), env={"A": "1"})
    for mapping in (tuning.timings_ms, config.env):
        with pytest.raises(TypeError):
            mapping["B"] = 2  # type: ignore[index]


def test_file_compressions_are_named_once() -> None:
    from tfdist.data.records import _framing, files, writer

    named = {kind for kind in writer.COMPRESSIONS if kind}
    assert set(_framing._DECOMPRESS) == named
    for kind, suffix in writer.COMPRESSIONS.items():
        assert files.compression_of(f"/d/x-00000-of-00001.tfrecord{suffix}", "auto") == kind
        assert writer.CLASS_GROUP.search(f"/d/x-label=3-00000-of-00001.tfrecord{suffix}")
