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
import sys
import tempfile
from collections.abc import Sequence

from tfdist._options import flagged_options
from tfdist.cli._engines import ENGINE_FLAGS
from tfdist.cli._flags import DefaultsShown, add_flags, dest, flag_names, option_values, with_flags
from tfdist.errors import Error
from tfdist.launch.config import LaunchConfig
from tfdist.launch.emit import formats as emit
from tfdist.launch.engines.registry import ENGINES, engine_for
from tfdist.launch.output import console_sink, console_task
from tfdist.launch.results import LaunchResult
from tfdist.launch.supervisor.runner import run_config
from tfdist.runtime import logs, program

CONSOLE_CHOICES = ("all", "chief")


def _config_flags(parser: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    """One section per option group of LaunchConfig, its flags made from the options' declarations."""
    sections = {}
    for name, kind in LaunchConfig.option_groups().items():
        sections[name] = parser.add_argument_group(name, (kind.__doc__ or "").strip().splitlines()[0])
        add_flags(sections[name], LaunchConfig, group=name)
    return sections


def _console_flag(section: argparse._ArgumentGroup) -> None:
    section.add_argument(
        "--console",
        choices=CONSOLE_CHOICES,
        default="all",
        help="all: every task's output, each line prefixed [task]; chief: only the chief's (worker:0 "
        "without a chief), every task's in --log-dir (default: a new directory under the temp dir, printed)",
    )


def _engine_flags(section: argparse._ArgumentGroup) -> None:
    """--engine, and the flags of each engine that has options of its own (``--ray-*``, ``--spark-*``)."""
    section.add_argument(
        "--engine",
        choices=sorted(ENGINES),
        default="local",
        help="local: processes on this machine; ray: actors in one Ray placement group; spark: the tasks "
        "of one Spark barrier stage",
    )
    for name, engine in ENGINE_FLAGS.items():
        add_flags(section, engine.options, prefix=name)


def _emit_flags(section: argparse._ArgumentGroup) -> None:
    """--emit, and the arguments of the emitters (tf_configs, tfjob_manifest, jobset_manifest, slurm_script)."""
    add = section.add_argument
    add("--emit", choices=emit.EMIT_FORMATS, default=None, help="print instead of running")
    add("--name", default="tfdist-job", help="job name (tfjob, jobset, slurm)")
    add("--namespace", default=None, help="Kubernetes namespace (tfjob, jobset)")
    add("--image", default=None, help="container image with tfdist installed (tfjob, jobset; required there)")
    add("--cpu", default=None, help="CPU limit per task (tfjob, jobset), e.g. 4")
    add("--memory", default=None, help="memory limit per task (tfjob, jobset), e.g. 16Gi")
    add("--gpus", "--gpus-per-task", type=int, default=0, help="GPUs per task (tfjob, jobset, slurm, ray)")
    add("--hosts", default=None, help="comma-separated hosts in task order (tf-config)")
    add("--port", type=int, default=emit.TFJOB_PORT, help="task port (tf-config)")
    add(
        "--port-base",
        type=int,
        default=None,
        help="fixed first port per node (slurm); default a per-job base from SLURM_JOB_ID",
    )
    add("--python", default=None, help="interpreter the tasks run (slurm); default this one")
    add("--tf-log-level", type=int, default=2, help="the tasks' TF_CPP_MIN_LOG_LEVEL where the job sets none (slurm)")
    add("--time", dest="time_limit", default="01:00:00", metavar="TIME", help="time limit (slurm)")
    add(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPTION",
        help="another #SBATCH option (slurm), repeatable: --sbatch partition=gpu --sbatch account=ml",
    )
    add(
        "--tasks-per-node",
        type=int,
        default=None,
        help="TF tasks per node (slurm): 1 for one per node; default: Slurm places them (elastic: 1)",
    )
    add(
        "--cpus-per-task",
        type=int,
        default=None,
        help="CPUs per task (slurm, ray, spark: spark.task.cpus; ray default 1)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = program.ArgumentParser(
        prog="tfdist-launch",
        description="Run a TensorFlow cluster as local processes (TF_CONFIG per task), "
        "or emit the same topology for Kubernetes (TFJob, JobSet) or Slurm.",
        usage="tfdist-launch [options] -- CMD [ARGS...]",
        takes_command=True,
        formatter_class=DefaultsShown,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {program.version()}")
    sections = _config_flags(parser)
    _console_flag(sections["supervision"])
    engines = parser.add_argument_group("engine", "Where the tasks run.")
    _emit_flags(parser.add_argument_group("emit", "Print the job for a real engine instead of running it."))
    _engine_flags(engines)  # After the emitters': the engines share their --gpus and --cpus-per-task.
    return parser


def _flags_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Python argument -> its flag: each flag's destination (LaunchConfig's options keep their names)."""
    flags = {
        action.dest: next(name for name in action.option_strings if name.startswith("--"))
        for action in parser._actions
        if action.option_strings
    }
    return {**flags, "gpus_per_task": "--gpus"}  # slurm_script's name for --gpus.


# The flag that sets each Python argument: the library's errors name the argument (`grace_seconds`), and
# tfdist-launch prints them with the flag the user typed (`--grace`). LaunchConfig's options, the emitters'
# arguments; and where an engine's option shares a Python name with another flag, the flag of that engine.
FLAGS: dict[str, str] = _flags_of(_parser())
ENGINE_FLAG_NAMES: dict[str, dict[str, str]] = {
    name: flag_names(engine.options, prefix=name) for name, engine in ENGINE_FLAGS.items()
}


def in_flags(err: Error, engine: str = "local") -> str:
    """``err``'s message with each argument it names in backticks as its flag: `grace_seconds` -> `--grace`.

    The flags of ``engine`` come first (the Spark engine's `python` is `--spark-python`).

    Example:
        >>> from tfdist.errors import LaunchError, invalid
        >>> in_flags(invalid(LaunchError, "ps", 1, "`chief` as well"))
        'Invalid value for `--ps`. Received: 1. Expected `--chief` as well.'
    """
    return with_flags(str(err), {**FLAGS, **ENGINE_FLAG_NAMES.get(engine, {})})


# Where each flag acts: a run on an engine ("local", "ray", "spark", or another registered one, which runs like
# "local") or an --emit format. A flag given where it does not act is refused, naming it.
_RUN = frozenset({"local", "ray", "spark"})
_OWN_FLAGS = tuple(ENGINE_FLAGS)  # engines with flags of their own
_EMITTED = frozenset(emit.EMIT_FORMATS)
_JOBS = frozenset({"tfjob", "jobset", "slurm"})
_K8S = frozenset({"tfjob", "jobset"})
_ACTS: dict[str, frozenset[str]] = {
    **dict.fromkeys(("workers", "ps", "chief", "evaluator", "run_on"), _RUN | _EMITTED),
    "mesh": _RUN | _JOBS,
    "max_restarts": _RUN | _JOBS,
    **dict.fromkeys(
        ("threads_per_task", "timeout", "log_dir", "kills", "grace_seconds", "data_service_workers", "engine"), _RUN
    ),
    # The console is the supervisor's, whichever engine reads the output; TFDIST_LOG_LEVEL is a run's child env.
    **dict.fromkeys(("console", "log_level"), _RUN),
    **dict.fromkeys(("isolate_network", "simulate_hosts", "links", "preload", "stall_seconds"), frozenset({"local"})),
    **{  # An engine's own flags act on that engine (the flags it shares with the emitters are listed below).
        dest(opt, name): frozenset({name})
        for name, engine in ENGINE_FLAGS.items()
        for opt in flagged_options(engine.options)
        if not opt.flag.name
    },
    **dict.fromkeys(("min_workers", "max_workers", "loses", "returns"), _RUN | {"slurm"}),
    "name": _JOBS,
    **dict.fromkeys(("namespace", "image", "cpu", "memory"), _K8S),
    "gpus": _JOBS | {"ray"},
    **dict.fromkeys(("hosts", "port"), frozenset({"tf-config"})),
    **dict.fromkeys(
        ("port_base", "python", "tf_log_level", "time_limit", "tasks_per_node", "sbatch"), frozenset({"slurm"})
    ),
    "cpus_per_task": frozenset({"slurm", "ray", "spark"}),
}


def _refuse_idle_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit 2 naming every flag given (not at its default) that this run or --emit format would ignore."""
    mode = args.emit or (args.engine if args.engine in _OWN_FLAGS else "local")
    where = f"--emit {args.emit}" if args.emit else f"a run on the {args.engine} engine"
    flags = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    idle: list[str] = []
    by_place: dict[str, list[str]] = {}  # Where they act -> the idle flags that act there.
    for place, modes in _ACTS.items():
        if mode not in modes and getattr(args, place) != parser.get_default(place):
            idle.append(flags[place])
            by_place.setdefault(", ".join(sorted(modes)), []).append(flags[place])
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
        time_limit=args.time_limit,
        cpus_per_task=args.cpus_per_task,
        gpus_per_task=args.gpus,
        port_base=args.port_base,
        python=args.python,
        tf_log_level=args.tf_log_level,
        tasks_per_node=args.tasks_per_node,
        sbatch=tuple(args.sbatch),
    )


def _status(message: str) -> None:
    sys.stderr.write(f"tfdist-launch: {message}\n")
    sys.stderr.flush()


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, config: LaunchConfig) -> LaunchResult:
    """Runs ``config`` on the engine the flags choose, with the console they ask for."""
    shown = None
    if args.console == "chief":
        shown = console_task(chief=config.chief)
        if config.log_dir is None:
            config.check_command()  # No directory for a run that cannot start.
            config = LaunchConfig(**{**config.option_values(), "log_dir": tempfile.mkdtemp(prefix="tfdist-logs-")})
        _status(f"--console chief: the console shows {shown}; every task's output is in {config.log_dir}")
    flagged = ENGINE_FLAGS.get(args.engine)
    if flagged is None:
        engine = engine_for(args.engine)
    else:
        options = flagged.more(option_values(parser, args, flagged.options, prefix=args.engine), args)
        for key, value in flagged.launcher_env(options).items():
            os.environ.setdefault(key, value)  # The launcher's environment, read by the engine's package.
        engine = flagged.build(**options)
    on_line = console_sink(_write, tasks=None if shown is None else {shown})
    return run_config(config, on_line=on_line, on_status=_status, engine=engine)


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
        config = LaunchConfig(command=tuple(command), **option_values(parser, args, LaunchConfig))
        if args.emit:
            sys.stdout.write(_emit(args, config) + "\n")
            return 0
        result = _run(parser, args, config)
    except Error as err:
        sys.stderr.write(f"tfdist-launch: error: {program.one_line(in_flags(err, args.engine))}\n")
        return program.exit_code_for(err)  # 2 for bad input; 1 when the world failed (ports, engine, storage)
    details = result.summary().splitlines()[1:]  # The first line was the runner's last status line.
    if result.exit_code != 0 and details:
        sys.stderr.write("\n".join(details) + "\n")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
