"""Mesh shapes, their layout over processes, and what each process of a mesh is told."""

from __future__ import annotations

from typing import Any

import pytest

from tfdist.cluster import ClusterSpec
from tfdist.cluster.mesh_shape import DTENSOR_SETTINGS, MESH_VAR, MeshShape, dtensor_variables, mesh_clients
from tfdist.errors import LaunchError, StrategyError


@pytest.mark.parametrize(
    ("text", "axes"),
    [
        ("model=2", (("model", 2),)),
        ("batch=2,model=4", (("batch", 2), ("model", 4))),
        (" batch = 2 , model=1 ", (("batch", 2), ("model", 1))),
        ({"model": 8, "batch": 1}, (("model", 8), ("batch", 1))),
    ],
)
def test_parse_accepts_text_and_mappings(text: object, axes: tuple) -> None:
    shape = MeshShape.parse(text)
    assert shape.axes == axes
    assert MeshShape.parse(str(shape)) == shape


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "name=size"),
        ("model", "name=size"),
        ("model=0", "from 1"),
        ("model=-1", "name=size"),
        ("model=2,model=2", "each axis named once"),
        ("1x=2", "letters, digits"),
        (["model", 2], "name=size"),
        ({"model": True}, "from 1"),
        ({}, "at least one mesh axis"),
    ],
)
def test_parse_refuses_bad_meshes_naming_the_field(value: object, expected: str) -> None:
    with pytest.raises(StrategyError) as err:
        MeshShape.parse(value)
    assert err.value.field == "mesh" and expected in str(err.value)
    with pytest.raises(LaunchError, match="`topology_mesh`"):
        MeshShape.parse(value, field="topology_mesh", error=LaunchError)


@pytest.mark.parametrize(
    ("mesh", "processes", "order"),
    [
        ("model=2", 2, "model=2"),
        ("batch=2,model=2", 2, "model=2,batch=2"),  # One device per replica in each process: model across.
        ("batch=2,model=2", 1, "batch=2,model=2"),  # One process holds it all: replicas grouped.
        ("batch=2,model=4", 2, "batch=2,model=4"),  # 4 devices each would mix 2 model slices x 2 replicas.
        ("batch=4,model=2", 4, "model=2,batch=4"),
        ("batch=2", 2, "batch=2"),
    ],
)
def test_device_order_puts_the_model_axis_across_processes_where_input_can_follow(
    mesh: str, processes: int, order: str
) -> None:
    assert str(MeshShape.parse(mesh).device_order(processes)) == order


def test_every_task_learns_the_same_clients_and_its_own_id() -> None:
    jobs: dict[str, Any] = {"chief": ["c:1"], "worker": ["w0:1", "w1:1", "w2:1"]}
    shape = MeshShape.parse("batch=2,model=2")
    envs = [
        dtensor_variables(ClusterSpec(jobs=jobs, task_type=kind, task_id=index), shape)
        for kind, index in (("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2))
    ]
    assert {e["DTENSOR_JOBS"] for e in envs} == {"c:1,w0:1,w1:1,w2:1"}
    assert [e["DTENSOR_CLIENT_ID"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["DTENSOR_NUM_CLIENTS"] for e in envs} == {"4"}
    assert all(e[MESH_VAR] == "batch=2,model=2" for e in envs)
    assert all(all(e[k] == v for k, v in DTENSOR_SETTINGS.items()) for e in envs)


@pytest.mark.parametrize(
    ("jobs", "mesh", "message"),
    [
        ({"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}, "model=2", "without parameter servers"),
        ({"worker": ["a:1", "b:1", "c:1"]}, "model=2", "multiple of the 3 processes"),
    ],
)
def test_clusters_that_cannot_hold_the_mesh_are_refused(jobs: dict, mesh: str, message: str) -> None:
    with pytest.raises(StrategyError, match=message):
        mesh_clients(ClusterSpec(jobs=jobs), MeshShape.parse(mesh))


def test_only_chief_and_workers_are_clients() -> None:
    jobs: dict[str, Any] = {"worker": ["a:1", "b:1"], "evaluator": ["e:1"]}
    spec = ClusterSpec(jobs=jobs, task_type="evaluator")
    with pytest.raises(StrategyError, match="`task`") as err:
        dtensor_variables(spec, MeshShape.parse("model=2"))
    assert err.value.value == "evaluator:0"
    assert "chief or worker" in str(err.value.expected)
