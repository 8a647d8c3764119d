"""A private network namespace that has only loopback, for the local engine's ``isolate_network`` runs.

One holder process (:mod:`tfdist.launch.tasks.netns`) makes the namespace with ``unshare -n`` (as root) or
``unshare -rn`` (rootless, in a user namespace of its own, where the kernel allows one), brings ``lo`` up and
keeps the namespace open. Every task then starts inside it through ``nsenter`` (its pid and process group are
the task's own: ``nsenter`` execs the task). The launcher itself stays in the host's network, so no task port
is reachable from there; the questions that must be asked where the tasks run (which ports are free, which
hosts are local) go to the holder, which answers them from inside (:class:`Namespace` is a
:class:`~tfdist.launch.engines._ports.Ports`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

from tfdist.errors import Error, LaunchError, LaunchFailure
from tfdist.launch.tasks.programs import TaskProgram

_ERRORS: dict[str, type[Error]] = {"LaunchError": LaunchError, "LaunchFailure": LaunchFailure}
_CLOSE_WAIT = 5.0


def require_tool(name: str, option: str = "isolate_network") -> str:
    """The path of the command ``name``; LaunchFailure naming ``option`` (what needs it) when it is missing."""
    path = shutil.which(name)
    if path is None:
        package = "iproute2" if name in ("ip", "tc") else "util-linux"
        raise LaunchFailure(
            f"`{option}` needs the '{name}' command ({package}); install it, or leave `{option}` off.",
            field=option,
            value=True,
        )
    return path


def unshare_argv(*, rootless: bool | None = None, option: str = "isolate_network") -> list[str]:
    """The ``unshare`` prefix that makes a network namespace here: ``-n`` as root, ``-rn`` otherwise.

    Raises:
      LaunchFailure: ``unshare`` is missing or cannot make a namespace here (no privileges, user namespaces
        disabled).
    """
    rootless = os.geteuid() != 0 if rootless is None else rootless
    argv = [require_tool("unshare", option), "-rn" if rootless else "-n"]
    probe = subprocess.run(argv + ["true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        raise LaunchFailure(
            f"`{option}` is unavailable here: `unshare {argv[1]} true` failed with "
            f"{probe.stderr.strip() or probe.returncode!r}. Run as root or enable unprivileged user "
            f"namespaces (sysctl kernel.unprivileged_userns_clone=1), or leave `{option}` off.",
            field=option,
            value=True,
        )
    return argv


class Namespace:
    """A private network namespace, open until :meth:`close`; tasks start in it with :meth:`enter`.

    Example (not run here: it needs ``unshare`` and privileges)::

        namespace = Namespace()
        port = namespace.pick(1, "127.0.0.1")[0]       # free inside the namespace
        argv = namespace.enter(["python", "-m", "http.server", str(port)])
        ...                                             # subprocess.Popen(argv): unreachable from the host
        namespace.close()

    Args:
      rootless: Make it inside a user namespace (``unshare -rn``); default when not running as root.
      inside: Make it from inside this namespace (a simulated host behind a private bridge): it belongs to
        that namespace's user namespace, as rootless as it.
      option: The option that asked for it, named in errors.
    """

    def __init__(
        self, *, rootless: bool | None = None, inside: Namespace | None = None, option: str = "isolate_network"
    ) -> None:
        self.option = option
        self._nsenter = require_tool("nsenter", option)
        if inside is None:
            self.rootless = os.geteuid() != 0 if rootless is None else rootless
            argv = unshare_argv(rootless=self.rootless, option=option) + TaskProgram.NETNS.argv()
        else:  # a namespace of its own, made by a process that runs in ``inside`` (and in its user namespace)
            self.rootless = inside.rootless
            argv = inside.enter([require_tool("unshare", option), "-n", *TaskProgram.NETNS.argv()])
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            ready = self._read()
            self.pid = int(ready["pid"])
            if os.stat(f"/proc/{self.pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino:
                raise LaunchFailure(
                    f"`{option}`: the namespace holder runs in the launcher's own network "
                    "namespace; nothing would be isolated.",
                    field=option,
                    value=True,
                )
        except BaseException:
            self.close()
            raise

    def _read(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:  # the holder ended: nothing more will come
            self._end()
            why = self._proc.stderr.read().strip() if self._proc.stderr is not None else ""
            raise LaunchFailure(
                f"The private network namespace (`{self.option}`) ended (exit "
                f"{self._proc.returncode}): {why[-2000:] or 'no message'}.",
                field=self.option,
                value=True,
            )
        return json.loads(line)

    def _ask(self, op: str, **arguments: Any) -> Any:
        with self._lock:
            if self._proc.poll() is not None or self._proc.stdin is None or self._proc.stdin.closed:
                raise LaunchFailure(
                    f"The private network namespace (`{self.option}`) is closed.", field=self.option, value=True
                )
            try:
                self._proc.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                pass  # _read says what happened
            answer = self._read()
        if "error" in answer:
            kind = _ERRORS.get(answer["error"], LaunchFailure)
            raise kind(
                answer["message"],
                field=answer.get("field"),
                value=answer.get("value"),
                expected=answer.get("expected"),
                fix=answer.get("fix"),
            )
        return answer["result"]

    def pick(self, count: int, host: str) -> list[int]:
        """``count`` distinct ports free inside the namespace a moment ago (see :class:`Ports`)."""
        return [int(port) for port in self._ask("pick", count=count, host=host)]

    def is_free(self, host: str, port: int) -> bool:
        return bool(self._ask("is_free", host=host, port=port))

    def is_local(self, host: str) -> bool:
        return bool(self._ask("is_local", host=host))

    def enter(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as a command that runs inside the namespace (``nsenter`` execs it: same pid)."""
        if self._proc.poll() is not None:  # not reaped before: the holder's pid cannot belong to anyone else
            raise LaunchFailure(
                f"The private network namespace (`{self.option}`) is gone: its holder process "
                f"ended (exit {self._proc.returncode}).",
                field=self.option,
                value=True,
            )
        ns = f"/proc/{self.pid}/ns"
        prefix = [self._nsenter, f"--net={ns}/net"]
        if self.rootless:  # the namespace belongs to the holder's user namespace: enter that first
            prefix = [self._nsenter, f"--user={ns}/user", f"--net={ns}/net", "--preserve-credentials"]
        return prefix + ["--", *argv]

    def close(self) -> None:
        """Ends the holder; the namespace goes with the last task in it. Idempotent."""
        with self._lock:
            if self._proc.stdin is not None and not self._proc.stdin.closed:
                try:
                    self._proc.stdin.close()
                except BrokenPipeError:
                    pass
        self._end()
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()

    def _end(self) -> None:
        try:
            self._proc.wait(_CLOSE_WAIT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
