"""The trainability rule build_strategy and doctor share, and the probe's reading of a failed connection."""

from __future__ import annotations

import socket
import time

import pytest
from absl.testing import parameterized

from tfdist import ClusterSpec, ClusterSpecError
from tfdist.cluster import check_trainable, cluster_kind, probe_address, probe_reachability
from tfdist.cluster.trainable import listening_late

MWMS = {"chief": ["c:1"], "worker": ["w:1", "w:2"]}
PS = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"]}
PS_NO_CHIEF = {"worker": ["w:1", "w:2"], "ps": ["p:1"]}


def _spec(jobs: dict, task: str | None = None) -> ClusterSpec:
    if task is None:
        return ClusterSpec(jobs=jobs)
    job, _, index = task.partition(":")
    return ClusterSpec(jobs=jobs, task_type=job, task_id=int(index))


class CheckTrainableTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("no_cluster", None, None, "auto", None, "alone"),
        ("single_worker_without_task", {"worker": ["a:1"]}, None, "auto", None, "alone"),
        ("mwms_worker", MWMS, "worker:1", "auto", "multi_worker_mirrored", "peer"),
        ("mwms_chief", MWMS, "chief:0", "auto", "multi_worker_mirrored", "peer"),
        ("ps_chief", PS, "chief:0", "auto", "parameter_server", "coordinator"),
        ("ps_worker", PS, "worker:1", "auto", "parameter_server", "server"),
        ("ps_ps", PS, "ps:0", "auto", "parameter_server", "server"),
        ("evaluator", PS, "evaluator:0", "auto", "default", "evaluator"),
        ("local_kind_ignores_cluster", MWMS, None, "mirrored", "mirrored", "alone"),
        ("mwms_alone", None, None, "multi_worker_mirrored", "multi_worker_mirrored", "alone"),
    )
    def test_trainable(self, jobs: dict | None, task: str | None, kind: str, want: str | None, role: str) -> None:
        verdict = check_trainable(None if jobs is None else _spec(jobs, task), kind)
        self.assertEqual((verdict.kind, verdict.role), (want, role))
        self.assertTrue(verdict.reason and verdict.role_text)

    @parameterized.named_parameters(
        ("mwms_without_task", MWMS, None, "auto", "task", r"which of the cluster's 3 task\(s\) \(chief:0, worker:0"),
        ("ps_without_task", PS, None, "auto", "task", "parameter_server needs it"),
        (
            "one_worker_explicit_mwms",
            {"worker": ["a:1"]},
            None,
            "multi_worker_mirrored",
            "task",
            r"1 task\(s\) \(worker:0\)",
        ),
        ("ps_without_chief", PS_NO_CHIEF, "worker:0", "auto", "cluster.chief", r'add "chief": \["host:port"\]'),
        ("ps_without_chief_or_task", PS_NO_CHIEF, None, "parameter_server", "cluster.chief", "tfdist-launch --chief"),
    )
    def test_untrainable(self, jobs: dict, task: str | None, kind: str, field: str, message: str) -> None:
        with pytest.raises(ClusterSpecError, match=message) as caught:
            check_trainable(_spec(jobs, task), kind)
        self.assertEqual(caught.value.field, field)
        self.assertIsNone(caught.value.value)

    def test_cluster_kind_and_who_listens_late(self) -> None:
        self.assertEqual(cluster_kind(None)[0], None)
        self.assertEqual(cluster_kind(_spec(PS, "evaluator:0"))[0], "default")
        self.assertEqual(listening_late(_spec(MWMS, "worker:0")), ("chief:0", "worker:0", "worker:1"))
        self.assertEqual(listening_late(_spec(PS, "evaluator:0")), ("chief:0",))  # The evaluator sees the cluster.
        self.assertEqual(listening_late(_spec({"worker": ["a:1"]}, "worker:0")), ())


class ProbeTest(parameterized.TestCase):
    def test_open_refused_and_dns_are_told_apart(self) -> None:
        closed = ClusterSpec.local(workers=1).tasks()[0].address  # A free port: nothing listens there.
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            up = f"127.0.0.1:{listener.getsockname()[1]}"
            self.assertEqual(probe_address(up, 2).status, "open")
            start = time.monotonic()
            refused = probe_address(closed, 5, until_open=False)
            self.assertLess(time.monotonic() - start, 2)  # The first refusal is the answer.
            self.assertEqual((refused.status, refused.host_up, refused.open), ("refused", True, False))
            self.assertIn("host up, port", refused.describe(5))
            self.assertIn("connection refused", refused.describe(5))
            self.assertEqual(probe_address(closed, 0.3).status, "refused")  # Kept trying, still closed.
            dns = probe_address("no-such-host.invalid:2222", 0.3)
            self.assertEqual((dns.status, dns.host_up), ("dns", False))
            self.assertIn("cannot resolve host 'no-such-host.invalid': DNS (", dns.describe(0.3))
            spec = ClusterSpec(jobs={"chief": [up], "worker": [closed, "no-such-host.invalid:2222"]})
            found = probe_reachability(spec.with_task("worker", 1), timeout=0.3, not_yet_listening=("worker:0",))
            self.assertEqual({name: r.status for name, r in found.items()}, {"chief:0": "open", "worker:0": "refused"})

    def test_a_bound_port_is_refused_until_it_listens(self) -> None:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{listener.getsockname()[1]}"
            self.assertEqual(probe_address(address, 0.3).status, "refused")  # Bound, not listening yet.
            listener.listen()
            self.assertTrue(probe_address(address, 2).open)
