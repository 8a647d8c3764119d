"""build_mesh's checks, before DTensor starts (the meshes themselves run in tests/keras/parallel/test_tensor.py)."""

from __future__ import annotations

import json

import pytest

from tfdist.cluster.mesh_shape import DTENSOR_SETTINGS, MESH_VAR
from tfdist.errors import StrategyError
from tfdist.parallel import build_mesh

SETTING = next(iter(DTENSOR_SETTINGS))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (MESH_VAR, SETTING, "TF_CONFIG", "DTENSOR_JOBS", "DTENSOR_NUM_CLIENTS", "DTENSOR_CLIENT_ID"):
        monkeypatch.delenv(name, raising=False)


def test_a_mesh_is_needed_from_the_caller_or_the_launcher() -> None:
    with pytest.raises(StrategyError, match="`axes`.*tfdist-launch --mesh"):
        build_mesh()


def test_the_setting_for_correct_updates_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StrategyError, match=f"`{SETTING}`.*one step late") as err:
        build_mesh("model=2")
    assert err.value.value is None and "tfdist-launch" in str(err.value.fix)
    monkeypatch.setenv(SETTING, "1")
    with pytest.raises(StrategyError, match="Received: '1'"):
        build_mesh("model=2")


def test_a_task_of_a_cluster_without_dtensor_variables_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SETTING, DTENSOR_SETTINGS[SETTING])
    tf_config = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    with pytest.raises(StrategyError, match="`DTENSOR_JOBS`.*2 training tasks"):
        build_mesh("model=2")


def test_a_mesh_must_divide_over_the_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SETTING, DTENSOR_SETTINGS[SETTING])
    monkeypatch.setenv("DTENSOR_JOBS", "a:1,b:1")
    monkeypatch.setenv("DTENSOR_NUM_CLIENTS", "2")
    with pytest.raises(StrategyError, match="multiple of the 2 processes"):
        build_mesh("model=3")


@pytest.mark.parametrize(("kwargs", "field"), [({"device_type": "TPU"}, "device_type"), ({"axes": "m=x"}, "axes")])
def test_bad_arguments_name_their_field(kwargs: dict, field: str) -> None:
    with pytest.raises(StrategyError) as err:
        build_mesh(**kwargs)
    assert err.value.field == field
