"""``tfdist-launch``: run a whole cluster as local processes, or emit it for a real engine.

tfdist-launch --workers 2 -- python train.py
tfdist-launch --chief --workers 2 --ps 1 --max-restarts 2 --log-dir logs -- python train.py
tfdist-launch --emit tfjob --chief --workers 4 --ps 2 --image my/image:1 -- python train.py
tfdist-launch --emit jobset --workers 4 --image my/image:1 -- python train.py
tfdist-launch --emit slurm --workers 4 --time 04:00:00 -- python train.py
tfdist-launch --engine ray --ray-address auto --chief --workers 4 --ps 2 -- python train.py
tfdist-launch --engine spark --spark-master spark://head:7077 --workers 4 -- python train.py
tfdist-launch --workers 4 --console chief --log-dir logs -- python train.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence

from tfdist.cli._engines import ENGINE_BUILDERS, LAUNCHER_ENV
from tfdist.errors import Error
from tfdist.launch.config import RUN_ON_CHOICES, LaunchConfig
from tfdist.launch.emit import formats as emit
from tfdist.launch.engines.registry import ENGINES, engine_for
from tfdist.launch.output import console_sink, console_task
from tfdist.launch.supervisor.runner import run_config
from tfdist.runtime import logs, program

# The flag that sets each Python argument: the library's errors name the argument (`grace_seconds`), and
# tfdist-launch prints them with the flag the user typed (`--grace`). LaunchConfig's options (all but
# command, env and host), the emitters' and the Ray engine's arguments.
FLAGS: dict[str, str] = {
    "workers": "--workers",
    "ps": "--ps",
    "chief": "--chief",
    "evaluator": "--evaluator",
    "run_on": "--run-on",
    "data_service_workers": "--data-service-workers",
    "mesh": "--mesh",
    "max_restarts": "--max-restarts",
    "threads_per_task": "--threads-per-task",
    "timeout": "--timeout",
    "grace_seconds": "--grace",
    "log_dir": "--log-dir",
    "log_level": "--log-level",
    "kills": "--kill",
    "min_workers": "--min-workers",
    "max_workers": "--max-workers",
    "loses": "--lose",
    "returns": "--return",
    "isolate_network": "--isolate-network",
    "name": "--name",
    "namespace": "--namespace",
    "image": "--image",
    "cpu": "--cpu",
    "memory": "--memory",
    "gpus": "--gpus",
    "gpus_per_task": "--gpus",
    "hosts": "--hosts",
    "port": "--port",
    "port_base": "--port-base",
    "python": "--python",
    "tf_log_level": "--tf-log-level",
    "time_limit": "--time",
    "tasks_per_node": "--tasks-per-node",
    "sbatch": "--sbatch",
    "cpus_per_task": "--cpus-per-task",
    "engine": "--engine",
    "address": "--ray-address",
    "placement": "--ray-placement",
    "num_cpus": "--ray-num-cpus",
    "ready_timeout": "--ray-ready-timeout",
}
# Where an engine's option shares a Python name with another flag: the flag of that engine.
ENGINE_FLAGS: dict[str, dict[str, str]] = {
    "spark": {
        "master": "--spark-master",
        "conf": "--spark-conf",
        "python": "--spark-python",
        "ready_timeout": "--spark-ready-timeout",
        "cpus_per_task": "--cpus-per-task",
    },
}


CONSOLE_CHOICES = ("all", "chief")


def in_flags(err: Error, engine: str = "local") -> str:
    """``err``'s message with each argument it names in backticks as its flag: `grace_seconds` -> `--grace`.

    The flags of ``engine`` come first (the Spark engine's `python` is `--spark-python`).

    Example:
        >>> from tfdist.errors import LaunchError, invalid
        >>> in_flags(invalid(LaunchError, "ps", 1, "`chief` as well"))
        'Invalid value for `--ps`. Received: 1. Expected `--chief` as well.'
    """
    flags = {**FLAGS, **ENGINE_FLAGS.get(engine, {})}
    return re.sub(r"`([a-z_]+)`", lambda match: f"`{flags.get(match.group(1), match.group(1))}`", str(err))


# Where each flag acts: a run on an engine ("local", "ray", "spark", or another registered one, which runs like
# "local") or an --emit format. A flag given where it does not act is refused, naming it.
_RUN = frozenset({"local", "ray", "spark"})
_OWN_FLAGS = ("ray", "spark")  # engines with flags of their own
_EMITTED = frozenset(emit.EMIT_FORMATS)
_JOBS = frozenset({"tfjob", "jobset", "slurm"})
_K8S = frozenset({"tfjob", "jobset"})
_ACTS: dict[str, frozenset[str]] = {
    **dict.fromkeys(("workers", "ps", "chief", "evaluator", "run_on"), _RUN | _EMITTED),
    "mesh": _RUN | _JOBS,
    "max_restarts": _RUN | _JOBS,
    **dict.fromkeys(
        ("threads_per_task", "timeout", "log_dir", "kill", "grace", "data_service_workers", "engine"), _RUN
    ),
    # The console is the supervisor's, whichever engine reads the output; TFDIST_LOG_LEVEL is a run's child env.
    **dict.fromkeys(("console", "log_level"), _RUN),
    "isolate_network": frozenset({"local"}),
    **dict.fromkeys(("ray_address", "ray_placement", "ray_num_cpus", "ray_ready_timeout"), frozenset({"ray"})),
    **dict.fromkeys(("spark_master", "spark_conf", "spark_python", "spark_ready_timeout"), frozenset({"spark"})),
    **dict.fromkeys(("min_workers", "max_workers", "lose", "returns"), _RUN | {"slurm"}),
    "name": _JOBS,
    **dict.fromkeys(("namespace", "image", "cpu", "memory"), _K8S),
    "gpus": _JOBS | {"ray"},
    **dict.fromkeys(("hosts", "port"), frozenset({"tf-config"})),
    **dict.fromkeys(("port_base", "python", "tf_log_level", "time", "tasks_per_node", "sbatch"), frozenset({"slurm"})),
    "cpus_per_task": frozenset({"slurm", "ray", "spark"}),
}


def _refuse_idle_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit 2 naming every flag given (not at its default) that this run or --emit format would ignore."""
    mode = args.emit or (args.engine if args.engine in _OWN_FLAGS else "local")
    where = f"--emit {args.emit}" if args.emit else f"a run on the {args.engine} engine"
    flags = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    idle: list[str] = []
    by_place: dict[str, list[str]] = {}  # Where they act -> the idle flags that act there.
    for dest, modes in _ACTS.items():
        if mode not in modes and getattr(args, dest) != parser.get_default(dest):
            idle.append(flags[dest])
            by_place.setdefault(", ".join(sorted(modes)), []).append(flags[dest])
    if idle:
        acts = "; ".join(f"{', '.join(names)}: {place}" for place, names in by_place.items())
        parser.error(
            f"{', '.join(idle)} would be ignored by {where} (where they act: {acts}); remove "
            f"{'it' if len(idle) == 1 else 'them'}"
            + "".join(
                f" or add --engine {name}"
                for name in _OWN_FLAGS
                if mode == "local" and any(f.startswith(f"--{name}-") for f in idle)
            )
        )


def _parser() -> argparse.ArgumentParser:
    parser = program.ArgumentParser(
        prog="tfdist-launch",
        description="Run a TensorFlow cluster as local processes (TF_CONFIG per task), "
        "or emit the same topology for Kubernetes (TFJob, JobSet) or Slurm.",
        usage="tfdist-launch [options] -- CMD [ARGS...]",
        takes_command=True,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {program.version()}")
    topo = parser.add_argument_group("topology")
    topo.add_argument("--workers", type=int, default=2, help="worker tasks (default 2)")
    topo.add_argument("--ps", type=int, default=0, help="parameter-server tasks (needs --chief)")
    topo.add_argument("--chief", action="store_true", help="add a chief task")
    topo.add_argument("--evaluator", action="store_true", help="add an evaluator task")
    topo.add_argument(
        "--run-on",
        choices=RUN_ON_CHOICES,
        default="auto",
        help="auto: every worker without ps, the chief (coordinator) with ps",
    )
    run = parser.add_argument_group("local run")
    run.add_argument("--max-restarts", type=int, default=0, help="restarts after task failures")
    run.add_argument("--threads-per-task", type=int, default=None, help="intra-op threads per task")
    run.add_argument("--timeout", type=program.finite_float, default=None, help="seconds before every task is killed")
    run.add_argument("--log-dir", default=None, help="write one log file per task here")
    run.add_argument(
        "--console",
        choices=CONSOLE_CHOICES,
        default="all",
        help="all: every task's output, each line prefixed [task]; chief: only the chief's (worker:0 "
        "without a chief), every task's in --log-dir (default: a new directory under the temp dir, printed)",
    )
    run.add_argument(
        "--log-level",
        choices=logs.LOG_LEVELS,
        default=None,
        help="level of the tfdist logger, in the launcher and (TFDIST_LOG_LEVEL) in every task; default "
        "$TFDIST_LOG_LEVEL, else info",
    )
    run.add_argument(
        "--kill",
        action="append",
        default=[],
        metavar="TASK@TRIGGER",
        help="SIGKILL a task once (fault injection): worker:1@after='Epoch 3/' when any task prints "
        "a line matching the regex, or worker:1@20 after 20 s",
    )
    run.add_argument(
        "--isolate-network",
        action="store_true",
        help="run the cluster in a private network namespace with only loopback",
    )
    run.add_argument(
        "--mesh",
        default=None,
        metavar="AXIS=N,...",
        help="make chief and workers the clients of a DTensor mesh, e.g. --mesh batch=2,model=2 "
        "(the model axis spans processes); the script calls tfdist.parallel.build_mesh()",
    )
    run.add_argument(
        "--data-service-workers",
        type=int,
        default=0,
        metavar="N",
        help="start a tf.data service with N workers; tasks get TFDIST_DATA_SERVICE",
    )
    run.add_argument(
        "--grace", type=program.finite_float, default=5.0, help="seconds from SIGTERM to SIGKILL when stopping"
    )
    eng = parser.add_argument_group("engine (where the tasks run)")
    eng.add_argument(
        "--engine",
        choices=sorted(ENGINES),
        default="local",
        help="local: processes on this machine; ray: actors in one Ray placement group; spark: the tasks "
        "of one Spark barrier stage",
    )
    eng.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="join this Ray cluster ('auto' or host:port) and leave it running; default: start a "
        "local Ray for the run and stop it afterwards",
    )
    eng.add_argument(
        "--ray-placement",
        choices=("pack", "spread", "strict_pack", "strict_spread"),
        default="pack",
        help="pack: as few nodes as possible; spread: across nodes",
    )
    eng.add_argument(
        "--ray-num-cpus",
        type=int,
        default=None,
        metavar="N",
        help="CPUs of the local Ray started for the run (default: enough for the job, at least this "
        "machine's count); not with --ray-address",
    )
    eng.add_argument(
        "--ray-ready-timeout",
        type=program.finite_float,
        default=120.0,
        metavar="SECONDS",
        help="seconds to wait until the Ray cluster holds every task",
    )
    eng.add_argument(
        "--spark-master",
        default=None,
        metavar="URL",
        help="start a Spark session on this master (spark://host:port, yarn, local[N]) and stop it afterwards; "
        "default: a local[N] session",
    )
    eng.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting of that session, repeatable: --spark-conf spark.executor.memory=8g",
    )
    eng.add_argument(
        "--spark-python",
        default=None,
        metavar="PATH",
        help="the Python the Spark executors run (it must have tfdist); default $PYSPARK_PYTHON, else this one",
    )
    eng.add_argument(
        "--spark-ready-timeout",
        type=program.finite_float,
        default=120.0,
        metavar="SECONDS",
        help="seconds to wait for free Spark task slots and for every task's address",
    )
    elastic = parser.add_argument_group("elastic training (local engine; --min/--max-workers also for --emit slurm)")
    elastic.add_argument(
        "--min-workers",
        type=int,
        default=None,
        metavar="N",
        help="go on with the workers left when one is lost, down to N; below N the run fails",
    )
    elastic.add_argument(
        "--max-workers",
        type=int,
        default=None,
        metavar="M",
        help="returned workers join at the next epoch boundary, up to M (default --workers)",
    )
    elastic.add_argument(
        "--lose",
        action="append",
        default=[],
        metavar="TASK@TRIGGER",
        help="kill a worker and keep it away; TRIGGER as for --kill (repeatable)",
    )
    elastic.add_argument(
        "--return",
        dest="returns",
        action="append",
        default=[],
        metavar="TASK@TRIGGER",
        help="a lost worker is available again; TRIGGER as for --kill (repeatable)",
    )
    out = parser.add_argument_group("emit for a real engine")
    out.add_argument("--emit", choices=emit.EMIT_FORMATS, default=None, help="print instead of running")
    out.add_argument("--name", default="tfdist-job", help="job name (tfjob, jobset, slurm)")
    out.add_argument("--namespace", default=None, help="Kubernetes namespace (tfjob, jobset)")
    out.add_argument(
        "--image", default=None, help="container image with tfdist installed (tfjob, jobset; required there)"
    )
    out.add_argument("--cpu", default=None, help="CPU limit per task (tfjob, jobset), e.g. 4")
    out.add_argument("--memory", default=None, help="memory limit per task (tfjob, jobset), e.g. 16Gi")
    out.add_argument("--gpus", "--gpus-per-task", type=int, default=0, help="GPUs per task (tfjob, jobset, slurm, ray)")
    out.add_argument("--hosts", default=None, help="comma-separated hosts in task order (tf-config)")
    out.add_argument("--port", type=int, default=emit.TFJOB_PORT, help="task port (tf-config)")
    out.add_argument(
        "--port-base",
        type=int,
        default=None,
        help="fixed first port per node (slurm); default a per-job base from SLURM_JOB_ID",
    )
    out.add_argument("--python", default=None, help="interpreter the tasks run (slurm); default this one")
    out.add_argument("--tf-log-level", type=int, default=2, help="default TF_CPP_MIN_LOG_LEVEL (slurm)")
    out.add_argument("--time", default="01:00:00", help="time limit (slurm; default 01:00:00)")
    out.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPTION",
        help="another #SBATCH option (slurm), repeatable: --sbatch partition=gpu --sbatch account=ml",
    )
    out.add_argument(
        "--tasks-per-node",
        type=int,
        default=None,
        help="TF tasks per node (slurm): 1 for one per node; default: Slurm places them (elastic: 1)",
    )
    out.add_argument(
        "--cpus-per-task",
        type=int,
        default=None,
        help="CPUs per task (slurm, ray, spark: spark.task.cpus; ray default 1)",
    )
    return parser


