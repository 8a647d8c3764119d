"""The error model: every bad input to a public constructor or function raises a tfdist error, nothing else.

Each row of ``CALLS`` is a public callable with valid keyword arguments. For every argument, every value in
``HOSTILE`` is passed in its place: the call either accepts it or raises a :class:`tfdist.Error` that is a
``ValueError`` (bad input) and names the argument it rejects. A raw ``TypeError``/``KeyError``/
``AttributeError`` fails the test.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import tempfile
from collections.abc import Callable
from typing import Any, cast

import pytest

import tfdist
from tfdist import errors, launch, plan, testing
from tfdist.cluster.spec import split_task_name
from tfdist.comm import LocalSGD, PowerSGD, TopK, compressed_traffic, compressor_for
from tfdist.comm.autotune import CollectiveTuning
from tfdist.comm.collective import CollectiveConfig, gradient_value_bytes
from tfdist.data.sharding import plan_shards
from tfdist.launch.config import LaunchConfig
from tfdist.launch.emit import formats as emit
from tfdist.launch.engines.ray.engine import RayOptions
from tfdist.launch.events import KillAt
from tfdist.launch.network import Link
from tfdist.strategy.builders import StrategyOptions, resolve_options

HOSTILE: tuple[Any, ...] = (
    None,
    "",
    "x",
    "5",
    -1,
    0,
    2**70,
    1.5,
    -0.5,
    math.nan,
    math.inf,
    True,
    [],
    ["x"],
    {},
    {"x": 1},
    (1, 2),
    object(),
    b"bytes",
)
_FILES = [("/data/a-0", 100), ("/data/a-1", 120), ("/data/a-2", 90)]
_CONFIG = LaunchConfig(command=("python", "train.py"), workers=2)
_PS_CLUSTER = {"cluster": {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}}

# name -> (callable, valid keyword arguments)
CALLS: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "ClusterSpec.local": (
        tfdist.ClusterSpec.local,
        {"workers": 2, "ps": 1, "chief": True, "evaluator": False, "host": "127.0.0.1"},
    ),
    "ClusterSpec": (tfdist.ClusterSpec, {"jobs": {"worker": ["a:1", "b:2"]}}),
    "ClusterSpec.from_tf_config": (
        tfdist.ClusterSpec.from_tf_config,
        {"tf_config": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}'},
    ),
    "ClusterSpec.with_task": (tfdist.ClusterSpec.local(workers=2).with_task, {"task_type": "worker", "task_id": 1}),
    "StrategyOptions": (StrategyOptions, {"communication": "ring", "bytes_per_pack": 0, "partition": "min_size"}),
    "resolve_options": (resolve_options, {"bytes_per_pack": 1024, "timeout_seconds": 5.0}),
    "LaunchConfig": (
        LaunchConfig,
        {
            "command": ("python", "x.py"),
            "workers": 2,
            "ps": 0,
            "chief": False,
            "evaluator": False,
            "run_on": "auto",
            "max_restarts": 0,
            "threads_per_task": 1,
            "timeout": 5.0,
            "log_dir": None,
            "kills": (),
            "isolate_network": False,
            "simulate_hosts": 0,
            "links": (),
            "grace_seconds": 1.0,
            "host": "127.0.0.1",
            "env": {},
            "data_service_workers": 0,
        },
    ),
    "KillAt.parse": (KillAt.parse, {"text": "worker:1@after=Epoch 2/"}),
    "Link.parse": (Link.parse, {"text": "worker:1=100mbit"}),
    "Plan": (
        plan.Plan,
        {
            "params": 1e6,
            "workers": 2,
            "bandwidth": 1e9,
            "latency": 1e-5,
            "gpus_per_worker": 1,
            "device_memory": None,
            "optimizer": "adam",
            "bytes_per_value": 4,
            "ps_shards": None,
            "compute_s": None,
            "embedding_values": 0.0,
            "embedding_touched": 0.0,
        },
    ),
    "parse_quantity": (plan.parse_quantity, {"text": "10Gbps", "kind": "bandwidth"}),
    "embedding_traffic": (plan.embedding_traffic, {"table_values": 1e6, "values_touched_per_step": 1e3, "workers": 2}),
    "CollectiveConfig": (CollectiveConfig, {"compression": "fp16", "bytes_per_pack": 0, "split_bytes": 0}),
    "CollectiveConfig(powersgd)": (CollectiveConfig, {"compression": "powersgd", "rank": 2}),
    "CollectiveConfig(topk)": (CollectiveConfig, {"compression": "topk", "density": 0.1}),
    "PowerSGD": (PowerSGD, {"rank": 4}),
    "TopK": (TopK, {"density": 0.01}),
    "LocalSGD": (LocalSGD, {"period": 4}),
    "compressor_for": (compressor_for, {"compression": "powersgd", "options": {"rank": 2}}),
    "compressed_traffic": (
        compressed_traffic,
        {"shapes": [[8, 8]], "workers": 2, "bandwidth": 1e9, "latency": 1e-4, "compression": "topk", "density": 0.5},
    ),
    "CollectiveTuning": (
        CollectiveTuning,
        {
            "compression": "bf16",
            "bytes_per_pack": 1 << 20,
            "split_bytes": 0,
            "timings_ms": {"0": 1.5},
            "workers": 2,
            "total_bytes": 4096,
        },
    ),
    "plan_shards": (plan_shards, {"files": _FILES, "num_workers": 2, "policy": "auto"}),
    "command_for": (testing.command_for, {"target": "tests.cluster_tasks:noop"}),
    "resolve_cluster": (tfdist.resolve_cluster, {"cluster": {"cluster": {"worker": ["a:1"]}}}),
    "current_cluster": (tfdist.current_cluster, {"env": {"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}}'}}),
    "ClusterSpec.from_slurm": (
        tfdist.ClusterSpec.from_slurm,
        {
            "env": {"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"},
            "jobs": {"worker": 2},
            "port_base": 8888,
        },
    ),
    "split_task_name": (split_task_name, {"name": "worker:1"}),
    "build_strategy(kind)": (lambda kind: tfdist.build_strategy(kind, cluster=_PS_CLUSTER), {"kind": "mirrored_x"}),
    "tf_configs": (emit.tf_configs, {"config": _CONFIG, "hosts": ["h0", "h1"], "port": 2222}),
    "tfjob_manifest": (
        emit.tfjob_manifest,
        {
            "config": _CONFIG,
            "image": "me/train:1",
            "name": "job",
            "namespace": None,
            "cpu": None,
            "memory": None,
            "gpus": 0,
        },
    ),
    "jobset_manifest": (emit.jobset_manifest, {"config": _CONFIG, "image": "me/train:1", "name": "job", "gpus": 0}),
    "slurm_script": (
        emit.slurm_script,
        {
            "config": _CONFIG,
            "name": "job",
            "time_limit": "01:00:00",
            "cpus_per_task": None,
            "gpus_per_task": 0,
            "port_base": None,
        },
    ),
    "gradient_value_bytes": (gradient_value_bytes, {"compression": "bf16"}),
}


def _cases() -> list[tuple[str, str, Any]]:
    return [(name, field, value) for name, (_, kwargs) in CALLS.items() for field in kwargs for value in HOSTILE]


@pytest.mark.parametrize(
    "name,field,value", _cases(), ids=lambda v: v if isinstance(v, str) and v.isidentifier() else None
)
def test_hostile_values_raise_only_tfdist_errors(name: str, field: str, value: Any) -> None:
    function, kwargs = CALLS[name]
    try:
        function(**{**kwargs, field: value})
    except errors.Error as err:
        assert isinstance(err, ValueError), f"{name}({field}={value!r}) is bad input, not {err!r}"
        assert str(err), f"{name}({field}={value!r}) raised an empty message"
        assert err.field, f"{name}({field}={value!r}) raised {err!r} without naming the field"
    except Exception as err:
        pytest.fail(f"{name}({field}={value!r}) leaked {type(err).__name__}: {err}")


def test_unknown_keywords_name_the_closest_option() -> None:
    with pytest.raises(errors.LaunchError, match=r"`options`. Received: \['timeot'\].*did you mean 'timeout'"):
        launch.run(["true"], workers=1, timeot=5)
    with pytest.raises(errors.LaunchError, match=r"Received: \['bogus'\]") as caught:
        launch.run(["true"], workers=1, bogus=1)
    assert (caught.value.field, caught.value.value) == ("options", ["bogus"])
    with pytest.raises(errors.LaunchError, match="did you mean 'max_restarts'"):
        testing.run_cluster(["true"], workers=1, timeout=5, max_restart=1)
    with pytest.raises(errors.StrategyError, match="did you mean 'bytes_per_pack'"):
        tfdist.build_strategy("default", byte_per_pack=1)


def test_errors_carry_what_they_report() -> None:
    with pytest.raises(errors.LaunchError) as caught:
        LaunchConfig(command=("true",), timeout="5")
    assert (caught.value.field, caught.value.value) == ("timeout", "5")
    assert caught.value.expected == "a number > 0 and <= 31622400 or None"
    with pytest.raises(errors.PlanError) as caught_plan:
        plan.parse_quantity("10", "size")
    assert caught_plan.value.field == "kind" and "did you mean" in caught_plan.value.expected
    with pytest.raises(errors.PlanError, match="`params`. Received: '1M'.*parse_quantity"):
        plan.Plan(params=cast(Any, "1M"), workers=2, bandwidth=1e9, latency=1e-5)
    result = launch.LaunchResult(
        exit_code=0, reason=cast(Any, "ok"), failed_task=None, tasks=(), cluster=tfdist.ClusterSpec.local(workers=1)
    )
    with pytest.raises(errors.LaunchError, match="`task`. Received: 'worker:9'"):
        result.task("worker:9")


_LAUNCH_CALLS = ("LaunchConfig", "KillAt.parse", "tf_configs", "tfjob_manifest", "jobset_manifest", "slurm_script")
# Bad input that only rules across arguments (or across LaunchConfig's option groups) catch.
_BAD_LAUNCH_INPUT: list[tuple[Callable[..., Any], dict[str, Any]]] = [
    (LaunchConfig, {"ps": 1}),
    (LaunchConfig, {"run_on": "chief"}),
    (LaunchConfig, {"kills": ["worker:3@after=x"]}),
    (LaunchConfig, {"workers": 2, "min_workers": 3}),
    (LaunchConfig, {"workers": 2, "min_workers": 1, "max_workers": 3}),
    (LaunchConfig, {"max_workers": 2}),
    (LaunchConfig, {"returns": ["worker:0@after=x"], "min_workers": 1}),
    (LaunchConfig, {"loses": ["chief:0@after=x"], "min_workers": 1, "chief": True}),
    (LaunchConfig, {"min_workers": 1, "isolate_network": True}),
    (LaunchConfig, {"links": ["1gbit"]}),
    (LaunchConfig, {"simulate_hosts": 3}),
    (LaunchConfig, {"simulate_hosts": 1, "links": ["worker:1=fast"]}),
    (LaunchConfig, {"grace_seconds": 1e12}),
    (LaunchConfig, {"timeout": 1e12}),
    (LaunchConfig, {"log_dir": "\0"}),
    (LaunchConfig, {"workrs": 2}),
    (emit.slurm_script, {"config": LaunchConfig(command=("x",), workers=2, min_workers=1, ps=1, chief=True)}),
    (emit.slurm_script, {"config": LaunchConfig(command=("x",), workers=2, min_workers=1, loses=["worker:1@after=x"])}),
    (emit.slurm_script, {"config": _CONFIG, "port_base": 65535}),
    (emit.tf_configs, {"config": _CONFIG, "hosts": ["h0"]}),
    (emit.jobset_manifest, {"config": _CONFIG, "image": "me/train:1", "name": "a" * 60}),
    *[
        (RayOptions, bad)
        for bad in (
            {"cpus_per_task": -1},
            {"cpus_per_task": 0},
            {"gpus_per_task": 1e9},
            {"gpus_per_task": float("nan")},
            {"address": ""},
            {"address": "auto", "num_cpus": 2},
            {"placement": "spreaded"},
            {"ready_timeout": 0},
        )
    ],
]


def _launch_cases() -> list[tuple[Callable[..., Any], dict[str, Any]]]:
    hostile = [
        (CALLS[name][0], {**CALLS[name][1], field: value}) for name, field, value in _cases() if name in _LAUNCH_CALLS
    ]
    return hostile + [
        (function, {"command": ("x",), **kwargs} if function is LaunchConfig else kwargs)
        for function, kwargs in _BAD_LAUNCH_INPUT
    ]


def test_launch_errors_name_the_python_argument() -> None:
    """The library speaks Python: every field is an argument of the call (or a LaunchConfig option), no flag."""
    named = 0
    for function, kwargs in _launch_cases():
        arguments = {*inspect.signature(function).parameters, *LaunchConfig.option_names(), "options"}
        try:
            function(**kwargs)
        except errors.LaunchError as err:
            named += 1
            assert err.field in arguments, f"{function.__name__}({kwargs}): field {err.field!r} is no argument"
            assert "--" not in err.field and "`--" not in str(err), f"{function.__name__}({kwargs}): {err}"
    assert named > 200


def test_launch_config_options_come_in_groups() -> None:
    from tfdist.launch.config import Elastic, Topology

    groups = LaunchConfig.option_groups()
    assert list(groups) == ["topology", "supervision", "faults", "elastic", "network", "inspection"]
    flat = [f.name for kind in groups.values() for f in dataclasses.fields(kind)]
    assert LaunchConfig.option_names() == ("command", *flat)  # Each option declared once, in its group.
    assert [f.name for f in dataclasses.fields(cast(Any, LaunchConfig))] == list(LaunchConfig.option_names())
    config = LaunchConfig(command=("x",), workers=3, min_workers=2, kills=["worker:1@5"], env={"A": "1"})
    assert (config.topology, config.elastic) == (Topology(workers=3), Elastic(min_workers=2, max_workers=3))
    assert (config.workers, config.max_workers, config.kills[0].seconds, config.env["A"]) == (3, 3, 5.0, "1")
    assert LaunchConfig(**config.option_values()) == config  # What serialization needs.
    assert dataclasses.replace(cast(Any, config), workers=4).topology.workers == 4
    assert LaunchConfig(command=("x",), topology=Topology(workers=2, chief=True)).chief
    with pytest.raises(errors.LaunchError, match="did you mean 'grace_seconds'"):
        LaunchConfig(command=("x",), grace_second=1)
    with pytest.raises(errors.LaunchError, match="`command`. Received: None. Expected a value"):
        LaunchConfig(workers=2)


def test_runtime_failures_are_not_value_errors() -> None:
    for cls in (errors.LaunchFailure, errors.StorageError, errors.ServiceError, errors.EngineError):
        assert issubclass(cls, errors.RuntimeFailure) and not issubclass(cls, ValueError)
    with pytest.raises(errors.StorageError) as caught:
        CollectiveTuning.load(os.path.join(tempfile.mkdtemp(), "missing.json"))
    assert caught.value.field == "tuning" and not isinstance(caught.value, ValueError)
    from tfdist.data.service import LocalDataService

    with pytest.raises(errors.ServiceError, match="not started"):
        LocalDataService(num_workers=1).address  # noqa: B018 - the property is the call under test.
