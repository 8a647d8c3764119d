"""Run a local cluster around a Python function or a command, for tests.

A hard timeout is mandatory and every process is reaped, whatever happens.
A function runs in every command task; its JSON-serializable return value
comes back per task in :attr:`ClusterRun.values`.

Example:
    >>> import sys
    >>> from tfdist import testing
    >>> run = testing.run_cluster([sys.executable, "-c", "pass"], workers=2, timeout=60)
    >>> run.ok
    True
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tfdist.errors import LaunchError, invalid
from tfdist.launch.events import KillAt
from tfdist.launch.results import LaunchResult
from tfdist.launch.supervisor.runner import run
from tfdist.launch.tasks.function import RESULT_PREFIX

__all__ = ["RESULT_PREFIX", "ClusterRun", "KillAt", "command_for", "run_cluster"]

Target = Sequence[str] | str | Callable[..., Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterRun:
    """A finished local cluster run.

    Attributes:
      result: The launcher's result (exit codes, restarts, output per task).
      values: Task -> the function's return value, for function targets.
    """

    result: LaunchResult
    values: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.result.exit_code == 0

    def output(self, task: str) -> str:
        return self.result.task(task).output


def command_for(target: Target, args: Sequence[Any] = ()) -> list[str]:
    """The argv that runs ``target`` (a command, 'module:function' or function) in a task."""
    if isinstance(target, str):
        module, _, function = target.partition(":")
        if not function:
            raise invalid(LaunchError, "target", target, "'module:function', a function or a command list")
        where = ["--module", module]
    elif callable(target):
        function = target.__qualname__
        if "<locals>" in function:
            raise invalid(LaunchError, "target", function, "a module-level function", "Move it to module level.")
        where = ["--file", inspect.getfile(target)]
    elif (
        isinstance(target, Sequence)
        and not isinstance(target, bytes)
        and target
        and all(isinstance(arg, str) for arg in target)
    ):
        return list(target)
    else:
        raise invalid(LaunchError, "target", target, "'module:function', a function or a command list")
    return [sys.executable, "-m", "tfdist.launch.tasks.function", *where, function, json.dumps(list(args))]


def run_cluster(
    target: Target,
    *,
    workers: int,
    timeout: float,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    args: Sequence[Any] = (),
    **options: Any,
) -> ClusterRun:
    """Runs ``target`` on a local cluster and waits for the end.

    Args:
      target: A command (argv list), ``'module:function'``, or a module-level
        function (the file defining it is imported in each task).
      workers: Worker tasks.
      timeout: Hard limit in seconds; every process is killed after it.
      ps: Parameter-server tasks.
      chief: Add a chief.
      evaluator: Add an evaluator.
      args: JSON-serializable positional arguments for the function.
      **options: More :class:`tfdist.launch.LaunchConfig` fields, e.g.
        ``kills=("worker:1@after=^EPOCH 2 DONE$",)`` to SIGKILL worker 1 once
        any task prints that line (fault tests trigger on progress, not time),
        and ``max_restarts=1``.
    """
    result = run(
        command_for(target, args), workers=workers, ps=ps, chief=chief, evaluator=evaluator, timeout=timeout, **options
    )
    values = {}
    for task in result.tasks:
        for line in task.output.splitlines():
            if line.startswith(RESULT_PREFIX):
                values[task.task] = json.loads(line[len(RESULT_PREFIX) :])
    return ClusterRun(result=result, values=values)
