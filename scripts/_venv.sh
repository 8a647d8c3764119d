# Sourced by run_tests.sh, run_demo.sh and the benchmarks. Defines tfdist_venv, which makes the venv of one
# stack (Python 3.11) and installs tfdist into it from PyPI under that stack's constraints.
#
#   TFDIST_STACK=pinned (default)  .venv         TF 2.17.1 + tf-keras 2.17 + tensorflow-io 0.37.1 (+ boto3)
#   TFDIST_STACK=newest            .venv-newest  TF 2.21.0 + tf-keras 2.21 (s3:// through boto3)
#
# The constraints live in scripts/stacks/STACK.txt; a stack's own extras are added to the ones asked for.
# Usage: source scripts/_venv.sh; tfdist_venv [EXTRAS]   (EXTRAS e.g. "test" or "test,bench"; none by default)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TFDIST_STACK="${TFDIST_STACK:-pinned}"
case "$TFDIST_STACK" in
  pinned) VENV="$ROOT/.venv"; STACK_EXTRAS="tfio,s3" ;;
  newest) VENV="$ROOT/.venv-newest"; STACK_EXTRAS="s3" ;;
  *) echo "TFDIST_STACK must be pinned or newest, not '$TFDIST_STACK'" >&2; exit 2 ;;
esac
STACK_CONSTRAINTS="$ROOT/scripts/stacks/$TFDIST_STACK.txt"

_pick_python() {
  local candidate
  for candidate in "${PYTHON:-}" python3.11 python3; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      echo "$candidate"
      return 0
    fi
  done
  echo "tfdist needs Python 3.11; set PYTHON=/path/to/python3.11" >&2
  return 1
}

tfdist_venv() {
  local extras py stamp want
  extras="$STACK_EXTRAS${1:+,$1}"
  if [ ! -x "$VENV/bin/python" ]; then
    py="$(_pick_python)"
    echo "tfdist: creating $VENV ($TFDIST_STACK stack) with $("$py" --version)" >&2
    "$py" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
  fi
  # Reinstall only when the packaging changed or other extras are asked for (a fresh clone always installs).
  stamp="$VENV/.tfdist-installed"
  want="$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" "$STACK_CONSTRAINTS" | sha1sum | cut -c1-12) [$extras]"
  if [ ! -f "$stamp" ] || ! grep -qxF "$want" "$stamp"; then
    echo "tfdist: installing tfdist[$extras] into $VENV with $STACK_CONSTRAINTS" \
      "(the first run downloads TensorFlow, ~600 MB)" >&2
    "$VENV/bin/python" -m pip install --quiet -c "$STACK_CONSTRAINTS" -e "$ROOT[$extras]"
    echo "$want" >> "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
  export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
}
