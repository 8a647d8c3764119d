"""Strategy builders: registry, options, auto choice, TF mappings, clear errors."""

from __future__ import annotations

import logging
import math
import sys
import textwrap
from typing import Any, cast

import pytest

import tfdist
from tfdist import ClusterSpec, StrategyError, testing
from tfdist.cluster.trainable import check_trainable
from tfdist.strategy.builders import StrategyOptions, choose_kind, communication_options, variable_partitioner

PS_CLUSTER = ClusterSpec(jobs=cast(Any, {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1", "p:2"]}))


def _rule_error(cluster: Any, kind: str) -> tfdist.ClusterSpecError:
    """The error the shared rule (what `tfdist doctor` applies) gives for ``cluster``."""
    with pytest.raises(tfdist.ClusterSpecError) as caught:
        check_trainable(tfdist.resolve_cluster(cluster), kind)
    return caught.value


def test_unknown_kind_lists_kinds_and_closest() -> None:
    with pytest.raises(StrategyError, match=r"'multi_worker_mirrored'.*did you mean 'multi_worker_mirrored'"):
        tfdist.build_strategy("multi_worker_mirored")
    kinds = ("auto", "default", "mirrored", "multi_worker_mirrored", "one_device", "parameter_server")
    assert tfdist.strategy_names() == kinds


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"communication": "nccl2"}, r"`communication`. Received: 'nccl2'.*did you mean 'nccl'"),
        ({"bytes_per_pack": -1}, r"`bytes_per_pack`. Received: -1. Expected an integer >= 0"),
        ({"timeout_seconds": 0}, "a number > 0 or None"),
        ({"partition": "min"}, "did you mean 'min_size'"),
        ({"partition": "max_size"}, "Pass max_shard_bytes"),
        ({"max_shards": 0}, r"`max_shards`. Received: 0"),
    ],
    ids=["communication", "bytes_per_pack", "timeout", "partition", "max_size_needs_bytes", "max_shards"],
)
def test_invalid_options(options: dict, message: str) -> None:
    with pytest.raises(StrategyError, match=message):
        StrategyOptions(**options)
    with pytest.raises(StrategyError, match=message):
        tfdist.build_strategy("default", **options)


def test_unknown_option_names_the_valid_ones() -> None:
    with pytest.raises(StrategyError, match=r"`options`. Received: \['byte_per_pack'\].*bytes_per_pack"):
        tfdist.build_strategy("default", byte_per_pack=4)


def test_registry_rejects_duplicates() -> None:
    with pytest.raises(StrategyError, match="a name not registered yet"):
        tfdist.register_strategy("auto")(lambda options, cluster: None)


@pytest.mark.parametrize(
    ("cluster", "gpus", "expected"),
    [
        (None, 0, "default"),
        (None, 1, "default"),
        (None, 2, "mirrored"),
        (ClusterSpec(jobs=cast(Any, {"worker": ["a:1"]}), task_type="worker"), 0, "default"),
        (ClusterSpec(jobs=cast(Any, {"worker": ["a:1"]}), task_type="worker"), 2, "mirrored"),
        (ClusterSpec(jobs=cast(Any, {"worker": ["a:1", "b:1"]}), task_type="worker"), 0, "multi_worker_mirrored"),
        (
            ClusterSpec(jobs=cast(Any, {"chief": ["a:1"], "worker": ["b:1"]}), task_type="chief"),
            0,
            "multi_worker_mirrored",
        ),
        (PS_CLUSTER.with_task("chief"), 0, "parameter_server"),
        (PS_CLUSTER.with_task("evaluator"), 0, "default"),
    ],
    ids=[
        "nothing",
        "one_gpu",
        "two_gpus",
        "single_worker",
        "single_worker_two_gpus",
        "two_workers",
        "chief_and_worker",
        "ps",
        "evaluator",
    ],
)
def test_auto_choice(cluster: ClusterSpec | None, gpus: int, expected: str) -> None:
    kind, reason = choose_kind(cluster, gpus)
    assert kind == expected
    assert reason


