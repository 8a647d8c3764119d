"""What the tasks of tests/launch/engines/test_forkserver.py run: ``python -m`` this module ACTION [ARGS]."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any


def _disposition(handler: Any) -> str:
    if handler in (signal.SIG_DFL, signal.SIG_IGN):
        return "default" if handler == signal.SIG_DFL else "ignored"
    return str(getattr(handler, "__name__", handler))


def _show() -> None:
    print(
        json.dumps(
            {
                "name": __name__,
                "argv": sys.argv,
                "cwd": os.getcwd(),
                "path0": sys.path[0],
                "env": dict(os.environ),
                "leader": os.getsid(0) == os.getpid() == os.getpgid(0),
                "stdin": sys.stdin.read(),
                "signals": {
                    name: _disposition(signal.getsignal(getattr(signal, name)))
                    for name in ("SIGTERM", "SIGCHLD", "SIGPIPE", "SIGINT", "SIGHUP")
                },
            }
        )
    )


def _late() -> None:
    atexit.register(lambda: print("atexit ran", flush=True))

    def _later() -> None:
        time.sleep(0.3)
        print("thread ended", flush=True)

    threading.Thread(target=_later).start()
    print("main returned")


def main(action: str, *args: str) -> None:
    if action == "exit":
        sys.exit(int(args[0]))
    if action == "message":
        sys.exit("the task failed on purpose")
    if action == "raise":
        raise RuntimeError("boom on purpose")
    if action == "lines":
        print("to stdout")
        print("to stderr", file=sys.stderr)
    if action == "show":
        _show()
    if action == "late":
        _late()
    if action == "sleep":
        print("ready", flush=True)
        time.sleep(60)
    if action == "group":  # a grandchild in the task's process group
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(f"grandchild {child.pid}", flush=True)
        time.sleep(60)


def mwms_fit_and_parent(global_batch: int, epochs: int) -> dict[str, Any]:
    """The 2-worker MWMS fit of tests/keras/test_fit.py, and the command line of this task's parent."""
    import numpy as np

    from tests.keras._tasks_fit import equivalence_mwms

    draw = float(np.random.random())  # before the fit seeds NumPy
    value = equivalence_mwms(global_batch, epochs)
    value["draw"] = draw
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        value["parent"] = [arg.decode() for arg in f.read().split(b"\0") if arg]
    value["ppid"] = os.getppid()
    return value


if __name__ == "__main__":
    main(*sys.argv[1:])
