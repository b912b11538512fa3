# Sourced by scripts/app and scripts/test: make .venv with everything installed, idempotently, at the versions
# requirements.lock pins (pip constraints: what CI tested; scripts/lock refreshes it from pyproject.toml).
# llama-cpp-python compiles llama.cpp on first install (minutes); pip caches the wheel after that.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CLOVER_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
EXTRAS="${1:-}"
LOCK="$ROOT/requirements.lock"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "clover-local needs Python 3.11 or newer")'
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
stamp="$VENV/.clover-installed$EXTRAS"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] || [ "$LOCK" -nt "$stamp" ]; then
  echo "Installing clover-local$EXTRAS into $VENV (first time compiles llama.cpp: a few minutes)..." >&2
  "$VENV/bin/python" -m pip install -q -c "$LOCK" -e "$ROOT$EXTRAS"
  touch "$stamp"
fi
