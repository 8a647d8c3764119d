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

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from tfdist.launch.engines import _forkserver
from tfdist.launch.events import KillAt
from tfdist.launch.functions import FunctionRun as ClusterRun
from tfdist.launch.functions import Target, command_for, run_function
from tfdist.launch.tasks.function import RESULT_PREFIX

__all__ = ["RESULT_PREFIX", "ClusterRun", "KillAt", "command_for", "run_cluster", "shared_fork_servers"]


@contextlib.contextmanager
def shared_fork_servers() -> Iterator[None]:
    """Inside the block, the local runs of this process (``run_cluster``, ``run_function``, a
    ``LaunchConfig`` with ``preload``) fork their tasks from fork servers kept between runs: a run no longer
    starts an interpreter and imports TensorFlow before its first task. For a test session or a notebook
    that runs many clusters; the servers end with the block (tasks still running go on, reaped by their run).

    Example:
        >>> import sys
        >>> with shared_fork_servers():
        ...     [run_cluster("platform:python_version", workers=1, timeout=120).ok for _ in range(2)]
        [True, True]
    """
    with _forkserver.sharing():
        yield


def run_cluster(
    target: Target,
    *,
    workers: int,
    timeout: float,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    args: Sequence[Any] = (),
    preload: bool = True,
    **options: Any,
) -> ClusterRun:
    """Runs ``target`` on a local cluster and waits for the end.

    Args:
      target: A command (argv list), ``'module:function'``, or a function
        (see :mod:`tfdist.launch.functions`).
      workers: Worker tasks.
      timeout: Hard limit in seconds; every process is killed after it.
      ps: Parameter-server tasks.
      chief: Add a chief.
      evaluator: Add an evaluator.
      args: JSON-serializable positional arguments for the function.
      preload: Fork the tasks (functions, TF servers) from a process that has
        imported TensorFlow once instead of starting a new interpreter each
        (``LaunchConfig.preload``); on by default, which saves most of a test
        cluster's CPU. A command target still starts as new processes.
      **options: More :class:`tfdist.launch.LaunchConfig` fields, e.g.
        ``kills=("worker:1@after=^EPOCH 2 DONE$",)`` to SIGKILL worker 1 once
        any task prints that line (fault tests trigger on progress, not time),
        and ``max_restarts=1``.
    """
    options.update(ps=ps, chief=chief, evaluator=evaluator, timeout=timeout, preload=preload)
    return run_function(target, workers=workers, args=args, **options)
