"""What to launch: a validated, frozen description of a local cluster run.

The options come in six groups, each a frozen dataclass that checks its own fields: :class:`Topology`
(which tasks), :class:`Supervision` (restarts, time limits, logs, environment), :class:`Faults` (fault
injection), :class:`Elastic` (losing and regaining workers), :class:`~tfdist.launch.network.Network`
(where the tasks listen: :mod:`tfdist.launch.network`) and :class:`~tfdist.launch.inspection.Inspection`
(the stall inspector: :mod:`tfdist.launch.inspection`). :class:`LaunchConfig` holds
them and takes every field flat, ``LaunchConfig(command=..., workers=2, max_restarts=1)``; its own checks are
the rules across groups. Errors name the Python argument (``grace_seconds``); only the CLI speaks in flags,
which it makes from each option's declaration (:func:`tfdist._options.option`: its help, and its flag where
that is not its name, ``--grace``).

Example:
    >>> from tfdist.launch import LaunchConfig
    >>> config = LaunchConfig(command=("python", "train.py"), workers=2)
    >>> config.mode, [t for t in config.cmd_task_types()]
    ('collective', ['chief', 'worker', 'evaluator'])
    >>> config.topology.workers, config.workers, config.grace_seconds
    (2, 2, 5.0)
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import types
from collections.abc import Mapping
from typing import Any

from tfdist._names import describe_choices
from tfdist._options import GroupedOptions, group, option
from tfdist.cluster.mesh_shape import MeshShape
from tfdist.cluster.spec import MAX_TASKS_PER_JOB, split_task_name, task_counts
from tfdist.errors import LaunchError, invalid, require_bool, require_int, require_number, require_type
from tfdist.launch.events import KillAt, LoseAt, ReturnAt, as_tuple
from tfdist.launch.inspection import Inspection
from tfdist.launch.network import Network
from tfdist.runtime.logs import LOG_LEVELS

_MAX_THREADS = 4096
_MAX_TIMEOUT = 366 * 86400.0  # A year.
_MAX_GRACE = 3600.0

__all__ = ["Elastic", "Faults", "LaunchConfig", "Supervision", "Topology"]

RUN_ON_CHOICES = ("auto", "all", "chief")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Topology:
    """Which tasks run, and which of them run the command.

    Attributes:
      workers: Worker tasks (>= 1; ``tfdist-launch --workers`` defaults to 2).
      ps: Parameter-server tasks; with ps the run is parameter-server style
        (needs ``chief``: the coordinator).
      chief: Add a chief task.
      evaluator: Add an evaluator task (runs the command; not in the cluster).
      run_on: 'auto' (collective: chief+workers+evaluator; parameter server:
        chief+evaluator, workers and ps run tfdist's TF server), 'all' (the
        command on every task), or 'chief' (the command on the chief only).
      data_service_workers: Start a tf.data service (dispatcher plus this many
        workers) beside the cluster; every task gets its address in
        ``TFDIST_DATA_SERVICE``. 0: none.
      mesh: A DTensor device mesh over the chief and workers, ``'model=2'``
        or ``'batch=2,model=2'`` (see :class:`tfdist.cluster.mesh_shape.MeshShape`):
        every process is a DTensor client (its ``DTENSOR_*`` variables and
        ``TFDIST_MESH`` are set), for ``tfdist.parallel.build_mesh()``. None: no mesh.
    """

    # A bare `tfdist-launch -- CMD` has always run 2 workers; a spec starts from the smallest cluster.
    workers: int = option(1, help="worker tasks", cli_default=2)
    ps: int = option(0, help="parameter-server tasks (needs `chief`)")
    chief: bool = option(False, help="add a chief task")
    evaluator: bool = option(False, help="add an evaluator task")
    run_on: str = option(
        "auto",
        help="which tasks run the command: auto (the chief and every worker without ps, the chief (coordinator) "
        "with ps; the others run a TF server), all, or chief",
        choices=RUN_ON_CHOICES,
    )
    data_service_workers: int = option(
        0, help="start a tf.data service with N workers; tasks get TFDIST_DATA_SERVICE", metavar="N"
    )
    mesh: str | None = option(
        None,
        help="make chief and workers the clients of a DTensor mesh, e.g. batch=2,model=2 (the model axis spans "
        "processes); the script calls tfdist.parallel.build_mesh()",
        metavar="AXIS=N,...",
    )

    def __post_init__(self) -> None:
        for name in ("chief", "evaluator"):
            require_bool(LaunchError, name, getattr(self, name))
        for name, minimum in (("workers", 1), ("ps", 0), ("data_service_workers", 0)):
            fix = "A cluster trains on at least one worker." if name == "workers" else ""
            require_int(LaunchError, name, getattr(self, name), minimum=minimum, maximum=MAX_TASKS_PER_JOB, fix=fix)
        if self.run_on not in RUN_ON_CHOICES:  # Compared, never hashed: any value gets this error.
            raise invalid(LaunchError, "run_on", self.run_on, describe_choices(self.run_on, RUN_ON_CHOICES))
        if self.run_on == "chief" and not self.chief:
            raise invalid(
                LaunchError, "run_on", "chief", "a cluster with a chief (`chief`)", "Set `chief`, or `run_on` 'auto'."
            )
        if self.mesh is not None:
            self._check_mesh()
        if self.ps and not self.chief:
            raise invalid(
                LaunchError,
                "ps",
                self.ps,
                "`chief` as well (the coordinator runs on the chief)",
                "Set `chief`: ParameterServerStrategy's coordinator is the chief task.",
            )

    def _check_mesh(self) -> None:
        shape = MeshShape.parse(self.mesh, field="mesh", error=LaunchError)
        object.__setattr__(self, "mesh", str(shape))
        for name, value, fix in (
            ("ps", self.ps, "A mesh trains on the chief and workers; drop `ps`."),
            ("evaluator", self.evaluator, "A mesh's processes evaluate in `fit`; drop `evaluator`."),
            ("data_service_workers", self.data_service_workers, "Feed a mesh from files; drop the service."),
        ):
            if value:
                raise invalid(LaunchError, name, value, "none together with `mesh`", fix)
        processes = self.workers + int(self.chief)
        fix = f"Use `workers` that divide {shape.size}, or a mesh such as 'model={processes}'."
        shape.check_processes(processes, error=LaunchError, fix=fix)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Supervision:
    """How the tasks run, restart and stop.

    Attributes:
      max_restarts: Restarts allowed after failures (whole group for
        collectives, the failed worker for parameter servers).
      threads_per_task: Intra-op threads per task (and the inter-op floor).
      timeout: Seconds before every task is stopped (finite, > 0, at most a
        year); None: no limit.
      grace_seconds: Time between SIGTERM and SIGKILL when stopping tasks
        (one deadline shared by every task being stopped); 0 to 3600.
      log_dir: Directory for one log file per task.
      env: Extra variables for every task.
      log_level: The ``tfdist`` logger's level in every task ('debug',
        'info', 'warning', 'error' or 'off'), written to its
        ``TFDIST_LOG_LEVEL`` (see :mod:`tfdist.runtime.logs`). None: the
        launcher's own ``TFDIST_LOG_LEVEL`` (or ``env``'s), else 'info'.
      preload: Start tfdist's own task programs (``run_function``'s tasks,
        the TF servers of ps and server-only workers) as forks of a process
        that has imported TensorFlow (and tf-keras) once, instead of a new
        interpreter each: a task then starts in a fraction of the time and
        CPU (tests, restarts). Local engine only, outside network
        namespaces; a user's command always starts as a new process. Off
        for ``tfdist-launch``; :func:`tfdist.testing.run_cluster` and
        :func:`tfdist.launch.run_function` turn it on.
    """

    max_restarts: int = option(0, help="restarts after task failures")
    threads_per_task: int | None = option(None, help="intra-op threads per task")
    timeout: float | None = option(None, help="seconds before every task is killed")
    grace_seconds: float = option(5.0, help="seconds from SIGTERM to SIGKILL when stopping", flag="--grace")
    log_dir: str | None = option(None, help="write one log file per task here")
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    log_level: str | None = option(
        None,
        help="level of the tfdist logger, in the launcher and (TFDIST_LOG_LEVEL) in every task; default "
        "$TFDIST_LOG_LEVEL, else info",
        choices=LOG_LEVELS,
    )
    preload: bool = option(
        False,
        help="start tfdist's own task programs (run_function's tasks, TF servers) as forks of a process that "
        "imported TensorFlow before the fork, not each in a new interpreter: starts and restarts cost a fraction "
        "of the CPU (user commands still start as new processes)",
    )

    def __post_init__(self) -> None:
        require_bool(LaunchError, "preload", self.preload)
        if self.log_level is not None and self.log_level not in LOG_LEVELS:  # Compared, never hashed.
            raise invalid(LaunchError, "log_level", self.log_level, describe_choices(self.log_level, LOG_LEVELS))
        require_int(LaunchError, "max_restarts", self.max_restarts, minimum=0, maximum=MAX_TASKS_PER_JOB)
        if self.threads_per_task is not None:
            require_int(LaunchError, "threads_per_task", self.threads_per_task, minimum=1, maximum=_MAX_THREADS)
        # Past these maxima, waits overflow the OS timers (Event.wait(1e23) is an OverflowError); none is meant.
        require_number(
            LaunchError,
            "timeout",
            self.timeout,
            above=0,
            maximum=_MAX_TIMEOUT,
            allow_none=True,
            fix="Seconds, e.g. 600; None for no limit.",
        )
        require_number(LaunchError, "grace_seconds", self.grace_seconds, minimum=0, maximum=_MAX_GRACE)
        require_type(LaunchError, "log_dir", self.log_dir, (str, type(None)), "a directory path or None")
        if self.log_dir is not None and (not self.log_dir.strip() or "\0" in self.log_dir):
            raise invalid(
                LaunchError,
                "log_dir",
                self.log_dir,
                "a directory path",
                "Leave `log_dir` unset to keep output on the console only.",
            )
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise invalid(LaunchError, "env", self.env, "a mapping of strings to strings")
        object.__setattr__(self, "env", types.MappingProxyType(dict(self.env)))  # Frozen all through.


@dataclasses.dataclass(frozen=True, kw_only=True)
class Faults:
    """Fault injection for tests of recovery.

    Attributes:
      kills: :class:`KillAt` values or their text form, e.g.
        ``("worker:1@after=Epoch 3/",)``.
    """

    kills: tuple[KillAt, ...] = option(
        (),
        help="SIGKILL a task once (fault injection): worker:1@after='Epoch 3/' when any task prints a line "
        "matching the regex, or worker:1@20 after 20 s",
        flag="--kill",
        metavar="TASK@TRIGGER",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "kills", KillAt.many(self.kills))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Elastic:
    """Elastic training: the group goes on when workers leave, and grows back when they return.

    Attributes:
      min_workers: When a worker is lost (its restarts are used up, or
        ``loses``), the group goes on with the workers left, down to this many;
        below it the run fails. None: not elastic.
      max_workers: The group grows back (returned workers join at the next
        epoch boundary) up to this many; default ``workers``.
      loses: Elastic fault injection: :class:`LoseAt` values or text
        ('worker:2@after=REGEX'); the worker is killed and stays away.
      returns: Elastic fault injection: :class:`ReturnAt` values or text; the
        lost worker is available again.
    """

    min_workers: int | None = option(
        None, help="go on with the workers left when one is lost, down to N; below N the run fails", metavar="N"
    )
    max_workers: int | None = option(
        None, help="returned workers join at the next epoch boundary, up to M (default `workers`)", metavar="M"
    )
    loses: tuple[LoseAt, ...] = option(
        (), help="kill a worker and keep it away; TRIGGER as for `kills`", flag="--lose", metavar="TASK@TRIGGER"
    )
    returns: tuple[ReturnAt, ...] = option(
        (), help="a lost worker is available again; TRIGGER as for `kills`", flag="--return", metavar="TASK@TRIGGER"
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "loses", LoseAt.many(self.loses))
        object.__setattr__(self, "returns", ReturnAt.many(self.returns))
        if self.min_workers is None:
            for name in ("max_workers", "loses", "returns"):
                if getattr(self, name) not in (None, ()):
                    raise invalid(
                        LaunchError,
                        name,
                        getattr(self, name),
                        "`min_workers` as well (elastic training)",
                        "Set `min_workers` (1 <= N <= `workers`).",
                    )
            return
        require_int(
            LaunchError,
            "min_workers",
            self.min_workers,
            minimum=1,
            maximum=MAX_TASKS_PER_JOB,
            fix="The fewest workers the group may train with, at most `workers`.",
        )
        if self.max_workers is not None:
            require_int(
                LaunchError,
                "max_workers",
                self.max_workers,
                minimum=self.min_workers,
                maximum=MAX_TASKS_PER_JOB,
                fix="Between `min_workers` and `workers`.",
            )
        lost = {event.task for event in self.loses}
        for event in self.returns:
            if event.task not in lost:
                raise invalid(
                    LaunchError,
                    "returns",
                    event.task,
                    f"a worker some `loses` takes away ({sorted(lost)})",
                    f"Add {event.task}@TRIGGER to `loses`, or drop this return.",
                )


class LaunchConfig(GroupedOptions, error=LaunchError):
    """A local cluster run: the command, and the option groups it runs with.

    Every field of the groups is a keyword argument and an attribute
    (``config.workers``); a whole group may be passed by name instead
    (``topology=Topology(workers=2)``). ``option_names()`` lists every
    argument (for code that serializes a config).

    Args:
      command: The program each user-code task runs (argv).
      topology: :class:`Topology`: workers, ps, chief, evaluator, run_on,
        data_service_workers, mesh.
      supervision: :class:`Supervision`: max_restarts, threads_per_task,
        timeout, grace_seconds, log_dir, env, log_level, preload.
      faults: :class:`Faults`: kills.
      elastic: :class:`Elastic`: min_workers, max_workers (default
        ``workers``), loses, returns.
      network: :class:`~tfdist.launch.network.Network`: host, isolate_network, simulate_hosts, links.
      inspection: :class:`~tfdist.launch.inspection.Inspection`: stall_seconds.

    Example:
        >>> config = LaunchConfig(command=("python", "train.py"), workers=3, min_workers=2)
        >>> config.max_workers, config.elastic.max_workers, "max_restarts" in LaunchConfig.option_names()
        (3, 3, True)
        >>> LaunchConfig(command=("python", "train.py"), grace_seconds=1e12)
        Traceback (most recent call last):
        ...
        tfdist.errors.LaunchError: Invalid value for `grace_seconds`. Received: 1000000000000.0. Expected a number \
