"""Inside the private network namespace: bring loopback up, run the cluster, report."""

from __future__ import annotations

import json
import sys

from tfdist.launch.supervisor import _netns
from tfdist.launch.supervisor.runner import run_config


def main(argv: list[str]) -> int:
    config_path, result_path = argv[1], argv[2]
    with open(config_path) as f:
        config = _netns.config_from_json(json.load(f))
    _netns.loopback_up()

    def _line(task: str, line: str) -> None:
        sys.stdout.write(f"{task}\t{line}\n")
        sys.stdout.flush()

    def _status(message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    _status("network namespace: private, loopback only; task ports are unreachable from outside")
    result = run_config(config, on_line=_line, on_status=_status)
    with open(result_path, "w") as f:
        json.dump(result.to_dict(), f)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
