"""tfdist doctor, probing, resolvers and the Keras shim."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from absl.testing import absltest

from tfdist import ClusterSpec
from tfdist.cluster.probe import probe_tasks


def _doctor(*args: str, tf_config: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    return subprocess.run(
        [sys.executable, "-m", "tfdist.cli.main", "doctor", *args], env=env, capture_output=True, text=True, timeout=60
    )


class DoctorTest(absltest.TestCase):
    def test_valid_config_prints_role_and_fingerprint(self) -> None:
        spec = ClusterSpec.local(workers=2, chief=True)
        done = _doctor(tf_config=json.dumps(spec.to_tf_config("worker", 1)))
        self.assertEqual(done.returncode, 0, done.stdout)
        self.assertIn("role:        worker:1\n", done.stdout)
        self.assertIn(f"fingerprint: {spec.fingerprint}", done.stdout)
        self.assertIn("<- this task", done.stdout)

    def test_invalid_config_exits_2_with_the_reason(self) -> None:
        done = _doctor("--tf-config", '{"cluster": {"worker": ["a:99999"]}}')
        self.assertEqual(done.returncode, 2)
        self.assertIn("port in 1..65535", done.stderr)
        self.assertEqual(done.stdout, "")
        self.assertEqual(_doctor().returncode, 2)  # No TF_CONFIG at all.

    def test_probe_reports_reachable_and_unreachable_tasks(self) -> None:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            up = f"127.0.0.1:{listener.getsockname()[1]}"
            down = ClusterSpec.local(workers=1).tasks()[0].address
            config = {"cluster": {"chief": [up], "worker": [down]}, "task": {"type": "worker", "index": 0}}
            path = self.create_tempfile(content=json.dumps(config)).full_path
            done = _doctor("--tf-config", f"@{path}", "--probe", "1")
            self.assertEqual(done.returncode, 0, done.stdout)  # The worker sees the chief; its own port is skipped.
            self.assertIn("probe chief:0      reachable", done.stdout)
            self.assertNotIn("probe worker:0", done.stdout)
            config["task"] = {"type": "chief", "index": 0}
            done = _doctor("--tf-config", json.dumps(config), "--probe", "0.5")
            self.assertEqual(done.returncode, 3, done.stdout)
            self.assertIn("probe worker:0     NOT reachable within 0.5s", done.stdout)
            self.assertIn("unreachable: worker:0", done.stdout)
            spec = ClusterSpec.from_tf_config(config)
            self.assertEqual(probe_tasks(spec, timeout=0.3), {"worker:0": False})
            self.assertEqual(probe_tasks(spec, timeout=0.3, include_self=True), {"chief:0": True, "worker:0": False})


class ResolverAndKerasTest(absltest.TestCase):
    def test_resolver_keeps_evaluator_out_and_defaults_to_grpc(self) -> None:
        from tfdist.strategy.resolver import cluster_resolver

        spec = ClusterSpec(
            jobs={"chief": ["c:1"], "worker": ["w:1", "w:2"], "evaluator": ["e:1"]},
            task_type="worker",
            task_id=1,
            environment="cloud",
        )
        resolver = cluster_resolver(spec)
        self.assertEqual(resolver.cluster_spec().as_dict(), {"chief": ["c:1"], "worker": ["w:1", "w:2"]})
        self.assertEqual(
            (resolver.task_type, resolver.task_id, resolver.rpc_layer, resolver.environment),
            ("worker", 1, "grpc", "cloud"),
        )
        sparse = cluster_resolver(ClusterSpec(jobs={"worker": {"2": "w:2", "5": "w:5"}}, task_type="worker", task_id=5))
        self.assertEqual(sparse.cluster_spec().task_indices("worker"), [2, 5])

    def test_tfdist_keras_is_tf_keras_of_tf_minor(self) -> None:
        import tensorflow as tf
        import tf_keras

        from tfdist import keras

        self.assertEqual(keras.__version__.split(".")[:2], tf.__version__.split(".")[:2])
        self.assertIs(keras.layers, tf_keras.layers)
        self.assertIs(keras.Sequential, tf_keras.Sequential)


class DoctorStackTest(absltest.TestCase):
    def test_stack_report_exits_0_on_a_supported_stack(self) -> None:
        done = _doctor("--stack")
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        for line in (
            "tensorflow:",
            "tf-keras:",
            "keras (Keras 3):",
            "TF_USE_LEGACY_KERAS:",
            "tensorboard:",
            "tensorflow-io:",
            "  s3://",
            "internals:          ok: all",
            "stack: supported",
        ):
            self.assertIn(line, done.stdout)

    def test_the_task_report_ends_with_a_stack_line(self) -> None:
        spec = ClusterSpec.local(workers=1)
        done = _doctor(tf_config=json.dumps(spec.to_tf_config("worker", 0)))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertRegex(done.stdout, r"stack:       TF 2\.\d+\.\d+, tf-keras 2\.\d+\.\d+: supported")
