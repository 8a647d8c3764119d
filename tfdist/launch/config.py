"""What to launch: a validated, frozen description of a local cluster run.

Example:
    >>> from tfdist.launch.config import LaunchConfig
    >>> config = LaunchConfig(command=("python", "train.py"), workers=2)
    >>> config.mode, [t for t in config.cmd_task_types()]
    ('collective', ['chief', 'worker', 'evaluator'])
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import types
from collections.abc import Mapping
from typing import Any, ClassVar, Optional

from tfdist._names import describe_choices
from tfdist.cluster.spec import MAX_TASKS_PER_JOB, split_task_name, task_counts
from tfdist.errors import LaunchError, invalid, require_bool, require_int, require_number, require_type

_MAX_THREADS = 4096
_MAX_TIMEOUT = 366 * 86400.0  # A year.
_MAX_GRACE = 3600.0

__all__ = ["LaunchConfig", "KillAt", "LoseAt", "ReturnAt", "RUN_ON_CHOICES", "require_config"]

RUN_ON_CHOICES = ("auto", "all", "chief")
_KILL = re.compile(r"^(chief|worker|ps|evaluator):(\d+)@(.*)$", re.S)
_KILL_FORMAT = "TASK:INDEX@SECONDS or TASK:INDEX@after=REGEX, e.g. 'worker:1@20' or 'worker:1@after=Epoch 3/'"


@dataclasses.dataclass(frozen=True, kw_only=True)
class KillAt:
    """Fault injection: SIGKILL ``task`` (e.g. 'worker:1') once, on progress or after a time.

    Give exactly one trigger. ``after`` (a regular expression) fires the first
    time any task prints a matching line, so the fault lands at the same point
    of the work however fast the machine is; ``seconds`` fires that long after
    launch.

    Example:
        >>> KillAt.parse("worker:1@20")
        KillAt(task='worker:1', seconds=20.0, after=None)
        >>> KillAt.parse("ps:0@after=Epoch 3/").after
        'Epoch 3/'
        >>> KillAt(task="worker:1", after="epoch 2 saved").matches("worker:0", "epoch 2 saved")
        True
    """

    flag: ClassVar[str] = "--kill"  # the option that names it, in errors
    task: str
    seconds: Optional[float] = None
    after: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not re.fullmatch(r"(chief|worker|ps|evaluator):\d+", self.task):
            raise invalid(LaunchError, self.flag, self.task, "a task 'type:index', e.g. 'worker:1'")
        if (self.seconds is None) == (self.after is None):
            raise invalid(LaunchError, self.flag, self, "exactly one trigger: seconds or after", _KILL_FORMAT)
        if self.seconds is not None:
            if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) \
                    or not math.isfinite(self.seconds) or self.seconds < 0:
                raise invalid(LaunchError, self.flag, self.seconds, "seconds as a finite number >= 0")
            object.__setattr__(self, "seconds", float(self.seconds))
        if self.after is not None:
            if not isinstance(self.after, str) or not self.after:
                raise invalid(LaunchError, self.flag, self.after, "a non-empty regular expression after 'after='")
            try:
                re.compile(self.after)
            except re.error as err:
                raise invalid(LaunchError, self.flag, self.after, f"a valid regular expression ({err})") from None

    @classmethod
    def parse(cls, text: str) -> "KillAt":
        """Parses ``TASK:INDEX@SECONDS`` or ``TASK:INDEX@after=REGEX``."""
        match = _KILL.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise invalid(LaunchError, cls.flag, text, _KILL_FORMAT)
        task, trigger = f"{match.group(1)}:{match.group(2)}", match.group(3)
        if trigger.startswith("after="):
            return cls(task=task, after=trigger[len("after="):])
        try:
            seconds = float(trigger)
        except ValueError:
            raise invalid(LaunchError, cls.flag, text, _KILL_FORMAT) from None
        return cls(task=task, seconds=seconds)

    def matches(self, task: str, line: str) -> bool:
        """True when ``line``, printed by ``task``, fires this progress trigger."""
        return self.after is not None and re.search(self.after, line) is not None

    def __str__(self) -> str:
        return f"{self.task}@after={self.after}" if self.after is not None else f"{self.task}@{self.seconds:g}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoseAt(KillAt):
    """Elastic fault injection: SIGKILL a worker and keep it away (a machine that leaves).

    Same triggers as :class:`KillAt`.

    Example:
        >>> LoseAt.parse("worker:2@after=epoch 2 end")
        LoseAt(task='worker:2', seconds=None, after='epoch 2 end')
    """

    flag: ClassVar[str] = "--lose"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReturnAt(KillAt):
    """Elastic fault injection: a lost worker is available again (the machine came back).

    Same triggers as :class:`KillAt`; the group grows at the next epoch boundary.

    Example:
        >>> str(ReturnAt.parse("worker:2@after=epoch 4 end"))
        'worker:2@after=epoch 4 end'
    """

    flag: ClassVar[str] = "--return"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """A local cluster run.

    Args:
      command: The program each user-code task runs (argv).
      workers: Worker tasks (>= 1).
      ps: Parameter-server tasks; with ps the run is parameter-server style.
      chief: Add a chief task.
      evaluator: Add an evaluator task (runs the command; not in the cluster).
      run_on: 'auto' (collective: chief+workers+evaluator; parameter server:
        chief+evaluator, workers and ps run tfdist's TF server), 'all' (the
        command on every task), or 'chief' (the command on the chief only).
      max_restarts: Restarts allowed after failures (whole group for
        collectives, the failed worker for parameter servers).
      threads_per_task: Intra-op threads per task (and the inter-op floor).
      timeout: Seconds before every task is stopped (finite, > 0); None: no limit.
      log_dir: Directory for one log file per task.
      kills: Fault injections: :class:`KillAt` values or their text form,
        e.g. ``("worker:1@after=Epoch 3/",)``.
      isolate_network: Run the cluster in a private network namespace.
      grace_seconds: Time between SIGTERM and SIGKILL when stopping tasks
        (one deadline shared by every task being stopped); finite, >= 0.
      host: Address the tasks use.
      env: Extra variables for every task.
      data_service_workers: Start a tf.data service (dispatcher plus this many
        workers) beside the cluster; every task gets its address in
        ``TFDIST_DATA_SERVICE``. 0: none.
      min_workers: Elastic training: when a worker is lost (its restarts are
        used up, or ``loses``), the group goes on with the workers left, down
        to this many; below it the run fails. None: not elastic.
      max_workers: Elastic training: the group grows back (returned workers
        join at the next epoch boundary) up to this many; default ``workers``.
      loses: Elastic fault injection: :class:`LoseAt` values or text
        ('worker:2@after=REGEX'); the worker is killed and stays away.
      returns: Elastic fault injection: :class:`ReturnAt` values or text; the
        lost worker is available again.
    """

    command: tuple[str, ...]
    workers: int = 1
    ps: int = 0
    chief: bool = False
    evaluator: bool = False
    run_on: str = "auto"
    max_restarts: int = 0
    threads_per_task: Optional[int] = None
    timeout: Optional[float] = None
    log_dir: Optional[str] = None
    kills: tuple[KillAt, ...] = ()
    isolate_network: bool = False
    grace_seconds: float = 5.0
    host: str = "127.0.0.1"
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    data_service_workers: int = 0
    min_workers: Optional[int] = None
    max_workers: Optional[int] = None
    loses: tuple[LoseAt, ...] = ()
    returns: tuple[ReturnAt, ...] = ()

    def __post_init__(self) -> None:
        command = _iterable(self.command)
        kills = tuple(KillAt.parse(k) if isinstance(k, str) else k for k in _iterable(self.kills))
        for name, kind in (("loses", LoseAt), ("returns", ReturnAt)):
            events = tuple(kind.parse(e) if isinstance(e, str) else e for e in _iterable(getattr(self, name)))
            if not all(isinstance(e, kind) for e in events):
                raise invalid(LaunchError, name, getattr(self, name),
                              f"a sequence of {kind.__name__} or 'worker:INDEX@...' strings")
            object.__setattr__(self, name, events)
        if isinstance(self.command, str) or not all(isinstance(arg, str) for arg in command):
            raise invalid(LaunchError, "command", self.command, "a sequence of strings (argv)",
                          "Example: command=('python', 'train.py').")
        if not all(isinstance(kill, KillAt) for kill in kills):
            raise invalid(LaunchError, "kills", self.kills, "a sequence of KillAt or 'TASK:INDEX@...' strings",
                          "Build them with KillAt.parse().")
        if not isinstance(self.env, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in self.env.items()):
            raise invalid(LaunchError, "env", self.env, "a mapping of strings to strings")
        for name in ("chief", "evaluator", "isolate_network"):
            require_bool(LaunchError, name, getattr(self, name))
        require_type(LaunchError, "host", self.host, str, "a host name or address, e.g. '127.0.0.1'")
        require_type(LaunchError, "run_on", self.run_on, str, describe_choices("", RUN_ON_CHOICES))
        require_type(LaunchError, "log_dir", self.log_dir, (str, type(None)), "a directory path or None")
        if self.log_dir is not None and (not self.log_dir.strip() or "\0" in self.log_dir):
            raise invalid(LaunchError, "--log-dir", self.log_dir, "a directory path",
                          "Leave --log-dir out to keep output on the console only.")
        object.__setattr__(self, "command", command)
        object.__setattr__(self, "kills", kills)
        object.__setattr__(self, "env", types.MappingProxyType(dict(self.env)))  # frozen all through
        if not self.command:
            raise invalid(LaunchError, "command", [], "a program to run after '--'",
                          "Example: tfdist-launch --workers 2 -- python train.py")
        for name, minimum in (("workers", 1), ("ps", 0), ("max_restarts", 0), ("data_service_workers", 0)):
            fix = "A cluster trains on at least one worker." if name == "workers" else ""
            require_int(LaunchError, f"--{name.replace('_', '-')}", getattr(self, name), minimum=minimum, fix=fix,
                        maximum=MAX_TASKS_PER_JOB)
        if self.threads_per_task is not None:
            require_int(LaunchError, "--threads-per-task", self.threads_per_task, minimum=1, maximum=_MAX_THREADS)
        require_number(LaunchError, "--timeout", self.timeout, above=0, allow_none=True, fix="Seconds, e.g. 600.")
        require_number(LaunchError, "grace_seconds", self.grace_seconds, minimum=0)
        # Past these, waits overflow the OS timers (Event.wait(1e23) is an OverflowError); none is meant.
        for name, value, most in (("--timeout", self.timeout, _MAX_TIMEOUT),
                                  ("--grace", self.grace_seconds, _MAX_GRACE)):
            if value is not None and value > most:
                raise invalid(LaunchError, name, value, f"seconds <= {most:g}")
        if self.run_on not in RUN_ON_CHOICES:
            raise invalid(LaunchError, "--run-on", self.run_on, describe_choices(self.run_on, RUN_ON_CHOICES))
        if self.run_on == "chief" and not self.chief:
            raise invalid(LaunchError, "--run-on", "chief", "a cluster with a chief (--chief)",
                          "Add --chief, or use --run-on auto.")
        if self.ps and not self.chief:
            raise invalid(LaunchError, "--ps", self.ps, "--chief as well (the coordinator runs on the chief)",
                          "Add --chief: ParameterServerStrategy's coordinator is the chief task.")
        names = {t for t in self.task_names()}
        for kill in self.kills:
            if kill.task not in names:
                raise invalid(LaunchError, "--kill", kill.task, describe_choices(kill.task, names))
        self._check_elastic()

    def _check_elastic(self) -> None:
        """--min-workers/--max-workers/--lose/--return: consistent, or LaunchError."""
        if self.min_workers is None:
            for flag, value in (("--max-workers", self.max_workers), ("--lose", self.loses),
                                ("--return", self.returns)):
                if value:
                    raise invalid(LaunchError, flag, value, "--min-workers as well (elastic training)",
                                  f"Add --min-workers N (1 <= N <= --workers {self.workers}).")
            return
        require_int(LaunchError, "--min-workers", self.min_workers, minimum=1, maximum=self.workers,
                    fix="The fewest workers the group may train with, at most --workers.")
        if self.max_workers is None:
            object.__setattr__(self, "max_workers", self.workers)
        require_int(LaunchError, "--max-workers", self.max_workers, minimum=self.min_workers, maximum=self.workers,
                    fix="Between --min-workers and --workers: the local engine grows back only with workers "
                        "it started.")
        if self.isolate_network:
            raise invalid(LaunchError, "--isolate-network", True, "no elastic options (not supported together yet)",
                          "Drop --isolate-network or --min-workers.")
        workers = {f"worker:{i}" for i in range(self.workers)}
        for event in self.loses + self.returns:
            if event.task not in workers:
                raise invalid(LaunchError, event.flag, event.task, describe_choices(event.task, workers),
                              "Only workers leave and return; a lost chief or ps needs a restart (--max-restarts).")
        lost = {event.task for event in self.loses}
        for event in self.returns:
            if event.task not in lost:
                raise invalid(LaunchError, "--return", event.task, f"a worker some --lose takes away ({sorted(lost)})",
                              f"Add --lose {event.task}@TRIGGER, or drop this --return.")

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
                raise invalid(LaunchError, "command", program, "an executable on PATH or a file path",
                              "Check the spelling, or give the full path.")
        elif not os.path.isfile(program):
            raise invalid(LaunchError, "command", program, "an existing executable file",
                          "Check the path; relative paths start from the current directory.")
        elif not os.access(program, os.X_OK):
            raise invalid(LaunchError, "command", program, "a file with execute permission",
                          f"Run `chmod +x {program}`, or put its interpreter first (e.g. `bash {program}`).")

    def runs_command(self, task: str) -> bool:
        """True when ``task`` ('type:index') runs the user's command."""
        return split_task_name(task)[0] in self.cmd_task_types()


def _iterable(value: Any) -> tuple[Any, ...]:
    """``value`` as a tuple, or a tuple holding it when it is not iterable (so checks can reject it)."""
    try:
        return tuple(value)
    except TypeError:
        return (value,)


def require_config(config: Any, field: str = "config") -> LaunchConfig:
    """Returns ``config`` if it is a :class:`LaunchConfig`; LaunchError otherwise (for the emitters' inputs)."""
    if not isinstance(config, LaunchConfig):
        raise invalid(LaunchError, field, config, "a tfdist.launch.LaunchConfig",
                      "Build one with LaunchConfig(command=(...), workers=N, ...).")
    return config
