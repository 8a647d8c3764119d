"""tensorflow-io aborts at exit after S3 access (tensorflow/io#2039); exit_cleanly keeps the real exit code."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from absl.testing import parameterized

from tfdist._compat import tfio_unavailable_reason
from tfdist.runtime.clean_exit import exit_code_of

pytestmark = pytest.mark.timeout(300)

S3_SCRIPT = textwrap.dedent("""
    import logging, sys
    import boto3
    import tensorflow as tf, tensorflow_io  # noqa: F401 - registers s3://
    import tfdist

    def main():
        boto3.client("s3", endpoint_url=sys.argv[3]).create_bucket(Bucket=sys.argv[2])
        with tf.io.gfile.GFile(f"s3://{sys.argv[2]}/hello.txt", "w") as f:
            f.write("hello")
        print("read back:", tf.io.gfile.GFile(f"s3://{sys.argv[2]}/hello.txt").read(), flush=True)
        logging.getLogger("job").warning("last log line")
        if sys.argv[4] == "raise":
            raise RuntimeError("training failed")
        return int(sys.argv[4])

    if sys.argv[1] == "guard":
        tfdist.exit_cleanly(main)
    else:
        sys.exit(main())
""")


@pytest.mark.s3
@pytest.mark.skipif(
    tfio_unavailable_reason() is not None, reason=f"the abort comes from tensorflow-io, and {tfio_unavailable_reason()}"
)
class CleanExitTest(parameterized.TestCase):
    @pytest.fixture(autouse=True)
    def _server(self, s3_server: dict[str, str]) -> None:
        self.env = dict(os.environ, **s3_server)

    def _run(self, mode: str, bucket: str, outcome: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", S3_SCRIPT, mode, bucket, self.env["S3_ENDPOINT"], outcome],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def test_without_the_guard_the_process_aborts(self) -> None:
        done = self._run("plain", "tfdist-plain", "0")
        self.assertIn("read back: hello", done.stdout)
        # Upstream bug still present: a successful job exits 134. If this changes, the guard may be dropped.
        self.assertEqual(done.returncode, -6, done.stderr[-2000:])  # SIGABRT: the shell reports 134.
        self.assertIn("pure virtual method called", done.stderr)

    @parameterized.named_parameters(("success", "0", 0), ("exit_code", "3", 3), ("exception", "raise", 1))
    def test_the_guard_keeps_the_exit_code_and_the_output(self, outcome: str, code: int) -> None:
        done = self._run("guard", f"tfdist-guard-{outcome}", outcome)
        self.assertEqual(done.returncode, code, done.stderr[-2000:])
        self.assertIn("read back: hello", done.stdout)
        self.assertIn("last log line", done.stderr)
        self.assertNotIn("pure virtual method called", done.stderr)
        if outcome == "raise":
            self.assertIn("RuntimeError: training failed", done.stderr)


@pytest.mark.parametrize("value,code", [(None, 0), (0, 0), (3, 3), (256 + 7, 7), (True, 1), ("message", 1)])
def test_exit_code_of(value: object, code: int) -> None:
    assert exit_code_of(value) == code
