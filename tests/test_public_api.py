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

import pytest

import tfdist


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_import_tfdist_is_light_and_its_subpackages_load_on_use() -> None:
    out = _run("import sys, tfdist\n"
               "light = 'tensorflow' not in sys.modules and 'tf_keras' not in sys.modules\n"
               "names = (tfdist.keras.__name__, tfdist.data.__name__, tfdist.launch.__name__, tfdist.plan.__name__)\n"
               "print(light, 'tensorflow' in sys.modules, *names)")
    assert out == "True False tfdist.keras tfdist.data tfdist.launch tfdist.plan"


def test_exports() -> None:
    for name in ("current_cluster", "resolve_cluster", "PlanError", "RuntimeFailure", "StorageError", "keras"):
        assert name in tfdist.__all__ and hasattr(tfdist, name), name
    assert set(tfdist.__all__) <= set(dir(tfdist))
    data = importlib.import_module("tfdist.data")
    for name in ("LocalDataService", "skew_report", "SkewReport", "TFRecordPipeline"):
        assert name in data.__all__ and hasattr(data, name), name


def test_every_all_name_exists() -> None:
    for info in pkgutil.walk_packages(tfdist.__path__, "tfdist."):
        if info.name.startswith(("tfdist.cli", "tfdist.keras")):
            continue  # Entry points run as programs; tfdist.keras is checked below.
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            assert hasattr(module, name), f"{info.name}.__all__ names {name!r}, which it lacks"


def test_keras_lists_its_names_and_resolves_them_to_objects() -> None:
    from tfdist import keras

    assert set(keras.TFDIST_NAMES) <= set(keras.__all__) and "layers" in keras.__all__
    assert dir(keras) == sorted(dir(keras)) and "fit_input" in dir(keras)
    import tfdist.keras.cluster_aware  # noqa: F401 - importing the module must not shadow the function.

    for name in keras.TFDIST_NAMES:
        assert not isinstance(getattr(keras, name), types.ModuleType), name
    assert keras.Sequential.__module__.startswith("tf_keras")
    with pytest.raises(AttributeError, match="import tf_keras itself"):
        keras.no_such_name  # noqa: B018


def _keyword_only_classes() -> list[type]:
    from tfdist.comm.autotune import CollectiveTuning
    from tfdist.comm.collective import CollectiveConfig
    from tfdist.data.records.files import FileInfo, Listing
    from tfdist.data.pipeline.tfrecord import TFRecordPipeline
    from tfdist.data.report import SkewReport
    from tfdist.data.sharding import ShardPlan
    from tfdist.keras.embeddings import EmbeddingShard, EmbeddingTable
    from tfdist.launch import KillAt, LaunchConfig, LaunchResult, TaskResult
    from tfdist.plan import EmbeddingTraffic, Plan
    from tfdist.testing import ClusterRun

    return [tfdist.ClusterSpec, tfdist.Task, tfdist.StrategyOptions, CollectiveConfig, CollectiveTuning, Plan,
            EmbeddingTraffic, EmbeddingShard, EmbeddingTable, ClusterRun, FileInfo, Listing, TFRecordPipeline,
            SkewReport, ShardPlan, KillAt, LaunchConfig, LaunchResult, TaskResult]


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
    from tfdist.comm.autotune import CollectiveTuning
    from tfdist.comm.collective import CollectiveConfig
    from tfdist.launch.config import KillAt, LaunchConfig
    from tfdist.plan import Plan

    return [tfdist.StrategyOptions, CollectiveConfig, CollectiveTuning, LaunchConfig, KillAt, Plan]


@pytest.mark.parametrize("cls", _spec_classes(), ids=lambda cls: cls.__name__)
def test_specs_are_frozen_and_hold_no_mutable_mappings(cls: type) -> None:
    params = dataclasses.fields(cls)
    assert cls.__dataclass_params__.frozen, cls
    for field in params:
        if field.default_factory is not dataclasses.MISSING:
            assert not isinstance(field.default_factory(), (dict, list, set)), f"{cls.__name__}.{field.name}"


def test_frozen_mappings_cannot_be_changed() -> None:
    from tfdist.comm.autotune import CollectiveTuning
    from tfdist.launch.config import LaunchConfig

    tuning = CollectiveTuning(timings_ms={"0": 1.0})
    config = LaunchConfig(command=("true",), env={"A": "1"})
    for mapping in (tuning.timings_ms, config.env):
        with pytest.raises(TypeError):
            mapping["B"] = 2  # type: ignore[index]


def test_file_compressions_are_named_once() -> None:
    from tfdist.data.records import _framing
    from tfdist.data.records import files
    from tfdist.data.records import writer

    named = {kind for kind in writer.COMPRESSIONS if kind}
    assert set(_framing._DECOMPRESS) == named
    for kind, suffix in writer.COMPRESSIONS.items():
        assert files.compression_of(f"/d/x-00000-of-00001.tfrecord{suffix}", "auto") == kind
        assert writer.CLASS_GROUP.search(f"/d/x-label=3-00000-of-00001.tfrecord{suffix}")
