"""Runs a local cluster inside a private network namespace that has only loopback.

The supervisor re-runs itself under ``unshare -n`` (root) or ``unshare -rn``
(rootless, where the kernel allows user namespaces), brings ``lo`` up, and
runs the cluster there; lines and the final result come back over pipes and
a JSON file. No task port is reachable from outside the namespace.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

from tfdist.errors import LaunchFailure
from tfdist.launch.engines._reaper import Reaper
from tfdist.launch.config import KillAt, LaunchConfig
from tfdist.launch.results import LaunchResult

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """Brings the namespace's ``lo`` interface up (it starts down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


def unshare_argv() -> list[str]:
    """The ``unshare`` prefix that works here; LaunchFailure where none does."""
    if shutil.which("unshare") is None:
        raise LaunchFailure("--isolate-network needs the 'unshare' command (util-linux); install it, or run "
                          "without --isolate-network.")
    argv = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    probe = subprocess.run(argv + ["true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        raise LaunchFailure(f"--isolate-network is unavailable: `{' '.join(argv)} true` failed with "
                          f"{probe.stderr.strip() or probe.returncode!r}. Run as root or enable unprivileged user "
                          "namespaces (sysctl kernel.unprivileged_userns_clone=1), or drop --isolate-network.")
    return argv


def config_to_json(config: LaunchConfig) -> dict[str, Any]:
    data = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    data.update(command=list(config.command), env=dict(config.env), kills=[dataclasses.asdict(k) for k in config.kills],
                isolate_network=False)
    return data


def config_from_json(data: dict[str, Any]) -> LaunchConfig:
    data = dict(data)
    data["kills"] = tuple(KillAt(**k) for k in data["kills"])
    data["command"] = tuple(data["command"])
    return LaunchConfig(**data)


def run_isolated(config: LaunchConfig, *, on_line: Optional[Callable[[str, str], None]],
                 on_status: Callable[[str], None], base_env: Mapping[str, str], stop: Any = None) -> LaunchResult:
    """Runs ``config`` in a new network namespace; returns its LaunchResult.

    ``stop`` (the runner's signal watcher) has ``signum`` set when the run must
    stop: the signal is passed on to the launcher inside, which stops its tasks.
    """
    prefix = unshare_argv()
    with tempfile.TemporaryDirectory(prefix="tfdist-netns-") as tmp:
        config_path, result_path = os.path.join(tmp, "config.json"), os.path.join(tmp, "result.json")
        with open(config_path, "w") as f:
            json.dump(config_to_json(config), f)
        argv = prefix + [sys.executable, "-m", "tfdist.launch.tasks.netns_child", config_path, result_path]
        reaper = Reaper(grace=config.grace_seconds + 10)  # The inner launcher stops its own tasks first.
        proc = subprocess.Popen(argv, env=dict(base_env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        reaper.watch(proc.pid)

        def _lines() -> None:
            for raw in proc.stdout:  # type: ignore[union-attr]
                task, _, line = raw.rstrip("\n").partition("\t")
                if on_line is not None:
                    on_line(task, line)

        def _status() -> None:
            for raw in proc.stderr:  # type: ignore[union-attr]
                on_status(raw.rstrip("\n"))

        readers = [threading.Thread(target=fn, daemon=True) for fn in (_lines, _status)]
        for reader in readers:
            reader.start()
        forwarded = None
        try:
            while proc.poll() is None:
                signum = getattr(stop, "signum", None)
                if signum is not None and forwarded is None:
                    forwarded = signum
                    os.killpg(proc.pid, signum)
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(config.grace_seconds + 10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            for reader in readers:
                reader.join(5)
            reaper.forget(proc.pid)
            reaper.close()
        if not os.path.exists(result_path):
            raise LaunchFailure(f"The isolated launcher exited with {proc.returncode} before reporting a result; "
                              "see the status lines above.")
        with open(result_path) as f:
            data = json.load(f)
    return LaunchResult.from_dict(data)
