"""``tfdist doctor``: validate TF_CONFIG, show the role and fingerprint, probe the other tasks; report the stack."""

from __future__ import annotations

import argparse
import sys
import time

from tfdist.cli._flags import flag_names
from tfdist.cli.plan import rate_text
from tfdist.cluster.address import split_address
from tfdist.cluster.probe import REFUSED, probe_reachability
from tfdist.cluster.spec import ClusterSpec, current_cluster
from tfdist.cluster.throughput import LinkServer, link_peer, measure_link
from tfdist.cluster.trainable import check_trainable, listening_late
from tfdist.comm.host import HostRates
from tfdist.errors import ClusterSpecError, LaunchError, invalid
from tfdist.launch.network import Link
from tfdist.runtime.program import finite_float, one_line

EXIT_OK, EXIT_INVALID, EXIT_UNREACHABLE = 0, 2, 3
MAX_PROBE_SECONDS = 3600.0
# Why a task of each kind of cluster refuses connections before training, and that this is fine.
_LATE_WHY = {
    "mwms": "under multi_worker_mirrored a task opens its port only when it builds its strategy.",
    "ps": "under parameter_server the chief opens its port only when it builds its strategy "
    "(the worker and ps servers listen before).",
}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="validate TF_CONFIG and probe the cluster",
        description="Validate TF_CONFIG (from the environment or --tf-config) by the rule "
        "build_strategy applies, print this task's role, the cluster, its fingerprint and the "
        "strategy build_strategy('auto') picks. No TF_CONFIG is a valid single-process run. Exit 0 "
        "valid, 2 invalid, 3 unreachable (with --probe). --stack reports the installed TensorFlow "
        "stack instead (exit 0 supported, 2 not).",
    )
    parser.add_argument(
        "--tf-config",
        default=None,
        metavar="JSON|@FILE",
        help="TF_CONFIG text, or @path to a file holding it (default: $TF_CONFIG)",
    )
    parser.add_argument(
        "--probe",
        type=finite_float,
        default=None,
        metavar="SECONDS",
        help="check the other tasks' ports within SECONDS (0 < SECONDS <= "
        f"{MAX_PROBE_SECONDS:g}): names DNS failures, no answer, and refused ports, which are "
        "expected before a task builds its strategy (every task under multi_worker_mirrored, "
        "the chief under parameter_server)",
    )
    parser.add_argument(
        "--measure-link",
        action="store_true",
        help="with --probe, run on every task at once (before training: it listens on the task's port): each "
        "task sends to the next one for two seconds and reports the rate of the second one, as tfdist plan "
        "--link takes it",
    )
    parser.add_argument(
        "--measure-host",
        action="store_true",
        help="with --probe, run on every task of a multi_worker_mirrored cluster at once (before training; imports "
        "TensorFlow): times tfdist's packed all-reduce, a memory stream, top-k's selection and scatter, and PowerSGD's "
        "thin products at ranks 4 and 1, and reports the rates tfdist plan --choose takes (--collective-bandwidth, "
        "--memory-bandwidth, --select-bandwidth, --scatter-bandwidth, --matmul-bandwidth, --matvec-bandwidth), the "
        "wire's share taken out with --measure-link",
    )
    parser.add_argument(
        "--stack",
        action="store_true",
        help="report TF, tf-keras, Keras 3, tensorboard, tensorflow-io, which remote schemes work "
        "through what, and known traps (imports TensorFlow)",
    )
    parser.set_defaults(run=run)


