#!/usr/bin/env bash
# Creates .venv if missing, installs tfdist[test], runs pytest. Extra arguments go to pytest, e.g.
#   scripts/run_tests.sh -m "not multiprocess"     # the fast, TF-light part
#   scripts/run_tests.sh tests/test_cluster.py -k fuzz
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
tfdist_venv test
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
