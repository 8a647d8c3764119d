"""Runs one function in a task of a ``tfdist.testing`` cluster and prints its result as JSON."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from typing import Any

from tfdist.runtime.clean_exit import exit_cleanly

RESULT_PREFIX = "TFDIST_RESULT "  # The line a task prints its JSON result behind (read by tfdist.testing).


def main() -> int:
    parser = argparse.ArgumentParser()
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--module")
    where.add_argument("--file")
    parser.add_argument("function")
    parser.add_argument("args")
    args = parser.parse_args()
    if args.module:
        module = importlib.import_module(args.module)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.file)))
        spec = importlib.util.spec_from_file_location("_tfdist_task_module", args.file)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    target: Any = module
    for part in args.function.split("."):
        target = getattr(target, part)
    value = target(*json.loads(args.args))
    sys.stdout.write(RESULT_PREFIX + json.dumps(value) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    exit_cleanly(main)