@pytest.mark.parametrize(
    ("communication", "gpus", "implementation"),
    [
        ("auto", 0, "AUTO"),
        ("ring", 0, "RING"),
        ("nccl", 2, "NCCL"),
    ],
    ids=["auto_cpu", "ring", "nccl_on_gpus"],
)
def test_communication_options(communication: str, gpus: int, implementation: str) -> None:
    options = StrategyOptions(communication=communication, bytes_per_pack=4 << 20, timeout_seconds=30)
    comm = communication_options(options, num_gpus=gpus)
    assert comm.implementation.name == implementation
    assert (comm.bytes_per_pack, comm.timeout_seconds) == (4 << 20, 30)


def test_nccl_without_gpus_is_an_error() -> None:
    with pytest.raises(StrategyError, match="NCCL runs only between GPUs; use communication='auto'"):
        communication_options(StrategyOptions(communication="nccl"), num_gpus=0)


@pytest.mark.parametrize(
    ("options", "name", "shards"),
    [
        ({"partition": "none"}, None, None),
        ({"partition": "fixed"}, "FixedShardsPartitioner", 2),
        ({"partition": "fixed", "num_shards": 5}, "FixedShardsPartitioner", 5),
        ({"min_shard_bytes": 1024}, "MinSizePartitioner", 2),
        ({"partition": "max_size", "max_shard_bytes": 4096, "max_shards": 3}, "MaxSizePartitioner", 3),
    ],
    ids=["none", "fixed_default", "fixed_given", "min_size", "max_size"],
)
def test_variable_partitioner(options: dict, name: str | None, shards: int | None) -> None:
    import tensorflow as tf

    partitioner = variable_partitioner(StrategyOptions(**options), num_ps=2)
    if name is None:
        assert partitioner is None
        return
    assert isinstance(partitioner, getattr(tf.distribute.experimental.partitioners, name))
    # A 100k x 64 float32 table (25.6 MB) hits every shard cap.
    assert max(partitioner(tf.TensorShape([100_000, 64]), tf.float32)) == shards


def test_single_process_builders_never_return_none() -> None:
    import tensorflow as tf

    default = tfdist.build_strategy("default")
    assert default is tf.distribute.get_strategy()
    assert default.num_replicas_in_sync == 1
    assert isinstance(tfdist.build_strategy("one_device"), tf.distribute.OneDeviceStrategy)
    assert isinstance(tfdist.build_strategy("mirrored", devices=["/cpu:0"]), tf.distribute.MirroredStrategy)
    assert tfdist.build_strategy("auto", cluster=None) is tf.distribute.get_strategy()


def test_parameter_server_needs_a_ps_cluster_and_the_chief() -> None:
    with pytest.raises(StrategyError, match="a cluster with a chief, workers and ps tasks"):
        tfdist.build_strategy("parameter_server", cluster=ClusterSpec(jobs=cast(Any, {"worker": ["a:1"]})))
    with pytest.raises(StrategyError, match="run a TensorFlow server, not user code"):
        tfdist.build_strategy("parameter_server", cluster=PS_CLUSTER.with_task("worker", 1))
    with pytest.raises(StrategyError, match="Use kind='parameter_server'"):
        tfdist.build_strategy("multi_worker_mirrored", cluster=PS_CLUSTER.with_task("chief"))
    with pytest.raises(StrategyError, match="Only parameter-server training uses a coordinator"):
        tfdist.cluster_coordinator(tfdist.build_strategy("default"))


def test_untrainable_clusters_fail_before_tensorflow_builds_anything() -> None:
    workers_ps = {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}
    for kind, cluster, field in (
        ("auto", '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}}', "task"),
        ("multi_worker_mirrored", '{"cluster": {"worker": ["127.0.0.1:1"]}}', "task"),
        ("parameter_server", PS_CLUSTER, "task"),
        ("parameter_server", {"cluster": workers_ps, "task": {"type": "worker", "index": 0}}, "cluster.chief"),
        ("auto", {"cluster": workers_ps}, "cluster.chief"),
    ):
        with pytest.raises(tfdist.ClusterSpecError) as caught:  # Not TF's raw ValueError.
            tfdist.build_strategy(kind, cluster=cluster, peer_wait_seconds=0)
        assert caught.value.field == field, (kind, cluster)
        assert str(caught.value) == str(_rule_error(cluster, kind))


