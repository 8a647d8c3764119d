"""The holder of a private network namespace, started by the local engine under ``unshare -n`` (``-rn``).

It brings the namespace's ``lo`` up, says it is ready (one JSON line: ``{"ready": true, "pid": PID}``) and
keeps the namespace open for the tasks the engine starts in it with ``nsenter``. Meanwhile it answers the
engine's port questions from inside: one JSON request a line on stdin (``{"op": "pick", "count": 2, "host":
"127.0.0.1"}``, ``"is_free"`` with ``host`` and ``port``, ``"is_local"`` with ``host``), one JSON answer a
line on stdout (``{"result": ...}``, or ``{"error": "LaunchError", "message": ...}`` with the error's
fields). It ends when its stdin closes: the launcher is done, or gone.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import sys
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from tfdist.errors import Error
from tfdist.launch.engines._ports import HOST

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_OPS: Mapping[str, Callable[[Mapping[str, Any]], Any]] = {
    "pick": lambda request: HOST.pick(request["count"], request["host"]),
    "is_free": lambda request: HOST.is_free(request["host"], request["port"]),
    "is_local": lambda request: HOST.is_local(request["host"]),
}


def loopback_up() -> None:
    """Brings the current network namespace's ``lo`` interface up (a new namespace starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


def _answer(line: str) -> dict[str, Any]:
    request = json.loads(line)
    try:
        return {"result": _OPS[request["op"]](request)}
    except Error as err:  # a bad host or no free port: the engine raises it again, as if asked here
        return {
            "error": type(err).__name__,
            "message": err.message,
            "field": err.field,
            "value": err.value,
            "expected": err.expected,
            "fix": err.fix,
        }


def serve(requests: TextIO, answers: TextIO) -> None:
    """Answers every request line of ``requests`` on ``answers`` until ``requests`` ends."""
    for line in requests:
        answers.write(json.dumps(_answer(line), default=str) + "\n")
        answers.flush()


def main() -> int:
    loopback_up()
    sys.stdout.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    serve(sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
