"""Run a Python function in every task of a cluster, on any engine; its return values come back per task.

A module-level function runs by reference (its file is imported in each task). A function defined in a
notebook or a script's ``__main__``, or inside another function, runs by value: it is pickled with
cloudpickle into the task's command line (so it reaches Spark executors and Ray nodes with no shared
files), and must stay small; pass data as files or arguments. Either way the return value must be JSON.

Example:
    >>> import sys
    >>> from tfdist.launch import run_function
    >>> def hello(greeting):
    ...     import os
    ...     return f"{greeting} from {os.environ['TFDIST_TASK']}"
    >>> run = run_function(hello, args=("hi",), workers=2, timeout=60)
    >>> run.ok, sorted(run.values.values())
    (True, ['hi from worker:0', 'hi from worker:1'])
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import inspect
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tfdist.errors import LaunchError, invalid
from tfdist.launch.engines.base import Engine
from tfdist.launch.results import LaunchResult
from tfdist.launch.supervisor.runner import run
from tfdist.launch.tasks.function import PICKLERS, RESULT_PREFIX
from tfdist.launch.tasks.programs import TaskProgram

__all__ = ["FunctionRun", "run_function"]

Target = Sequence[str] | str | Callable[..., Any]
# A command line argument may hold at most 128 KiB on Linux (MAX_ARG_STRLEN); base64 adds a third.
MAX_PICKLED_BYTES = 90 * 1024


@dataclasses.dataclass(frozen=True, kw_only=True)
class FunctionRun:
    """A finished cluster run of a function or command.

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


def _pickler() -> tuple[str, Any]:
    for name in PICKLERS:
        try:
            return name, importlib.import_module(name)
        except ImportError:
            continue
    raise invalid(
        LaunchError,
        "target",
        None,
        "a module-level function (cloudpickle, needed for other functions, is not installed)",
        "Move the function to a module, or install cloudpickle (pyspark and Ray bring one).",
    )


def _by_value(target: Callable[..., Any]) -> list[str]:
    name, pickler = _pickler()
    payload = pickler.dumps(target)
    if len(payload) > MAX_PICKLED_BYTES:
        raise invalid(
            LaunchError,
            "target",
            getattr(target, "__qualname__", target),
            f"a function that pickles to at most {MAX_PICKLED_BYTES // 1024} KiB (this one: {len(payload) // 1024} "
            "KiB, with what it captures)",
            "Pass large inputs as files or arguments, or move the function to a module.",
        )
    return ["--pickled", name, base64.b64encode(payload).decode()]


def _importable(target: Callable[..., Any]) -> str:
    """The file that defines ``target`` under its name, or '' when the task must get it by value (a notebook's
    or a script's ``__main__``, a nested function, a lambda, a doctest)."""
    module = sys.modules.get(getattr(target, "__module__", None) or "__main__")
    if module is None or module.__name__ == "__main__":
        return ""
    found: Any = module
    for part in getattr(target, "__qualname__", "<lambda>").split("."):
        found = getattr(found, part, None)
    if found is not target:
        return ""
    try:
        return inspect.getfile(module)
    except TypeError:
        return ""


def command_for(target: Target, args: Sequence[Any] = ()) -> list[str]:
    """The argv that runs ``target`` (a command, 'module:function' or function) in a task."""
    if isinstance(target, str):
        module, _, function = target.partition(":")
        if not function:
            raise invalid(LaunchError, "target", target, "'module:function', a function or a command list")
        where = ["--module", module, function]
    elif callable(target):
        source = _importable(target)
        where = ["--file", source, target.__qualname__] if source else _by_value(target)
    elif (
        isinstance(target, Sequence)
        and not isinstance(target, bytes)
        and target
        and all(isinstance(arg, str) for arg in target)
    ):
        return list(target)
    else:
        raise invalid(LaunchError, "target", target, "'module:function', a function or a command list")
    try:
        encoded = json.dumps(list(args))
    except (TypeError, ValueError) as err:
        raise invalid(LaunchError, "args", args, f"JSON-serializable arguments ({err})") from None
    return TaskProgram.FUNCTION.argv(*where, encoded)


def values_of(result: LaunchResult) -> dict[str, Any]:
    """Task -> the value its function returned (the ``TFDIST_RESULT`` line it printed)."""
    values = {}
    for task in result.tasks:
        for line in task.output.splitlines():
            if line.startswith(RESULT_PREFIX):
                values[task.task] = json.loads(line[len(RESULT_PREFIX) :])
    return values


def run_function(
    target: Target,
    *,
    workers: int,
    args: Sequence[Any] = (),
    engine: str | Engine | None = None,
    preload: bool = True,
    **options: Any,
) -> FunctionRun:
    """Runs ``target`` in every command task of a cluster and waits for the end.

    Args:
      target: A function (any, see the module docstring), ``'module:function'``
        or a command (argv list).
      workers: Worker tasks.
      args: JSON-serializable positional arguments for the function.
      engine: Where the tasks run: 'local' (default), 'ray', 'spark' (the
        active SparkSession), or an Engine such as ``SparkEngine(spark=spark)``.
      preload: Fork the tasks from a process that has imported TensorFlow
        once (the local engine's fork server, see ``LaunchConfig.preload``),
        instead of starting a new interpreter per task: on by default here,
        since a function task is tfdist's own program. False: new processes.
      **options: The other :func:`tfdist.launch.run` options: ``ps``,
        ``chief``, ``timeout``, ``max_restarts``, ``kills``...

    Returns:
      A :class:`FunctionRun`: ``values`` holds each task's return value.
    """
    result = run(command_for(target, args), workers=workers, engine=engine, preload=preload, **options)
    return FunctionRun(result=result, values=values_of(result))
