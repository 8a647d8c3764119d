"""Cluster specs: every form real managers write parses; every bad input names its fix."""

from __future__ import annotations

import json
import logging
import re
import socket
import sys
from typing import Any, cast

import pytest

from tfdist import ClusterSpec, ClusterSpecError, Error

TFJOB_PS = {
    "cluster": {
        "chief": ["job-chief-0.ns.svc:2222"],
        "ps": ["job-ps-0.ns.svc:2222"],
        "worker": ["job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"],
    },
    "task": {"type": "worker", "index": 1},
    "environment": "cloud",
}


def _cfg(cluster: object, task: object = None, **extra: object) -> str:
    config: dict[str, object] = {"cluster": cluster, **extra}
    if task is not None:
        config["task"] = task
    return json.dumps(config)


@pytest.mark.parametrize(
    "tf_config,message",
    [
        pytest.param('{"cluster": {"worker": ["a:1"]', r"valid JSON \(error at line 1", id="invalid_json"),
        pytest.param("{'cluster': {}}", "double quotes", id="single_quotes"),
        pytest.param("   ", "JSON object with a 'cluster' key", id="empty_string"),
        pytest.param("[1, 2]", "JSON object like", id="not_an_object"),
        pytest.param('{"task": {"type": "worker", "index": 0}}', "'cluster' key in TF_CONFIG", id="missing_cluster"),
        pytest.param(_cfg({}), "at least one job", id="empty_cluster"),
        pytest.param(_cfg(["a:1"]), "mapping of job name to task addresses", id="cluster_not_mapping"),
        pytest.param(_cfg({"worker": "a:1"}), r'Wrap the address in a list: "worker": \["a:1"\]', id="job_is_string"),
        pytest.param(_cfg({"worker": 3}), "list of 'host:port' strings or a mapping", id="job_is_number"),
        pytest.param(_cfg({"workers": ["a:1"]}), "did you mean 'worker'", id="unknown_job"),
        pytest.param(_cfg({"worker": ["a:1"], "ps": []}), "Remove the empty 'ps' job", id="empty_job"),
        pytest.param(_cfg({"worker": ["hostname"]}), r"Received: 'hostname'. Expected 'host:port'", id="no_port"),
        pytest.param(_cfg({"worker": ["a:0"]}), r"port in 1\.\.65535", id="port_zero"),
        pytest.param(_cfg({"worker": ["a:70000"]}), r"port in 1\.\.65535", id="port_too_big"),
        pytest.param(_cfg({"worker": [2222]}), r"`cluster.worker\[0\]`.*'host:port' string", id="address_not_string"),
        pytest.param(_cfg({"worker": ["grpc://a:1"]}), "Drop the 'grpc://' prefix", id="scheme"),
        pytest.param(_cfg({"chief": ["a:1"], "worker": ["a:1"]}), r"It is also chief\[0\]", id="duplicate_address"),
        pytest.param(_cfg({"chief": ["a:1", "b:1"], "worker": ["c:1"]}), "at most one chief task", id="two_chiefs"),
        pytest.param(
            _cfg({"worker": ["a:1"], "evaluator": ["b:1", "c:1"]}), "at most one evaluator", id="two_evaluators"
        ),
        pytest.param(
            _cfg({"chief": ["a:1"], "master": ["b:1"]}), "only one of 'chief' and 'master'", id="chief_and_master"
        ),
        pytest.param(_cfg({"chief": ["a:1"], "ps": ["b:1"]}), "needs at least one worker", id="ps_without_workers"),
        pytest.param(_cfg({"evaluator": ["a:1"]}), "a 'chief' or 'worker' job", id="only_evaluator"),
        pytest.param(
            _cfg({"worker": ["a:1"]}, {"type": "ps", "index": 0}),
            r"`task.type`. Received: 'ps'. Expected a job of the cluster",
            id="task_not_in_cluster",
        ),
        pytest.param(
            _cfg({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": 2}),
            r"indices of job 'worker': \[0, 1\]",
            id="task_index_out_of_range",
        ),
        pytest.param(
            _cfg({"worker": ["a:1"]}, {"type": "worker", "index": "one"}),
            r"`task.index`. Received: 'one'. Expected an integer >= 0",
            id="task_index_not_integer",
        ),
        pytest.param(
            _cfg({"worker": ["a:1"]}, {"type": "worker", "index": 0.5}), "integer >= 0", id="task_index_float"
        ),
        pytest.param(
            _cfg({"worker": ["a:1"]}, {"type": "worker", "index": True}), "integer >= 0", id="task_index_bool"
        ),
        pytest.param(
            _cfg({"worker": ["a:1"]}, {"type": "worker", "index": -1}), "integer >= 0", id="task_index_negative"
        ),
        pytest.param(_cfg({"worker": ["a:1"]}, {"index": 0}), 'Add "type" to "task"', id="task_type_missing"),
        pytest.param(
            _cfg({"worker": ["a:1"]}, {"type": "wroker", "index": 0}), "did you mean 'worker'", id="task_type_unknown"
        ),
        pytest.param(_cfg({"worker": ["a:1"]}, "worker"), "mapping such as", id="task_not_mapping"),
        pytest.param(
            {"cluster": {"worker": {"1": "a:1", 1: "b:1"}}}, "Index 1 is given twice", id="sparse_duplicate_index"
        ),
        # Issue 17: spellings that name no real task, or the same task twice.
        pytest.param(
            _cfg({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": " 1"}), "plain digits", id="index_with_space"
        ),
        pytest.param(_cfg({"worker": {"01": "a:1"}}), r"Received: '01'.*plain digits", id="sparse_index_leading_zero"),
        pytest.param(_cfg({"worker": ["h" * 300 + ":1"]}), "at most 253 characters", id="host_of_300_chars"),
        pytest.param(_cfg({"worker": ["a..b:1"]}), "dot-separated labels", id="host_empty_label"),
        pytest.param(_cfg({"worker": ["999.1.1.1:1"]}), "IPv4 address of four numbers 0-255", id="ipv4_out_of_range"),
        pytest.param(_cfg({"worker": ["[1:::2:3]:1"]}), "IPv6 address inside the brackets", id="ipv6_not_an_address"),
        pytest.param(_cfg({"worker": ["a:00080"]}), "without leading zeros", id="port_leading_zeros"),
        pytest.param(_cfg({"worker": ["A:1", "a:1"]}), r"host names ignore case", id="same_task_other_case"),
        pytest.param(
            _cfg({"worker": ["a:1"]}, {"type": "evaluator", "index": 7}), "0 for the evaluator", id="evaluator_index_7"
        ),
        pytest.param("[" * 100_000 + "]" * 100_000, "nested a few levels deep", id="nested_100k_deep"),
        pytest.param(
            _cfg({"worker": {"²": "a:1"}}), r"Received: '²'. Expected an integer >= 0", id="superscript_index"
        ),
        pytest.param(_cfg({"worker": {"x": "a:1"}}), r"`cluster.worker key 'x'`", id="sparse_bad_key"),
        pytest.param(_cfg({"worker": ["a:1"]}, rpc_layer=5), "`rpc_layer`. Received: 5", id="rpc_layer_number"),
    ],
)
def test_rejected_with_a_message_naming_the_fix(tf_config: str, message: str) -> None:
    with pytest.raises(ClusterSpecError, match=message) as caught:
        ClusterSpec.from_tf_config(tf_config)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, Error)
    assert "Invalid value for `" in str(caught.value)


def test_unset_variable_says_how_to_run() -> None:
    with pytest.raises(ClusterSpecError, match="Run under a cluster manager or tfdist-launch"):
        ClusterSpec.from_tf_config(env={})


def test_constructor_validates_too() -> None:
    with pytest.raises(ClusterSpecError, match="indices of job 'worker'"):
        ClusterSpec(jobs=cast(Any, {"worker": ["a:1"]}), task_type="worker", task_id=3)
    with pytest.raises(ClusterSpecError, match="mapping of job name"):
        ClusterSpec(jobs=["a:1"])  # type: ignore[arg-type]


def test_deeply_nested_python_values_are_clusterspec_errors() -> None:
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ClusterSpecError, match="`cluster.worker\\[0\\]`"):
        ClusterSpec(jobs=cast(Any, {"worker": [deep]}))


def test_loopback_aliases_of_one_port_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    def warnings() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name.startswith("tfdist.cluster.spec") and r.levelno >= logging.WARNING
        ]

    with caplog.at_level(logging.WARNING, logger="tfdist.cluster.spec"):
        ClusterSpec(jobs=cast(Any, {"worker": ["localhost:5", "127.0.0.1:5"]}))
    assert warnings(), "no warning logged"
    assert "both name this machine's port 5" in warnings()[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfdist.cluster.spec"):
        ClusterSpec(jobs=cast(Any, {"worker": ["localhost:5", "127.0.0.1:6", "otherhost:5"]}))
    assert warnings() == []


def test_valid_addresses_stay_valid() -> None:
    spec = ClusterSpec(
        jobs=cast(
            Any,
            {
                "worker": [
                    "10.0.0.1:2222",
                    "[::1]:2222",
                    "w-1.ns.svc.cluster.local:2222",
                    "my_host:1",
                    "h" * 63 + ".x:65535",
                ]
            },
        )
    )
    assert spec.num_workers == 5


def test_local_rejects_bad_counts() -> None:
    with pytest.raises(ClusterSpecError, match="`workers`. Received: -1"):
        ClusterSpec.local(workers=-1)
    with pytest.raises(ClusterSpecError, match="Pass workers >= 1, or chief=True"):
        ClusterSpec.local(workers=0)
    with pytest.raises(ClusterSpecError, match="needs at least one worker"):
        ClusterSpec.local(workers=0, chief=True, ps=1)


def test_kubeflow_tfjob_parameter_server() -> None:
    spec = ClusterSpec.from_tf_config(json.dumps(TFJOB_PS))
    assert (spec.task_type, spec.task_id, spec.environment) == ("worker", 1, "cloud")
    assert (spec.num_workers, spec.num_ps, spec.is_chief) == (3, 1, False)
    assert spec.task.address == "job-worker-1.ns.svc:2222"  # type: ignore[union-attr]


def test_vertex_ai_extra_keys_and_legacy_master() -> None:
    config = {
        "cluster": {"master": ["cmle-master-0:2222"], "worker": ["cmle-worker-0:2222"]},
        "task": {"type": "master", "index": 0, "trial": "1", "cloud": "x"},
        "job": {"args": ["--epochs", "3"]},
        "environment": "cloud",
    }
    spec = ClusterSpec.from_tf_config(config)
    assert (spec.task_type, spec.is_chief) == ("chief", True)
    assert list(spec.jobs) == ["chief", "worker"]


def test_sparse_dynamic_workers() -> None:
    spec = ClusterSpec.from_tf_config(
        _cfg({"worker": {"1": "w1:2222", "3": "w3:2222"}}, {"type": "worker", "index": "3"})
    )
    assert dict(spec.jobs["worker"]) == {1: "w1:2222", 3: "w3:2222"}
    assert (spec.task_id, spec.num_workers, spec.is_chief) == (3, 2, False)
    assert spec.with_task("worker", 1).is_chief  # Lowest index leads without a chief.
    assert spec.to_tf_config()["cluster"] == {"worker": {"1": "w1:2222", "3": "w3:2222"}}


def test_evaluator_outside_the_cluster() -> None:
    spec = ClusterSpec.from_tf_config(_cfg({"chief": ["c:1"], "worker": ["w:1"]}, {"type": "evaluator"}))
    assert (spec.task_type, spec.task_id, spec.is_chief) == ("evaluator", 0, False)
    assert spec.task.address == ""  # type: ignore[union-attr]


def test_ipv6_and_no_task() -> None:
    spec = ClusterSpec.from_tf_config(_cfg({"worker": ["[::1]:2222", "[fe80::1]:2223"]}))
    assert spec.task is None
    assert not spec.is_chief


def test_mapping_and_environment_variable_sources_agree() -> None:
    text = json.dumps(TFJOB_PS)
    assert ClusterSpec.from_tf_config(TFJOB_PS) == ClusterSpec.from_tf_config(env={"TF_CONFIG": text})


def test_to_tf_config_round_trips_for_every_task() -> None:
    spec = ClusterSpec.local(workers=2, ps=1, chief=True, evaluator=True)
    for task in spec.tasks():
        config = spec.to_tf_config(task.type, task.index)
        assert "evaluator" not in config["cluster"]
        parsed = ClusterSpec.from_tf_config(json.dumps(config))
        assert (parsed.task_type, parsed.task_id) == (task.type, task.index)
        assert parsed.fingerprint == spec.fingerprint
    with_eval = spec.to_tf_config("chief", 0, include_evaluator=True)
    assert "evaluator" in with_eval["cluster"]


def test_fingerprint_differs_between_clusters() -> None:
    a = ClusterSpec(jobs=cast(Any, {"worker": ["a:1", "b:1"]}))
    b = ClusterSpec(jobs=cast(Any, {"worker": ["a:1", "b:2"]}))
    assert a.fingerprint != b.fingerprint
    assert re.search(r"^[0-9a-f]{12}$", a.fingerprint)
    assert a.fingerprint == a.with_task("worker", 1).fingerprint


@pytest.mark.parametrize(
    "jobs,task_type,task_id,expected",
    [
        pytest.param({"chief": ["c:1"], "worker": ["w:1"]}, "chief", 0, True, id="chief"),
        pytest.param({"chief": ["c:1"], "worker": ["w:1"]}, "worker", 0, False, id="worker_with_chief"),
        pytest.param({"worker": ["w:1", "v:1"]}, "worker", 0, True, id="worker0_without_chief"),
        pytest.param({"worker": ["w:1", "v:1"]}, "worker", 1, False, id="worker1_without_chief"),
        pytest.param({"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}, "ps", 0, False, id="ps"),
    ],
)
def test_is_chief(jobs: dict, task_type: str, task_id: int, expected: bool) -> None:
    assert ClusterSpec(jobs=jobs, task_type=task_type, task_id=task_id).is_chief == expected


def test_local_gives_distinct_free_ports() -> None:
    spec = ClusterSpec.local(workers=3, ps=2, chief=True, evaluator=True)
    ports = [int(t.address.rsplit(":", 1)[1]) for t in spec.tasks()]
    assert len(set(ports)) == 7
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # Each one is bindable: it was free.


def test_frozen_hashable_and_readable() -> None:
    spec = ClusterSpec(jobs=cast(Any, {"worker": ["a:1"]}), task_type="worker")
    with pytest.raises(AttributeError):
        spec.task_id = 3  # type: ignore[misc]
    assert len({spec, ClusterSpec(jobs=cast(Any, {"worker": ["a:1"]}), task_type="worker")}) == 1
    assert repr(spec) == "ClusterSpec(jobs={'worker': {'0': 'a:1'}}, task_type='worker', task_id=0)"
    assert "worker:0 (chief)" in spec.describe()


def test_missing_task_for_to_tf_config() -> None:
    with pytest.raises(ClusterSpecError, match="Pass task_type=..., task_id=..."):
        ClusterSpec(jobs=cast(Any, {"worker": ["a:1"]})).to_tf_config()


def test_cluster_layer_never_imports_tensorflow() -> None:
    import subprocess

    code = (
        "import sys, tfdist, tfdist.cluster.spec, tfdist.launch, tfdist.cluster.probe; "
        "tfdist.ClusterSpec.local(workers=2); sys.exit('tensorflow' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
