#!/usr/bin/env bash
# Creates the stack's venv if missing, installs tfdist[test], runs pytest. Extra arguments go to pytest, e.g.
#   scripts/run_tests.sh -m "not multiprocess"     # the fast, TF-light part
#   scripts/run_tests.sh tests/cluster/test_spec.py -k fuzz
#   TFDIST_STACK=newest scripts/run_tests.sh       # on TF 2.21 + tf-keras 2.21, in .venv-newest
#   scripts/run_tests.sh --install-only            # make and install the venv, run nothing (.ci/run uses it)
#   scripts/run_tests.sh -n 0 tests/data           # one process (the default is two pytest-xdist workers)
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
# Two pytest-xdist workers, each given whole test files (--dist loadfile: a file's shared cluster and its
# module fixtures stay in one worker). Most tests wait on their TF processes as much as they compute, so two
# at once fill the machine's 2 cores: the pinned suite took 845 s instead of 1,268 s (docs/design.md).
# A later -n (e.g. -n 0) overrides this one.
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -n 2 --dist loadfile "$@"