def _emit(args: argparse.Namespace, config: LaunchConfig) -> str:
    if args.emit == "tf-config":
        hosts = args.hosts.split(",") if args.hosts is not None else None
        configs = emit.tf_configs(config, hosts=hosts, port=args.port)
        return json.dumps(configs, indent=2)
    if args.emit in ("tfjob", "jobset"):
        build = emit.tfjob_manifest if args.emit == "tfjob" else emit.jobset_manifest
        return emit.to_yaml(
            build(
                config,
                name=args.name,
                namespace=args.namespace,
                image=args.image,
                cpu=args.cpu,
                memory=args.memory,
                gpus=args.gpus,
            )
        )
    return emit.slurm_script(
        config,
        name=args.name,
        time_limit=args.time,
        cpus_per_task=args.cpus_per_task,
        gpus_per_task=args.gpus,
        port_base=args.port_base,
        python=args.python,
        tf_log_level=args.tf_log_level,
        tasks_per_node=args.tasks_per_node,
        sbatch=tuple(args.sbatch),
    )


@program.cli_main("tfdist-launch")
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    own, command = program.split_command(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(own)
    _refuse_idle_flags(parser, args)
    logs.configure_cli(logs.cli_level(args.log_level), "tfdist-launch: %(message)s")
    if args.emit == "tf-config" and not command:
        command = ["CMD"]
    if not command:
        parser.error("a program to run after '--' is required, e.g. tfdist-launch --workers 2 -- python train.py")
    try:
        config = LaunchConfig(
            command=tuple(command),
            workers=args.workers,
            ps=args.ps,
            chief=args.chief,
            evaluator=args.evaluator,
            run_on=args.run_on,
            max_restarts=args.max_restarts,
            threads_per_task=args.threads_per_task,
            timeout=args.timeout,
            log_dir=args.log_dir,
            log_level=args.log_level,
            kills=tuple(args.kill),
            isolate_network=args.isolate_network,
            grace_seconds=args.grace,
            data_service_workers=args.data_service_workers,
            mesh=args.mesh,
            min_workers=args.min_workers,
            max_workers=args.max_workers,
            loses=tuple(args.lose),
            returns=tuple(args.returns),
        )
        if args.emit:
            sys.stdout.write(_emit(args, config) + "\n")
            return 0

        def _write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        def _status(message: str) -> None:
            sys.stderr.write(f"tfdist-launch: {message}\n")
            sys.stderr.flush()

        shown = None
        if args.console == "chief":
            shown = console_task(chief=config.chief)
            if config.log_dir is None:
                config.check_command()  # No directory for a run that cannot start.
                config = LaunchConfig(**{**config.option_values(), "log_dir": tempfile.mkdtemp(prefix="tfdist-logs-")})
            _status(f"--console chief: the console shows {shown}; every task's output is in {config.log_dir}")
        for key, value in LAUNCHER_ENV.get(args.engine, lambda _: {})(args).items():
            os.environ.setdefault(key, value)  # The launcher's environment, read by the engine's package.
        build = ENGINE_BUILDERS.get(args.engine)
        engine = build(parser, args) if build else engine_for(args.engine)
        on_line = console_sink(_write, tasks=None if shown is None else {shown})
        result = run_config(config, on_line=on_line, on_status=_status, engine=engine)
    except Error as err:
        sys.stderr.write(f"tfdist-launch: error: {program.one_line(in_flags(err, args.engine))}\n")
        return program.exit_code_for(err)  # 2 for bad input; 1 when the world failed (ports, engine, storage)
    details = result.summary().splitlines()[1:]  # The first line was the runner's last status line.
    if result.exit_code != 0 and details:
        sys.stderr.write("\n".join(details) + "\n")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
