# Sourced by run_tests.sh, run_demo.sh and the benchmarks: make .venv (Python 3.11) and install tfdist.
# Usage: source scripts/_venv.sh [EXTRAS]   (EXTRAS e.g. "test" or "test,bench"; empty for none)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
_extras="${1:-}"

_pick_python() {
  for candidate in "${PYTHON:-}" python3.11 python3; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      echo "$candidate"; return 0
    fi
  done
  echo "tfdist needs Python 3.11 (TensorFlow 2.17.1 wheels); set PYTHON=/path/to/python3.11" >&2
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  py="$(_pick_python)"
  echo "tfdist: creating $VENV with $("$py" --version)" >&2
  "$py" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi

# Reinstall only when the packaging changed or other extras are asked for (a fresh clone always installs).
_stamp="$VENV/.tfdist-installed"
_want="$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" | sha1sum | cut -c1-12) [$_extras]"
if [ ! -f "$_stamp" ] || ! grep -qxF "$_want" "$_stamp"; then
  echo "tfdist: installing tfdist${_extras:+[$_extras]} into $VENV (first run downloads TensorFlow, ~600 MB)" >&2
  if [ -n "$_extras" ]; then
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$_extras]"
  else
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT"
  fi
  echo "$_want" >> "$_stamp"
fi
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
