# Sourced by run_tests.sh, run_demo.sh and the benchmarks. Defines tfdist_venv, which makes .venv
# (Python 3.11) and installs tfdist into it from PyPI.
# Usage: source scripts/_venv.sh; tfdist_venv [EXTRAS]   (EXTRAS e.g. "test" or "test,bench"; none by default)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

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
  echo "tfdist needs Python 3.11 (TensorFlow 2.17.1 wheels); set PYTHON=/path/to/python3.11" >&2
  return 1
}

tfdist_venv() {
  local extras="${1:-}" py stamp want
  if [ ! -x "$VENV/bin/python" ]; then
    py="$(_pick_python)"
    echo "tfdist: creating $VENV with $("$py" --version)" >&2
    "$py" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
  fi
  # Reinstall only when the packaging changed or other extras are asked for (a fresh clone always installs).
  stamp="$VENV/.tfdist-installed"
  want="$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" | sha1sum | cut -c1-12) [$extras]"
  if [ ! -f "$stamp" ] || ! grep -qxF "$want" "$stamp"; then
    echo "tfdist: installing tfdist${extras:+[$extras]} into $VENV (the first run downloads TensorFlow, ~600 MB)" >&2
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT${extras:+[$extras]}"
    echo "$want" >> "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
  export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
}
