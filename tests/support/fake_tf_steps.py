"""A training task without TensorFlow, for the tests of the step watchdog and the stall inspector.

``python fake_tf_steps.py STEPS [worker:1=py_function ...]`` puts a fake ``tensorflow`` package in
``sys.modules``, whose "TensorFlow calls" are functions compiled under its file names, starts the step watchdog
(``TFDIST_STEP_WATCH``, as ``tfdist.build_strategy`` would), runs STEPS steps (calls that return), prints
``STUCK <where>`` and then stays stuck, by this task's entry (``TFDIST_TASK``; default ``tensorflow``):
``tensorflow`` blocks inside a call, ``py_function`` blocks in a py_function body (on a thread that went
through ``script_ops.py``) inside a call, ``python`` sleeps outside any call, ``done`` exits 0.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

PREFIX = os.path.join(tempfile.gettempdir(), "tfdist-fake-tf", "tensorflow") + os.sep

TF_SOURCE = """
import _thread, time

def quick_execute(seconds):
    time.sleep(seconds)

def run_py_function(body):
    lock = _thread.allocate_lock()
    lock.acquire()
    def run():
        try:
            py_function(body)
        finally:
            lock.release()
    _thread.start_new_thread(run, ())
    lock.acquire()  # native wait: the innermost Python frame stays this one, as in TF's C++
"""
PY_FUNCTION_SOURCE = """
def py_function(body):
    return body()
"""


def _compiled(relative: str, source: str, namespace: dict[str, Any]) -> dict[str, Any]:
    exec(compile(source, PREFIX + relative, "exec"), namespace)
    return namespace


def fake_tensorflow() -> dict[str, Callable[..., Any]]:
    """Makes the fake package current: ``quick_execute(seconds)`` and ``run_py_function(body)``."""
    from tfdist._compat.frames import PY_FUNCTION_FILE

    package = types.ModuleType("tensorflow")
    package.__file__ = PREFIX + "__init__.py"
    sys.modules["tensorflow"] = package
    names = _compiled(PY_FUNCTION_FILE, PY_FUNCTION_SOURCE, {})
    return _compiled(os.path.join("python", "eager", "execute.py"), TF_SOURCE, {"py_function": names["py_function"]})


def sleep_in_py_function() -> None:
    time.sleep(3600)


def main() -> None:
    tf = fake_tensorflow()
    from tfdist.runtime.watchdog import watch_steps

    if not watch_steps():
        raise SystemExit("TFDIST_STEP_WATCH is not set")
    steps = int(sys.argv[1])
    modes = dict(arg.split("=", 1) for arg in sys.argv[2:])
    mode = modes.get(os.environ.get("TFDIST_TASK", ""), "tensorflow")
    for _ in range(steps):
        tf["quick_execute"](0.15)  # longer than a sample: every step is seen
        time.sleep(0.15)
    print(f"STUCK {mode} {time.time():.3f}", flush=True)
    if mode == "tensorflow":
        tf["quick_execute"](3600)
    elif mode == "py_function":
        tf["run_py_function"](sleep_in_py_function)
    elif mode == "python":
        time.sleep(3600)


if __name__ == "__main__":
    main()
