"""Cluster specs: every form real managers write parses; every bad input names its fix."""

from __future__ import annotations

import json
import socket
import sys

import pytest
from absl.testing import parameterized

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


class BadInputTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("invalid_json", '{"cluster": {"worker": ["a:1"]', r"valid JSON \(error at line 1"),
        ("single_quotes", "{'cluster': {}}", "double quotes"),
        ("empty_string", "   ", "JSON object with a 'cluster' key"),
        ("not_an_object", "[1, 2]", "JSON object like"),
        ("missing_cluster", '{"task": {"type": "worker", "index": 0}}', "'cluster' key in TF_CONFIG"),
        ("empty_cluster", _cfg({}), "at least one job"),
        ("cluster_not_mapping", _cfg(["a:1"]), "mapping of job name to task addresses"),
        ("job_is_string", _cfg({"worker": "a:1"}), r'Wrap the address in a list: "worker": \["a:1"\]'),
        ("job_is_number", _cfg({"worker": 3}), "list of 'host:port' strings or a mapping"),
        ("unknown_job", _cfg({"workers": ["a:1"]}), "did you mean 'worker'"),
        ("empty_job", _cfg({"worker": ["a:1"], "ps": []}), "Remove the empty 'ps' job"),
        ("no_port", _cfg({"worker": ["hostname"]}), r"Received: 'hostname'. Expected 'host:port'"),
        ("port_zero", _cfg({"worker": ["a:0"]}), r"port in 1\.\.65535"),
        ("port_too_big", _cfg({"worker": ["a:70000"]}), r"port in 1\.\.65535"),
        ("address_not_string", _cfg({"worker": [2222]}), r"`cluster.worker\[0\]`.*'host:port' string"),
        ("scheme", _cfg({"worker": ["grpc://a:1"]}), "Drop the 'grpc://' prefix"),
        ("duplicate_address", _cfg({"chief": ["a:1"], "worker": ["a:1"]}), r"It is also chief\[0\]"),
        ("two_chiefs", _cfg({"chief": ["a:1", "b:1"], "worker": ["c:1"]}), "at most one chief task"),
        ("two_evaluators", _cfg({"worker": ["a:1"], "evaluator": ["b:1", "c:1"]}), "at most one evaluator"),
        ("chief_and_master", _cfg({"chief": ["a:1"], "master": ["b:1"]}), "only one of 'chief' and 'master'"),
        ("ps_without_workers", _cfg({"chief": ["a:1"], "ps": ["b:1"]}), "needs at least one worker"),
        ("only_evaluator", _cfg({"evaluator": ["a:1"]}), "a 'chief' or 'worker' job"),
        (
            "task_not_in_cluster",
            _cfg({"worker": ["a:1"]}, {"type": "ps", "index": 0}),
            r"`task.type`. Received: 'ps'. Expected a job of the cluster",
        ),
        (
            "task_index_out_of_range",
            _cfg({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": 2}),
            r"indices of job 'worker': \[0, 1\]",
        ),
        (
            "task_index_not_integer",
            _cfg({"worker": ["a:1"]}, {"type": "worker", "index": "one"}),
            r"`task.index`. Received: 'one'. Expected an integer >= 0",
        ),
        ("task_index_float", _cfg({"worker": ["a:1"]}, {"type": "worker", "index": 0.5}), "integer >= 0"),
        ("task_index_bool", _cfg({"worker": ["a:1"]}, {"type": "worker", "index": True}), "integer >= 0"),
        ("task_index_negative", _cfg({"worker": ["a:1"]}, {"type": "worker", "index": -1}), "integer >= 0"),
        ("task_type_missing", _cfg({"worker": ["a:1"]}, {"index": 0}), 'Add "type" to "task"'),
        ("task_type_unknown", _cfg({"worker": ["a:1"]}, {"type": "wroker", "index": 0}), "did you mean 'worker'"),
        ("task_not_mapping", _cfg({"worker": ["a:1"]}, "worker"), "mapping such as"),
        ("sparse_duplicate_index", {"cluster": {"worker": {"1": "a:1", 1: "b:1"}}}, "Index 1 is given twice"),
        # Issue 17: spellings that name no real task, or the same task twice.
        ("index_with_space", _cfg({"worker": ["a:1", "b:1"]}, {"type": "worker", "index": " 1"}), "plain digits"),
        ("sparse_index_leading_zero", _cfg({"worker": {"01": "a:1"}}), r"Received: '01'.*plain digits"),
        ("host_of_300_chars", _cfg({"worker": ["h" * 300 + ":1"]}), "at most 253 characters"),
        ("host_empty_label", _cfg({"worker": ["a..b:1"]}), "dot-separated labels"),
        ("ipv4_out_of_range", _cfg({"worker": ["999.1.1.1:1"]}), "IPv4 address of four numbers 0-255"),
        ("ipv6_not_an_address", _cfg({"worker": ["[1:::2:3]:1"]}), "IPv6 address inside the brackets"),
        ("port_leading_zeros", _cfg({"worker": ["a:00080"]}), "without leading zeros"),
        ("same_task_other_case", _cfg({"worker": ["A:1", "a:1"]}), r"host names ignore case"),
        ("evaluator_index_7", _cfg({"worker": ["a:1"]}, {"type": "evaluator", "index": 7}), "0 for the evaluator"),
        ("nested_100k_deep", "[" * 100_000 + "]" * 100_000, "nested a few levels deep"),
        ("superscript_index", _cfg({"worker": {"²": "a:1"}}), r"Received: '²'. Expected an integer >= 0"),
        ("sparse_bad_key", _cfg({"worker": {"x": "a:1"}}), r"`cluster.worker key 'x'`"),
        ("rpc_layer_number", _cfg({"worker": ["a:1"]}, rpc_layer=5), "`rpc_layer`. Received: 5"),
    )
    def test_rejected_with_a_message_naming_the_fix(self, tf_config: str, message: str) -> None:
        with pytest.raises(ClusterSpecError, match=message) as caught:
            ClusterSpec.from_tf_config(tf_config)
        self.assertIsInstance(caught.value, ValueError)
        self.assertIsInstance(caught.value, Error)
        self.assertIn("Invalid value for `", str(caught.value))

    def test_unset_variable_says_how_to_run(self) -> None:
        with pytest.raises(ClusterSpecError, match="Run under a cluster manager or tfdist-launch"):
            ClusterSpec.from_tf_config(env={})

    def test_constructor_validates_too(self) -> None:
        with pytest.raises(ClusterSpecError, match="indices of job 'worker'"):
            ClusterSpec(jobs={"worker": ["a:1"]}, task_type="worker", task_id=3)
        with pytest.raises(ClusterSpecError, match="mapping of job name"):
            ClusterSpec(jobs=["a:1"])  # type: ignore[arg-type]

    def test_deeply_nested_python_values_are_clusterspec_errors(self) -> None:
        deep: list = []
        for _ in range(100_000):
            deep = [deep]
        with pytest.raises(ClusterSpecError, match="`cluster.worker\\[0\\]`"):
            ClusterSpec(jobs={"worker": [deep]})

    def test_loopback_aliases_of_one_port_are_warned_about(self) -> None:
        with self.assertLogs("tfdist.cluster.spec", "WARNING") as logs:
            ClusterSpec(jobs={"worker": ["localhost:5", "127.0.0.1:5"]})
        self.assertIn("both name this machine's port 5", logs.output[0])
        with self.assertNoLogs("tfdist.cluster.spec", "WARNING"):
            ClusterSpec(jobs={"worker": ["localhost:5", "127.0.0.1:6", "otherhost:5"]})

    def test_valid_addresses_stay_valid(self) -> None:
        spec = ClusterSpec(
            jobs={
                "worker": [
                    "10.0.0.1:2222",
                    "[::1]:2222",
                    "w-1.ns.svc.cluster.local:2222",
                    "my_host:1",
                    "h" * 63 + ".x:65535",
                ]
            }
        )
        self.assertEqual(spec.num_workers, 5)

    def test_local_rejects_bad_counts(self) -> None:
        with pytest.raises(ClusterSpecError, match="`workers`. Received: -1"):
            ClusterSpec.local(workers=-1)
        with pytest.raises(ClusterSpecError, match="Pass workers >= 1, or chief=True"):
            ClusterSpec.local(workers=0)
        with pytest.raises(ClusterSpecError, match="needs at least one worker"):
            ClusterSpec.local(workers=0, chief=True, ps=1)


class ManagerFormsTest(parameterized.TestCase):
    def test_kubeflow_tfjob_parameter_server(self) -> None:
        spec = ClusterSpec.from_tf_config(json.dumps(TFJOB_PS))
        self.assertEqual((spec.task_type, spec.task_id, spec.environment), ("worker", 1, "cloud"))
        self.assertEqual((spec.num_workers, spec.num_ps, spec.is_chief), (3, 1, False))
        self.assertEqual(spec.task.address, "job-worker-1.ns.svc:2222")  # type: ignore[union-attr]

    def test_vertex_ai_extra_keys_and_legacy_master(self) -> None:
        config = {
            "cluster": {"master": ["cmle-master-0:2222"], "worker": ["cmle-worker-0:2222"]},
            "task": {"type": "master", "index": 0, "trial": "1", "cloud": "x"},
            "job": {"args": ["--epochs", "3"]},
            "environment": "cloud",
        }
        spec = ClusterSpec.from_tf_config(config)
        self.assertEqual((spec.task_type, spec.is_chief), ("chief", True))
        self.assertEqual(list(spec.jobs), ["chief", "worker"])

    def test_sparse_dynamic_workers(self) -> None:
        spec = ClusterSpec.from_tf_config(
            _cfg({"worker": {"1": "w1:2222", "3": "w3:2222"}}, {"type": "worker", "index": "3"})
        )
        self.assertEqual(dict(spec.jobs["worker"]), {1: "w1:2222", 3: "w3:2222"})
        self.assertEqual((spec.task_id, spec.num_workers, spec.is_chief), (3, 2, False))
        self.assertTrue(spec.with_task("worker", 1).is_chief)  # Lowest index leads without a chief.
        self.assertEqual(spec.to_tf_config()["cluster"], {"worker": {"1": "w1:2222", "3": "w3:2222"}})

    def test_evaluator_outside_the_cluster(self) -> None:
        spec = ClusterSpec.from_tf_config(_cfg({"chief": ["c:1"], "worker": ["w:1"]}, {"type": "evaluator"}))
        self.assertEqual((spec.task_type, spec.task_id, spec.is_chief), ("evaluator", 0, False))
        self.assertEqual(spec.task.address, "")  # type: ignore[union-attr]

    def test_ipv6_and_no_task(self) -> None:
        spec = ClusterSpec.from_tf_config(_cfg({"worker": ["[::1]:2222", "[fe80::1]:2223"]}))
        self.assertIsNone(spec.task)
        self.assertFalse(spec.is_chief)

    def test_mapping_and_environment_variable_sources_agree(self) -> None:
        text = json.dumps(TFJOB_PS)
        self.assertEqual(ClusterSpec.from_tf_config(TFJOB_PS), ClusterSpec.from_tf_config(env={"TF_CONFIG": text}))


class SpecBehaviourTest(parameterized.TestCase):
    def test_to_tf_config_round_trips_for_every_task(self) -> None:
        spec = ClusterSpec.local(workers=2, ps=1, chief=True, evaluator=True)
        for task in spec.tasks():
            config = spec.to_tf_config(task.type, task.index)
            self.assertNotIn("evaluator", config["cluster"])
            parsed = ClusterSpec.from_tf_config(json.dumps(config))
            self.assertEqual((parsed.task_type, parsed.task_id), (task.type, task.index))
            self.assertEqual(parsed.fingerprint, spec.fingerprint)
        with_eval = spec.to_tf_config("chief", 0, include_evaluator=True)
        self.assertIn("evaluator", with_eval["cluster"])

    def test_fingerprint_differs_between_clusters(self) -> None:
        a = ClusterSpec(jobs={"worker": ["a:1", "b:1"]})
        b = ClusterSpec(jobs={"worker": ["a:1", "b:2"]})
        self.assertNotEqual(a.fingerprint, b.fingerprint)
        self.assertRegex(a.fingerprint, r"^[0-9a-f]{12}$")
        self.assertEqual(a.fingerprint, a.with_task("worker", 1).fingerprint)

    @parameterized.named_parameters(
        ("chief", {"chief": ["c:1"], "worker": ["w:1"]}, "chief", 0, True),
        ("worker_with_chief", {"chief": ["c:1"], "worker": ["w:1"]}, "worker", 0, False),
        ("worker0_without_chief", {"worker": ["w:1", "v:1"]}, "worker", 0, True),
        ("worker1_without_chief", {"worker": ["w:1", "v:1"]}, "worker", 1, False),
        ("ps", {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}, "ps", 0, False),
    )
    def test_is_chief(self, jobs: dict, task_type: str, task_id: int, expected: bool) -> None:
        self.assertEqual(ClusterSpec(jobs=jobs, task_type=task_type, task_id=task_id).is_chief, expected)

    def test_local_gives_distinct_free_ports(self) -> None:
        spec = ClusterSpec.local(workers=3, ps=2, chief=True, evaluator=True)
        ports = [int(t.address.rsplit(":", 1)[1]) for t in spec.tasks()]
        self.assertLen(set(ports), 7)
        for port in ports:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))  # Each one is bindable: it was free.

    def test_frozen_hashable_and_readable(self) -> None:
        spec = ClusterSpec(jobs={"worker": ["a:1"]}, task_type="worker")
        with pytest.raises(AttributeError):
            spec.task_id = 3  # type: ignore[misc]
        self.assertEqual(len({spec, ClusterSpec(jobs={"worker": ["a:1"]}, task_type="worker")}), 1)
        self.assertEqual(repr(spec), "ClusterSpec(jobs={'worker': {'0': 'a:1'}}, task_type='worker', task_id=0)")
        self.assertIn("worker:0 (chief)", spec.describe())

    def test_missing_task_for_to_tf_config(self) -> None:
        with pytest.raises(ClusterSpecError, match="Pass task_type=..., task_id=..."):
            ClusterSpec(jobs={"worker": ["a:1"]}).to_tf_config()

    def test_cluster_layer_never_imports_tensorflow(self) -> None:
        import subprocess

        code = (
            "import sys, tfdist, tfdist.cluster.spec, tfdist.launch, tfdist.cluster.probe; "
            "tfdist.ClusterSpec.local(workers=2); sys.exit('tensorflow' in sys.modules)"
        )
        self.assertEqual(subprocess.run([sys.executable, "-c", code], check=False).returncode, 0)
