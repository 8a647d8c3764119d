"""Runs one function in a task (:func:`tfdist.launch.run_function`) and prints its result as JSON.

The function comes by reference (``--module``, ``--file``) or pickled by value (``--pickled``).
"""

from __future__ import annotations

import argparse
import base64
import importlib
import importlib.util
import json
import os
import pickle
import sys
from typing import Any

from tfdist.runtime.clean_exit import exit_cleanly
from tfdist.runtime.watchdog import watch_steps

RESULT_PREFIX = "TFDIST_RESULT "  # The line a task prints its JSON result behind (read by tfdist.launch.functions).
# The modules a function may be pickled by value with (tfdist.launch.functions), in the order tried.
PICKLERS = ("cloudpickle", "pyspark.cloudpickle", "ray.cloudpickle")


def _pickled(pickler: str, payload: str) -> Any:
    if pickler not in PICKLERS:
        raise SystemExit(f"tfdist: unknown pickler {pickler!r}")
    importlib.import_module(pickler)  # what the payload's functions are rebuilt with
    return pickle.loads(base64.b64decode(payload))


def main() -> int:
    parser = argparse.ArgumentParser()
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--module")
    where.add_argument("--file")
    where.add_argument("--pickled", nargs=2, metavar=("PICKLER", "BASE64"))
    parser.add_argument("rest", nargs="+", help="FUNCTION ARGS (ARGS alone with --pickled)")
    args = parser.parse_args()
    if args.pickled:
        target: Any = _pickled(*args.pickled)
        (encoded,) = args.rest
    else:
        function, encoded = args.rest
        if args.module:
            module = importlib.import_module(args.module)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(args.file)))
            spec = importlib.util.spec_from_file_location("_tfdist_task_module", args.file)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        target = module
        for part in function.split("."):
            target = getattr(target, part)
    watch_steps()  # the stall inspector's watchdog, when the launcher asks for it
    value = target(*json.loads(encoded))
    sys.stdout.write(RESULT_PREFIX + json.dumps(value) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    exit_cleanly(main)
