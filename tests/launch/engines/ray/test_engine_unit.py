"""The Ray engine's parts that need no Ray: options, the CLI without Ray installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tfdist.errors import LaunchError
from tfdist.launch.engines.ray.engine import RayOptions, is_local_ray

PY = sys.executable


@pytest.mark.parametrize(
    "options,field",
    [
        ({"cpus_per_task": -1}, "cpus_per_task"),
        ({"cpus_per_task": 0}, "cpus_per_task"),
        ({"gpus_per_task": "1"}, "gpus_per_task"),
        ({"placement": "packed"}, "placement"),
        ({"ready_timeout": 0}, "ready_timeout"),
        ({"address": ""}, "address"),
        ({"address": "auto", "num_cpus": 4}, "num_cpus"),
        ({"cpus_per_task": float("nan")}, "cpus_per_task"),
        ({"gpus_per_task": float("inf")}, "gpus_per_task"),
        ({"ready_timeout": float("nan")}, "ready_timeout"),
        ({"ready_timeout": True}, "ready_timeout"),
        ({"num_cpus": "x"}, "num_cpus"),
        ({"num_cpus": -1}, "num_cpus"),
    ],
)
def test_bad_options_are_launch_errors(options: dict, field: str) -> None:
    with pytest.raises(LaunchError) as caught:
        RayOptions(**options)
    assert caught.value.field == field


def test_options_and_loopback() -> None:
    options = RayOptions(cpus_per_task=2, gpus_per_task=1, placement="strict_spread")
    assert (options.bundle(), options.strategy) == ({"CPU": 2.0, "GPU": 1.0}, "STRICT_SPREAD")
    assert [
        is_local_ray(a) for a in (None, "127.0.0.1:6379", "localhost:1", "[::1]:6379", "auto", "10.0.0.2:6379")
    ] == [True, True, True, True, False, False]


def test_cli_without_ray_says_how_to_install_it() -> None:
    code = (
        "import sys; sys.modules['ray'] = None; from tfdist.cli.launch import main; "
        "sys.exit(main(['--engine', 'ray', '--', sys.executable, '-c', 'pass']))"
    )
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr  # A missing package is a runtime failure (EngineError), not bad input.
    assert 'pip install ".[ray]" in a tfdist clone' in done.stderr and "Traceback" not in done.stderr
