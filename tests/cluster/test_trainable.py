"""The trainability rule build_strategy and doctor share, and the probe's reading of a failed connection."""

from __future__ import annotations

import socket
import time
from typing import Any, cast

import pytest

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


@pytest.mark.parametrize(
    ("jobs", "task", "kind", "want", "role"),
    [
        (None, None, "auto", None, "alone"),
        ({"worker": ["a:1"]}, None, "auto", None, "alone"),
        (MWMS, "worker:1", "auto", "multi_worker_mirrored", "peer"),
        (MWMS, "chief:0", "auto", "multi_worker_mirrored", "peer"),
        (PS, "chief:0", "auto", "parameter_server", "coordinator"),
        (PS, "worker:1", "auto", "parameter_server", "server"),
        (PS, "ps:0", "auto", "parameter_server", "server"),
        (PS, "evaluator:0", "auto", "default", "evaluator"),
        (MWMS, None, "mirrored", "mirrored", "alone"),
        (None, None, "multi_worker_mirrored", "multi_worker_mirrored", "alone"),
    ],
    ids=[
        "no_cluster",
        "single_worker_without_task",
        "mwms_worker",
        "mwms_chief",
        "ps_chief",
        "ps_worker",
        "ps_ps",
        "evaluator",
        "local_kind_ignores_cluster",
        "mwms_alone",
    ],
)
def test_trainable(jobs: dict | None, task: str | None, kind: str, want: str | None, role: str) -> None:
    verdict = check_trainable(None if jobs is None else _spec(jobs, task), kind)
    assert (verdict.kind, verdict.role) == (want, role)
    assert verdict.reason and verdict.role_text


@pytest.mark.parametrize(
    ("jobs", "task", "kind", "field", "message"),
    [
        (MWMS, None, "auto", "task", r"which of the cluster's 3 task\(s\) \(chief:0, worker:0"),
        (PS, None, "auto", "task", "parameter_server needs it"),
        ({"worker": ["a:1"]}, None, "multi_worker_mirrored", "task", r"1 task\(s\) \(worker:0\)"),
        (PS_NO_CHIEF, "worker:0", "auto", "cluster.chief", r'add "chief": \["host:port"\]'),
        (PS_NO_CHIEF, None, "parameter_server", "cluster.chief", "tfdist-launch --chief"),
    ],
    ids=[
        "mwms_without_task",
        "ps_without_task",
        "one_worker_explicit_mwms",
        "ps_without_chief",
        "ps_without_chief_or_task",
    ],
)
def test_untrainable(jobs: dict, task: str | None, kind: str, field: str, message: str) -> None:
    with pytest.raises(ClusterSpecError, match=message) as caught:
        check_trainable(_spec(jobs, task), kind)
    assert caught.value.field == field
    assert caught.value.value is None


def test_cluster_kind_and_who_listens_late() -> None:
    assert cluster_kind(None)[0] is None
    assert cluster_kind(_spec(PS, "evaluator:0"))[0] == "default"
    assert listening_late(_spec(MWMS, "worker:0")) == ("chief:0", "worker:0", "worker:1")
    assert listening_late(_spec(PS, "evaluator:0")) == ("chief:0",)  # The evaluator sees the cluster.
    assert listening_late(_spec({"worker": ["a:1"]}, "worker:0")) == ()


def test_open_refused_and_dns_are_told_apart() -> None:
    closed = ClusterSpec.local(workers=1).tasks()[0].address  # A free port: nothing listens there.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        up = f"127.0.0.1:{listener.getsockname()[1]}"
        assert probe_address(up, 2).status == "open"
        start = time.monotonic()
        refused = probe_address(closed, 5, until_open=False)
        assert time.monotonic() - start < 2  # The first refusal is the answer.
        assert (refused.status, refused.host_up, refused.open) == ("refused", True, False)
        assert "host up, port" in refused.describe(5)
        assert "connection refused" in refused.describe(5)
        assert probe_address(closed, 0.3).status == "refused"  # Kept trying, still closed.
        dns = probe_address("no-such-host.invalid:2222", 0.3)
        assert (dns.status, dns.host_up) == ("dns", False)
        assert "cannot resolve host 'no-such-host.invalid': DNS (" in dns.describe(0.3)
        spec = ClusterSpec(jobs=cast(Any, {"chief": [up], "worker": [closed, "no-such-host.invalid:2222"]}))
        found = probe_reachability(spec.with_task("worker", 1), timeout=0.3, not_yet_listening=("worker:0",))
        assert {name: r.status for name, r in found.items()} == {"chief:0": "open", "worker:0": "refused"}


def test_a_bound_port_is_refused_until_it_listens() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        assert probe_address(address, 0.3).status == "refused"  # Bound, not listening yet.
        listener.listen()
        assert probe_address(address, 2).open
