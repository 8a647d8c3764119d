#!/usr/bin/env bash
# Creates the stack's venv if missing, installs tfdist[test], runs pytest. Extra arguments go to pytest, e.g.
#   scripts/run_tests.sh -m "not multiprocess"     # the fast, TF-light part
#   scripts/run_tests.sh tests/cluster/test_spec.py -k fuzz
#   TFDIST_STACK=newest scripts/run_tests.sh       # on TF 2.21 + tf-keras 2.21, in .venv-newest
#   scripts/run_tests.sh --install-only            # make and install the venv, run nothing (.ci/run uses it)
# TFDIST_STACK is pinned (default: TF 2.17.1 + tf-keras 2.17 + tensorflow-io 0.37.1) or newest;
# scripts/_venv.sh and scripts/stacks/ say what each installs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
# ray, spark: the Ray and Spark engines' tests (Java for Spark: the spark_cluster fixture installs Debian's
# openjdk-17-jre-headless when no java is found); demo: scikit-learn, whose bundled digits tests/data/test_digits.py writes
tfdist_venv test,ray,spark,demo
if [ "${1:-}" = "--install-only" ]; then
  exit 0
fi
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
