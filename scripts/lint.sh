#!/usr/bin/env bash
# Lint, format check and type check of the whole tree, in a small venv of its own (.venv-lint: ruff and mypy
# from scripts/stacks/lint.txt, no TensorFlow). .ci/run runs it before the test stacks.
#   scripts/lint.sh          # check (exit 1 on any finding)
#   scripts/lint.sh --fix    # apply ruff's safe fixes and format, then check
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-lint"
PINS="$ROOT/scripts/stacks/lint.txt"
cd "$ROOT"
stamp="$VENV/.installed"
want="$(sha1sum "$PINS" | cut -c1-12)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "lint: installing $(grep -v '^#' "$PINS" | tr '\n' ' ')into $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet -r "$PINS"
  echo "$want" > "$stamp"
fi
if [ "${1:-}" = "--fix" ]; then
  "$VENV/bin/ruff" check --fix --quiet . || true
  "$VENV/bin/ruff" format --quiet .
fi
rc=0
"$VENV/bin/ruff" check . || rc=1
"$VENV/bin/ruff" format --check . || rc=1
"$VENV/bin/mypy" || rc=1
[ "$rc" -eq 0 ] && echo "lint: ruff check, ruff format --check and mypy are clean"
exit "$rc"
