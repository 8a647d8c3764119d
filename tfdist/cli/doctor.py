"""``tfdist doctor``: validate TF_CONFIG, show the role and fingerprint, probe the other tasks; report the stack."""

from __future__ import annotations

import argparse
import sys

from tfdist.cluster.probe import probe_tasks
from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import ClusterSpecError, invalid
from tfdist.runtime.program import finite_float, one_line

EXIT_OK, EXIT_INVALID, EXIT_UNREACHABLE = 0, 2, 3
MAX_PROBE_SECONDS = 3600.0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="validate TF_CONFIG and probe the cluster",
        description="Validate TF_CONFIG (from the environment or --tf-config), print "
        "this task's role, the cluster and its fingerprint. Exit 0 valid, 2 invalid, "
        "3 unreachable (with --probe). --stack reports the installed TensorFlow stack "
        "instead (exit 0 supported, 2 not).",
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
        help="check that the other tasks' ports accept connections within SECONDS "
        f"(0 < SECONDS <= {MAX_PROBE_SECONDS:g})",
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
    from tfdist.stack import stack_report

    if args.stack:
        report = stack_report(probe=True)
        sys.stdout.write(report.to_text() + "\n")
        return EXIT_OK if report.ok else EXIT_INVALID
    try:
        spec = ClusterSpec.from_tf_config(_load(args.tf_config))
    except ClusterSpecError as err:
        sys.stderr.write(f"tfdist doctor: error: TF_CONFIG is invalid: {one_line(str(err))}\n")
        return EXIT_INVALID
    task = spec.task
    sys.stdout.write(f"role:        {task.name if task else '(no task)'}{' (chief)' if spec.is_chief else ''}\n")
    sys.stdout.write(f"fingerprint: {spec.fingerprint}  (must be equal on every task)\n")
    sys.stdout.write(f"workers:     {spec.num_workers} training task(s), {spec.num_ps} ps\n")
    for t in spec.tasks():
        mark = "  <- this task" if task and (t.type, t.index) == (task.type, task.index) else ""
        sys.stdout.write(f"  {t.name:<12} {t.address}{mark}\n")
    stack = stack_report()
    sys.stdout.write(
        f"stack:       TF {stack.tensorflow}, tf-keras {stack.tf_keras}: "
        f"{'supported' if stack.ok else 'NOT supported'} (tfdist doctor --stack for details)\n"
    )
    for line in stack.problems + stack.warnings:
        sys.stdout.write(f"  {'PROBLEM' if line in stack.problems else 'warning'}: {line}\n")
    if args.probe is None:
        return EXIT_OK
    results = probe_tasks(spec, timeout=args.probe)
    down = [name for name, ok in results.items() if not ok]
    for name, ok in results.items():
        sys.stdout.write(f"probe {name:<12} {'reachable' if ok else f'NOT reachable within {args.probe:g}s'}\n")
    if down:
        sys.stdout.write(f"unreachable: {', '.join(down)} - is the task running, and its port open to this host?\n")
        return EXIT_UNREACHABLE
    return EXIT_OK
