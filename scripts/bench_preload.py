"""Benchmark: test files that run local clusters, with their tasks forked from a preloaded server or not.

    .venv/bin/python scripts/bench_preload.py [--repeats 1] [TEST_FILE ...]

Runs pytest on the files (default: tests/keras/test_resume.py and tests/comm/test_compression_resume.py)
once with ``preload`` on (``run_cluster``'s default: tasks forked from a fork server that imported
TensorFlow once) and once off (every task a new interpreter), alternating, each in a new interpreter. For each
run: the wall time and the machine's CPU time (the sum of user, nice, system, irq and softirq of /proc/stat
before and after, all cores: other load on the machine counts too, so run it on a quiet machine) and the CPU
time of the run's own processes (pytest and every process it started and reaped, the forked tasks included:
``RUSAGE_CHILDREN``, which other users' load does not touch). Reports the medians per mode.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

FILES = ("tests/keras/test_resume.py", "tests/comm/test_compression_resume.py")
# The pytest run, with run_cluster's and run_function's default for `preload` set first.
_PYTEST = """
import sys
import pytest
import tfdist.launch.functions
import tfdist.testing
for function in (tfdist.testing.run_cluster, tfdist.launch.functions.run_function):
    function.__kwdefaults__["preload"] = sys.argv[1] == "on"
sys.exit(pytest.main(["-p", "no:cacheprovider", "-q", *sys.argv[2:]]))
"""


def _cpu_seconds() -> float:
    """The machine's busy CPU time so far: user + nice + system + irq + softirq of every core."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    ticks = sum(int(fields[i]) for i in (1, 2, 3, 6, 7))
    return ticks / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(mode: str, files: list[str]) -> tuple[float, float, float, int]:
    """(wall s, machine CPU s, the run's own CPU s, pytest exit code) of one run."""
    cpu, own, wall = _cpu_seconds(), _own_seconds(), time.monotonic()
    code = subprocess.run([sys.executable, "-c", _PYTEST, mode, *files], check=False).returncode
    return time.monotonic() - wall, _cpu_seconds() - cpu, _own_seconds() - own, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--first", choices=("on", "off"), default="on", help="the mode of the first run")
    parser.add_argument("files", nargs="*", default=list(FILES))
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, float, int]]] = {"on": [], "off": []}
    for repeat in range(args.repeats):
        order = ("on", "off") if args.first == "on" else ("off", "on")
        for mode in order if repeat % 2 == 0 else order[::-1]:
            results[mode].append(_run(mode, args.files))
            wall, cpu, own, code = results[mode][-1]
            print(
                f"preload {mode}: wall {wall:.1f} s, machine CPU {cpu:.1f} s, own CPU {own:.1f} s, pytest exit {code}",
                flush=True,
            )
    for mode, runs in results.items():
        wall, cpu, own = (statistics.median(run[i] for run in runs) for i in range(3))
        print(
            f"median preload {mode}: wall {wall:.1f} s, machine CPU {cpu:.1f} s, own CPU {own:.1f} s ({len(runs)} runs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