>= 0 and <= 3600.
    """

    command: tuple[str, ...]
    topology = group(Topology)
    supervision = group(Supervision)
    faults = group(Faults)
    elastic = group(Elastic)
    network = group(Network)
    inspection = group(Inspection)

    def __post_init__(self) -> None:
        """The command, and the rules across groups (each group has checked its own fields)."""
        command = as_tuple(self.command)
        if isinstance(self.command, str) or not all(isinstance(arg, str) for arg in command):
            raise invalid(
                LaunchError,
                "command",
                self.command,
                "a sequence of strings (argv)",
                "Example: command=('python', 'train.py').",
            )
        if not command:
            raise invalid(LaunchError, "command", [], "a program to run (argv), e.g. ('python', 'train.py')")
        object.__setattr__(self, "command", command)
        names = set(self.task_names())
        for kill in self.kills:
            if kill.task not in names:
                raise invalid(LaunchError, "kills", kill.task, describe_choices(kill.task, names))
        if self.simulate_hosts:
            self.network.check_tasks(self.task_names())
        if self.min_workers is not None:
            self._check_elastic()
        self.inspection.check_mode(self.mode)

    def _check_elastic(self) -> None:
        """Elastic options against the topology and the network."""
        if self.min_workers > self.workers:
            raise invalid(
                LaunchError,
                "min_workers",
                self.min_workers,
                f"an integer <= `workers` ({self.workers})",
                "The fewest workers the group may train with, at most `workers`.",
            )
        if self.max_workers is None:
            self._replace_options(max_workers=self.workers)
        if self.max_workers > self.workers:
            raise invalid(
                LaunchError,
                "max_workers",
                self.max_workers,
                f"an integer <= `workers` ({self.workers})",
                "Between `min_workers` and `workers`: the local engine grows back only with workers it started.",
            )
        if self.mesh is not None:
            raise invalid(
                LaunchError,
                "min_workers",
                self.min_workers,
                "None together with `mesh` (a mesh's shape is fixed)",
                "Drop `min_workers`; resume on another mesh from a checkpoint instead.",
            )
        self.network.refuse_namespaces(
            "no elastic options (not supported together yet)", "Drop `{option}` or `min_workers`."
        )
        workers = {f"worker:{i}" for i in range(self.workers)}
        for event in self.loses + self.returns:
            if event.task not in workers:
                raise invalid(
                    LaunchError,
                    event.option,
                    event.task,
                    describe_choices(event.task, workers),
                    "Only workers leave and return; a lost chief or ps needs a restart (`max_restarts`).",
                )

    @property
    def mode(self) -> str:
        """'parameter_server' when there are ps tasks, else 'collective'."""
        return "parameter_server" if self.ps else "collective"

    def task_counts(self) -> dict[str, int]:
        """Tasks per job, in launch order (see :func:`tfdist.cluster.spec.task_counts`)."""
        return task_counts(workers=self.workers, ps=self.ps, chief=self.chief, evaluator=self.evaluator)

    def task_names(self) -> list[str]:
        """Every task as 'type:index', in launch order."""
        return [f"{job}:{index}" for job, count in self.task_counts().items() for index in range(count)]

    def cmd_task_types(self) -> tuple[str, ...]:
        """Task types that run the user's command (the others run a TF server)."""
        if self.run_on == "all":
            return ("chief", "worker", "ps", "evaluator")
        if self.run_on == "chief" or self.mode == "parameter_server":
            return ("chief", "evaluator")
        return ("chief", "worker", "evaluator")

    def check_command(self) -> None:
        """Raises LaunchError unless the command can be started on this machine.

        A name without a slash is looked up on PATH; a path must be an
        executable file (as for ``execvp``).
        """
        program = self.command[0]
        if "\0" in program or not program:
            raise invalid(LaunchError, "command", program, "a program name or path")
        if os.sep not in program:
            if shutil.which(program) is None:
                raise invalid(
                    LaunchError,
                    "command",
                    program,
                    "an executable on PATH or a file path",
                    "Check the spelling, or give the full path.",
                )
        elif not os.path.isfile(program):
            raise invalid(
                LaunchError,
                "command",
                program,
                "an existing executable file",
                "Check the path; relative paths start from the current directory.",
            )
        elif not os.access(program, os.X_OK):
            raise invalid(
                LaunchError,
                "command",
                program,
                "a file with execute permission",
                f"Run `chmod +x {program}`, or put its interpreter first (e.g. `bash {program}`).",
            )

    def runs_command(self, task: str) -> bool:
        """True when ``task`` ('type:index') runs the user's command."""
        return split_task_name(task)[0] in self.cmd_task_types()

    def ends_run(self, task: str) -> bool:
        """True when the run is done once ``task`` and the others like it have finished with exit 0.

        With parameter servers the coordinator (and an evaluator) decide, as a TFJob's success policy
        does: the workers and ps serve until they are stopped, also when they run the command
        (``run_on='all'``, a script that calls ``server.join()``). Otherwise every task that runs the
        command must finish.
        """
        if self.mode == "parameter_server":
            return split_task_name(task)[0] in ("chief", "evaluator") and self.runs_command(task)
        return self.runs_command(task)


def require_config(config: Any, field: str = "config") -> LaunchConfig:
    """Returns ``config`` if it is a :class:`LaunchConfig`; LaunchError otherwise (for the emitters' inputs)."""
    if not isinstance(config, LaunchConfig):
        raise invalid(
            LaunchError,
            field,
            config,
            "a tfdist.launch.LaunchConfig",
            "Build one with LaunchConfig(command=(...), workers=N, ...).",
        )
    return config
