"""TensorFlow's INFO chatter in a TF server task's output, recognised so the console can leave it out.

On TF 2.17 the C++ runtime logs through two systems. Lines of the TSL logger
(``2026-01-01 10:00:00.000000: I file.cc:12] ...``) obey ``TF_CPP_MIN_LOG_LEVEL``,
which the launcher sets to 1. Lines of the absl logger (``I0000 00:00:... file.cc:12] ...``)
do not: no variable reaches that logger in a Python process. It is the one
that prints, for every ps and worker task, ``Started server with target`` and
``eager_service_impl.cc] SessionOptions:`` followed by the task's whole
ConfigProto, about 20 lines. :class:`InfoFilter` drops these INFO records
(with their multi-line text-proto bodies) and absl's "before InitializeLog"
preamble. Warnings, errors, tracebacks and tfdist's own lines pass.

Example:
    >>> keep = InfoFilter()
    >>> lines = ["I0000 00:00:1796003962.858 15022 eager_service_impl.cc:356] SessionOptions: device_count {",
    ...          '  key: "CPU"', "}", "allow_soft_placement: true", "",
    ...          "INFO tfdist.launch.server: TensorFlow server ps:0 up",
    ...          "W0000 00:00:1796003963.001 15022 server.cc:9] a real warning"]
    >>> [line for line in lines if keep(line)]
    ['INFO tfdist.launch.server: TensorFlow server ps:0 up', 'W0000 00:00:1796003963.001 15022 server.cc:9] a real warning']
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Optional

from tfdist.launch._process import LineSink

__all__ = ["InfoFilter", "quiet_sink", "wants_tf_info"]

_ABSL_INFO = re.compile(r"^I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w./-]+:\d+\] ")
_TSL_INFO = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: I [\w./-]+:\d+\] ")
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# A line of a text-format proto: `field {`, `field: value`, `}` (indented), or the blank line ending the record.
_PROTO_LINE = re.compile(r"^\s*(?:\}|[A-Za-z_][\w.]*(?: \{|: .*))\s*$")


class InfoFilter:
    """A per-task line filter: ``keep(line)`` is False for TensorFlow INFO records and their bodies."""

    def __init__(self) -> None:
        self._in_record = False

    def __call__(self, line: str) -> bool:
        if self._in_record:
            if line.strip() == "":
                self._in_record = False
                return False
            if _PROTO_LINE.match(line):
                return False
            self._in_record = False
        if _ABSL_INFO.match(line) or _TSL_INFO.match(line):
            self._in_record = True
            return False
        return line != _ABSL_PREAMBLE


def wants_tf_info(env: Mapping[str, str]) -> bool:
    """True when the user asked for TensorFlow's INFO logs (``TF_CPP_MIN_LOG_LEVEL=0``)."""
    return env.get("TF_CPP_MIN_LOG_LEVEL", "").strip() == "0"


def quiet_sink(sink: Optional[LineSink]) -> Optional[LineSink]:
    """``sink`` without TensorFlow's INFO records (one :class:`InfoFilter` per task); None stays None."""
    if sink is None:
        return None
    filters: dict[str, InfoFilter] = {}

    def _sink(task: str, line: str) -> None:
        if filters.setdefault(task, InfoFilter())(line):
            sink(task, line)

    return _sink
