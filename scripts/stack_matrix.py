"""The TensorFlow-version matrix of BUILD_NOTES.md, one venv at a time.

    python scripts/stack_matrix.py --python /work/venvs/stack-2.19/bin/python [--json out.json]

The venv must hold tfdist[test,s3] (editable or not) with one TensorFlow and the tf-keras of the same minor;
install tensorflow-io 0.37.1 into it too (`pip install --no-deps tensorflow-io==0.37.1
tensorflow-io-gcs-filesystem==0.37.1`) to see whether its file systems load there. Each cell is the command
printed next to it, run with that venv's Python and this checkout first on PYTHONPATH:

  MWMS fit             tests/strategy/test_multiworker.py  2-worker fit, both workers end with identical weights
  PS fit               tests/keras/test_fit.py        chief + 2 workers + 1 ps fit with fit_input and callbacks
  preemption save      tests/keras/test_fit.py        SIGTERM mid-fit saves on both workers, the rerun resumes
  compression          tests/comm/test_communication.py fp16/bf16 fit reaches the uncompressed loss (2 workers)
  accumulation         tests/comm/test_communication.py 4 micro-batches equal one large batch (2 workers)
  s3 tensorflow-io     import tensorflow_io, then 's3' in tf.io.gfile.get_registered_schemes()
  s3 boto3             tests/data/storage/test_s3.py::...[boto3] against moto (write, two workers read, verify)
  import s             `import tensorflow, tf_keras` in a fresh process, median of 3

Run it under the heavy-command lock: every cell starts TensorFlow clusters.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = {
    "MWMS fit": [
        "tests/strategy/test_multiworker.py::MultiWorkerMirroredTest::test_auto_strategy_two_workers_identical_weights"
    ],
    "PS fit": ["tests/keras/test_fit.py::TestParameterServerKeras::test_fit_input_callbacks_and_evaluator_sidecar"],
    "preemption save": ["tests/keras/test_fit.py::TestPreemption"],
    "compression": [
        "tests/comm/test_communication.py::TwoWorkerCommunicationTest::"
        "test_compressed_fit_reaches_the_uncompressed_loss"
    ],
    "accumulation": [
        "tests/comm/test_communication.py::TwoWorkerCommunicationTest::test_accumulation_equals_one_large_batch"
    ],
    "s3 boto3": ["tests/data/storage/test_s3.py::test_write_and_read_sharded_tfrecords_on_s3[boto3]"],
}
TFIO_PROBE = (
    "import tensorflow as tf\ntry:\n    import tensorflow_io\nexcept Exception as e:\n    print('IMPORT', e)\n"
    "print('S3' if 's3' in tf.io.gfile.get_registered_schemes() else 'NO-S3')"
)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")


def _pytest(python: str, ids: list[str]) -> tuple[str, float]:
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", *ids],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.perf_counter() - start
    last = (done.stdout.strip().splitlines() or ["?"])[-1]
    return ("pass" if done.returncode == 0 else f"FAIL ({last})"), seconds


def _tfio(python: str) -> str:
    done = subprocess.run([python, "-c", TFIO_PROBE], env=_env(), capture_output=True, text=True, timeout=300)
    if "S3" in done.stdout.split():
        return "loads"
    if "IMPORT" in done.stdout:
        return "import fails"
    symbol = "undefined symbol" in done.stderr
    return "imports, no s3 (undefined symbols)" if symbol else "no s3"


def _import_seconds(python: str) -> float:
    code = "import time; t = time.perf_counter(); import tensorflow, tf_keras; print(time.perf_counter() - t)"
    runs = [
        float(
            subprocess.run([python, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
            .stdout.strip()
            .splitlines()[-1]
        )
        for _ in range(3)
    ]
    return statistics.median(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True, help="the venv's python")
    parser.add_argument("--json", help="also write the row here")
    args = parser.parse_args()
    versions = subprocess.run(
        [args.python, "-c", "import importlib.metadata as m; print(m.version('tensorflow'), m.version('tf-keras'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    row: dict[str, object] = {"tensorflow": versions[0], "tf-keras": versions[1]}
    for name, ids in TESTS.items():
        result, seconds = _pytest(args.python, ids)
        row[name] = result
        row[f"{name} s"] = round(seconds, 1)
        print(f"{name}: {result} ({seconds:.0f} s)", flush=True)
    row["s3 tensorflow-io"] = _tfio(args.python)
    row["import s"] = round(_import_seconds(args.python), 2)
    print(json.dumps(row), flush=True)
    cells = ["MWMS fit", "PS fit", "preemption save", "compression", "accumulation"]
    print(
        f"| {row['tensorflow']} | {row['tf-keras']} | "
        + " | ".join(str(row[c]) for c in cells)
        + f" | {row['s3 tensorflow-io']} / {row['s3 boto3']} | {row['import s']} |"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