def _load(value: str | None) -> str | None:
    """The TF_CONFIG text of ``--tf-config``: the value itself, or the UTF-8 text of the file after ``@``."""
    if value is None or not value.startswith("@"):
        return value
    try:
        with open(value[1:], encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as err:
        raise invalid(
            ClusterSpecError,
            "--tf-config",
            value,
            "a UTF-8 text file holding TF_CONFIG JSON",
            f"The file is not text (byte {err.start}: {err.reason}).",
        ) from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path.
        raise invalid(
            ClusterSpecError,
            "--tf-config",
            value,
            "a readable file after '@'",
            f"{getattr(err, 'strerror', None) or err}.",
        ) from None


def run(args: argparse.Namespace) -> int:
    if args.probe is not None and not 0 < args.probe <= MAX_PROBE_SECONDS:
        raise invalid(ClusterSpecError, "--probe", args.probe, f"seconds in (0, {MAX_PROBE_SECONDS:g}]")
    for flag in ("--measure-link", "--measure-host"):
        if getattr(args, flag[2:].replace("-", "_")) and args.probe is None:
            raise invalid(ClusterSpecError, flag, True, "--probe SECONDS with it", f"Pass e.g. --probe 30 {flag}.")
    from tfdist.stack import stack_report

    if args.stack:
        report = stack_report(probe=True)
        sys.stdout.write(report.to_text() + "\n")
        return EXIT_OK if report.ok else EXIT_INVALID
    try:  # What build_strategy reads: --tf-config like its cluster=, else $TF_CONFIG (unset or empty: no cluster).
        spec = current_cluster() if args.tf_config is None else ClusterSpec.from_tf_config(_load(args.tf_config))
        verdict = check_trainable(spec)  # The rule build_strategy applies, before TensorFlow builds anything.
    except ClusterSpecError as err:
        sys.stderr.write(f"tfdist doctor: error: TF_CONFIG is invalid: {one_line(str(err))}\n")
        return EXIT_INVALID
    _write_cluster(spec)
    kind = f"'{verdict.kind}'" if verdict.kind else "'default' (or 'mirrored' with 2+ local GPUs)"
    sys.stdout.write(f"strategy:    build_strategy('auto') picks {kind}: {verdict.reason}\n")
    sys.stdout.write(f"this task:   {verdict.role_text}\n")
    stack = stack_report()
    sys.stdout.write(
        f"stack:       TF {stack.tensorflow}, tf-keras {stack.tf_keras}: "
        f"{'supported' if stack.ok else 'NOT supported'} (tfdist doctor --stack for details)\n"
    )
    for line in stack.problems + stack.warnings:
        sys.stdout.write(f"  {'PROBLEM' if line in stack.problems else 'warning'}: {line}\n")
    if args.probe is None:
        return EXIT_OK
    if not args.measure_link:
        code = _probe(spec, args.probe)
        return max(code, _measure_host(spec, None)) if args.measure_host and code == EXIT_OK else code
    server = _link_server(spec)  # Before the probe, so the peers' probes find this task listening.
    try:
        code = _probe(spec, args.probe)
        measured, bits = _measure_link(spec, args.probe, server)
        code = max(code, measured)
    finally:
        if server is not None:
            server.close()
    return max(code, _measure_host(spec, bits)) if args.measure_host and code == EXIT_OK else code


def _write_cluster(spec: ClusterSpec | None) -> None:
    """The role, fingerprint and task lines."""
    if spec is None:
        sys.stdout.write("role:        single process (no TF_CONFIG: no cluster)\n")
        return
    task = spec.task
    sys.stdout.write(f"role:        {task.name if task else '(no task)'}{' (chief)' if spec.is_chief else ''}\n")
    sys.stdout.write(f"fingerprint: {spec.fingerprint}  (must be equal on every task)\n")
    sys.stdout.write(f"workers:     {spec.num_workers} training task(s), {spec.num_ps} ps\n")
    for t in spec.tasks():
        mark = "  <- this task" if task and (t.type, t.index) == (task.type, task.index) else ""
        sys.stdout.write(f"  {t.name:<12} {t.address}{mark}\n")


def _probe(spec: ClusterSpec | None, seconds: float) -> int:
    """Probes the other tasks; a closed port is a problem only where the task should listen already."""
    late = listening_late(spec) if spec else ()
    results = probe_reachability(spec, timeout=seconds, not_yet_listening=late) if spec else {}
    if not results:
        sys.stdout.write("probe:       nothing to probe, no other task\n")
        return EXIT_OK
    down, waiting = [], []
    for name, result in results.items():
        text = result.describe(seconds)
        if result.status == REFUSED and name in late:
            waiting.append(name)
            text += ": expected before it builds its strategy"
        elif not result.open:
            down.append(name)
            text = f"NOT {'listening' if result.host_up else 'reachable'}: {text}"
        sys.stdout.write(f"probe {name:<12} {text}\n")
    if waiting:
        sys.stdout.write(
            f"not listening yet: {', '.join(waiting)} - {_LATE_WHY['ps' if spec and spec.num_ps else 'mwms']} "
            "Before training a probe can only tell that their hosts are up.\n"
        )
    if down:
        sys.stdout.write(
            f"unreachable: {', '.join(down)} - is the task running, its port open to this host, its name right "
            "(on Kubernetes a pod's name resolves only once the pod exists)?\n"
        )
        return EXIT_UNREACHABLE
    return EXIT_OK


def _link_server(spec: ClusterSpec | None) -> LinkServer | None:
    """A server on this task's port for the peer that measures its link to this task; None when the port is
    taken (the task's own server runs) or there is no task."""
    task = spec.task if spec else None
    if task is None:
        return None
    try:
        return LinkServer(split_address(task.address)[1])
    except OSError as err:
        sys.stdout.write(
            f"link:        cannot listen on {task.address} ({err.strerror or err}): is training running?\n"
        )
        return None


def _measure_link(spec: ClusterSpec | None, seconds: float, server: LinkServer | None) -> tuple[int, float | None]:
    """Measures this task's link to the next task, then waits (within ``seconds``) for its own predecessor;
    returns the exit code and the rate measured, bits per second."""
    peer = link_peer(spec) if spec else None
    if spec is None or spec.task is None or peer is None:
        sys.stdout.write("link:        nothing to measure, no other task\n")
        return EXIT_OK, None
    deadline = time.monotonic() + seconds
    where = f"{spec.task.name} -> {peer.name}:"  # the ring's direction; the other runs at the same time
    try:
        bits = measure_link(peer.address, timeout=seconds)
    except OSError as err:
        sys.stdout.write(
            f"link {where} not measured ({err.strerror or err}): run tfdist doctor --probe SECONDS "
            "--measure-link on every task at once, before training\n"
        )
        return EXIT_UNREACHABLE, None
    try:
        rate = Link.from_bits(bits).rate
        sys.stdout.write(f"link {where} {rate} ({bits / 8e6:.1f} MB/s): tfdist plan --link {rate}\n")
    except LaunchError:
        sys.stdout.write(f"link {where} {bits:.0f} bit/s, below the 10kbit tfdist plan --link takes\n")
    if server is not None:
        server.wait(max(0.0, deadline - time.monotonic()))  # Stay until the predecessor has measured too.
    return EXIT_OK, bits


def _measure_host(spec: ClusterSpec | None, link_bits: float | None) -> int:
    """Measures the host's rates with every other task at once (a multi_worker_mirrored cluster), printed as
    ``tfdist plan``'s flags."""
    if spec is None or spec.task is None or spec.task.type == "evaluator" or spec.num_ps or spec.num_workers < 2:
        sys.stdout.write(
            "host:        nothing to measure: --measure-host runs on every task of a multi_worker_mirrored "
            "cluster (2 or more workers, no ps)\n"
        )
        return EXIT_INVALID if spec is not None and spec.num_ps else EXIT_OK
    from tfdist.comm.host_probe import measure_host_rates
    from tfdist.strategy import build_strategy

    strategy = build_strategy("multi_worker_mirrored", cluster=spec, communication="ring")
    rates = measure_host_rates(strategy, link_bandwidth=None if link_bits is None else link_bits / 8)
    flags = flag_names(HostRates)
    values = {name: rate_text(getattr(rates, name)) for name in flags}
    wire = "the link's share taken out" if link_bits else "the wire's share included: add --measure-link"
    sys.stdout.write(
        f"host {spec.task.name}: collectives {values['collective_bandwidth']} each way ({wire}), memory "
        f"{values['memory_bandwidth']}, top-k selection {values['select_bandwidth']} and scatter "
        f"{values['scatter_bandwidth']}, thin products {values['matmul_bandwidth']} (rank 1: "
        f"{values['matvec_bandwidth']}): tfdist plan {' '.join(f'{flags[n]} {v}' for n, v in values.items())}\n"
    )
    return EXIT_OK
