# shellcheck shell=bash
# Sourced by run_tests.sh, run_demo.sh and the benchmarks. Defines tfdist_venv, which makes the venv of one
# stack with that stack's Python and installs tfdist into it from PyPI under that stack's constraints.
#
#   TFDIST_STACK=pinned (default)  .venv         Python 3.11  TF 2.17.1 + tf-keras 2.17 + tensorflow-io 0.37.1 (+ boto3)
#   TFDIST_STACK=newest            .venv-newest  Python 3.13  TF 2.21.0 + tf-keras 2.21 (s3:// through boto3)
#
# The constraints live in scripts/stacks/STACK.txt; a stack's own extras are added to the ones asked for.
# The Python is found as pythonX.Y on PATH, in /usr/bin or /usr/local/bin, or under pyenv's versions/ (not
# necessarily in `pyenv global`). TFDIST_PYTHON=/path/to/python picks another one the stack supports
# (pinned: 3.11-3.12, since TF 2.17 and tensorflow-io 0.37.1 ship no 3.13 wheels; newest: 3.11-3.13). A venv
# made with another Python minor than the one wanted is deleted and made again.
# Usage: source scripts/_venv.sh; tfdist_venv [EXTRAS]   (EXTRAS e.g. "test" or "test,bench"; none by default)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TFDIST_STACK="${TFDIST_STACK:-pinned}"
case "$TFDIST_STACK" in
  pinned) VENV="$ROOT/.venv"; STACK_EXTRAS="tfio,s3"; STACK_PYTHON=3.11; STACK_PYTHONS="3.11 3.12" ;;
  newest) VENV="$ROOT/.venv-newest"; STACK_EXTRAS="s3"; STACK_PYTHON=3.13; STACK_PYTHONS="3.11 3.12 3.13" ;;
  *) echo "TFDIST_STACK must be pinned or newest, not '$TFDIST_STACK'" >&2; exit 2 ;;
esac
STACK_CONSTRAINTS="$ROOT/scripts/stacks/$TFDIST_STACK.txt"

_python_minor() {  # _python_minor PYTHON -> "3.13" (nothing, and status 1, if PYTHON does not run)
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

_find_python() {  # _find_python X.Y -> the path of a working Python X.Y (status 1 if none)
  local minor="$1" candidate
  for candidate in "python$minor" "/usr/bin/python$minor" "/usr/local/bin/python$minor" \
      $(printf '%s\n' "${PYENV_ROOT:-$HOME/.pyenv}/versions/$minor".*/bin/"python$minor" | sort -V -r); do
    # A pyenv shim exists on PATH for every installed version but fails unless that version is selected.
    if [ "$(_python_minor "$candidate")" = "$minor" ]; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

_pick_python() {  # -> the Python for this stack's venv, from TFDIST_PYTHON or found by STACK_PYTHON
  local minor
  if [ -n "${TFDIST_PYTHON:-}" ]; then
    if ! minor="$(_python_minor "$TFDIST_PYTHON")"; then
      echo "TFDIST_PYTHON='$TFDIST_PYTHON' does not run; set it to a Python interpreter's path" >&2
      return 1
    fi
    case " $STACK_PYTHONS " in
      *" $minor "*) command -v "$TFDIST_PYTHON"; return 0 ;;
    esac
    echo "TFDIST_PYTHON='$TFDIST_PYTHON' is Python $minor; the $TFDIST_STACK stack runs on Python" \
      "${STACK_PYTHONS// /, } (BUILD_NOTES.md, 'Python'); point TFDIST_PYTHON at one of those" >&2
    return 1
  fi
  if ! _find_python "$STACK_PYTHON"; then
    echo "the $TFDIST_STACK stack's venv is made with Python $STACK_PYTHON, found neither as python$STACK_PYTHON" \
      "on PATH nor under ${PYENV_ROOT:-$HOME/.pyenv}/versions; install it, or set TFDIST_PYTHON to a" \
      "Python ${STACK_PYTHONS// /, }" >&2
    return 1
  fi
}

tfdist_venv() {
  local extras py="" have want stamp
  extras="$STACK_EXTRAS${1:+,$1}"
  want="$STACK_PYTHON"
  if [ -n "${TFDIST_PYTHON:-}" ]; then
    py="$(_pick_python)"
    want="$(_python_minor "$py")"
  fi
  have="$(_python_minor "$VENV/bin/python" || true)"
  if [ "$have" != "$want" ]; then
    [ -n "$py" ] || py="$(_pick_python)"
    if [ -n "$have" ]; then
      echo "tfdist: $VENV has Python $have, the $TFDIST_STACK stack wants $want here: making it again" >&2
    fi
    echo "tfdist: creating $VENV ($TFDIST_STACK stack) with $("$py" --version) ($py)" >&2
    rm -rf "$VENV"
    "$py" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
  fi
  # Reinstall only when the packaging changed or other extras are asked for (a fresh clone always installs).
  stamp="$VENV/.tfdist-installed"
  want="$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" "$STACK_CONSTRAINTS" | sha1sum | cut -c1-12) [$extras]"
  if [ ! -f "$stamp" ] || ! grep -qxF "$want" "$stamp"; then
    # --no-compile: Python compiles the modules a run imports, when it imports them, instead of pip compiling
    # all ~19,000 files of the stack up front (pinned install: 43 s of CPU instead of 104 s).
    echo "tfdist: installing tfdist[$extras] into $VENV with $STACK_CONSTRAINTS" \
      "(the first run downloads TensorFlow, ~600 MB)" >&2
    "$VENV/bin/python" -m pip install --quiet --no-compile -c "$STACK_CONSTRAINTS" -e "${ROOT}[$extras]"
    echo "$want" >> "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
  export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
  # Imports cache the bytecode of what they import (--no-compile above). Where the environment sets
  # PYTHONDONTWRITEBYTECODE (this machine's shells do), no interpreter would, and every new one compiles
  # TensorFlow again: `import tensorflow, tf_keras` took 10-12 s of CPU instead of 3.8 s (pinned), `import
  # tensorflow` 11-12 s instead of 5.2 s (newest).
  unset PYTHONDONTWRITEBYTECODE
}