def test_cluster_accepts_tf_config_text() -> None:
    with pytest.raises(tfdist.ClusterSpecError, match="did you mean 'worker'"):
        tfdist.build_strategy("auto", cluster='{"cluster": {"wroker": ["a:1"]}}')


def test_building_after_other_ops_says_to_build_first() -> None:
    code = textwrap.dedent("""
        import tensorflow as tf, tfdist
        tf.constant(1.0) + 1
        spec = tfdist.ClusterSpec.local(workers=1, chief=True).with_task("chief", 0)
        try:
            tfdist.build_strategy("multi_worker_mirrored", cluster=spec)
        except tfdist.StrategyError as err:
            print("STRATEGY_ERROR", err)
    """)
    out = testing.run_python([sys.executable, "-c", code], timeout=120).stdout
    assert "STRATEGY_ERROR Cannot build the 'multi_worker_mirrored' strategy now" in out
    assert "Build the strategy first thing in main()" in out


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        ({"chief": ["c:1"], "worker": ["w:1"]}, ("chief:0", "c:1")),
        ({"worker": {"3": "w:3", "1": "w:1"}}, ("worker:1", "w:1")),
    ],
    ids=["chief_leads", "lowest_worker_leads"],
)
def test_leader(jobs: dict, expected: tuple) -> None:
    leader = ClusterSpec(jobs=jobs).leader  # The one rule strategy.py and is_chief share.
    assert leader is not None
    assert (leader.name, leader.address) == expected


def test_wait_returns_when_the_port_opens_and_warns_when_it_does_not(caplog: pytest.LogCaptureFixture) -> None:
    import socket
    import time

    from tfdist.cluster.probe import wait_until_reachable

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        start = time.monotonic()
        assert wait_until_reachable("chief:0", f"127.0.0.1:{listener.getsockname()[1]}", 5)
        assert time.monotonic() - start < 1
    closed = ClusterSpec.local(workers=1).tasks()[0].address
    with caplog.at_level(logging.WARNING, logger="tfdist.cluster.probe"):
        assert not wait_until_reachable("worker:0", closed, 0.4, log_every=0.2)
    warnings = [
        r.getMessage()
        for r in caplog.records
        if (r.name == "tfdist.cluster.probe" or r.name.startswith("tfdist.cluster.probe."))
        and r.levelno >= logging.WARNING
    ]
    assert warnings, "wait_until_reachable logged no warning"
    assert f"Still waiting for worker:0 at {closed}" in warnings[0]


def test_option_validation() -> None:
    with pytest.raises(StrategyError, match="`peer_wait_seconds`. Received: -1"):
        StrategyOptions(peer_wait_seconds=-1)
    value: Any  # Hostile values of every type, passed as keywords.
    for name, value in (
        ("timeout_seconds", math.nan),
        ("timeout_seconds", math.inf),
        ("peer_wait_seconds", math.nan),
        ("peer_wait_seconds", math.inf),
        ("timeout_seconds", True),
        ("peer_wait_seconds", "5"),
    ):
        with pytest.raises(StrategyError, match=f"`{name}`") as caught:
            StrategyOptions(**{name: value})
        assert caught.value.field == name
    with pytest.raises(StrategyError, match="None to wait forever"):
        StrategyOptions(timeout_seconds=math.inf)
    for name, value in (("devices", "/gpu:0"), ("devices", [1]), ("device", 0)):
        with pytest.raises(StrategyError, match=f"`{name}`"):
            StrategyOptions(**{name: value})
    assert StrategyOptions(devices=cast(Any, ["/cpu:0"])).devices == ("/cpu:0",)
