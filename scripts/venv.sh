# Sourced by demo.sh and test.sh: make .venv (if missing), install kreg into it, activate it.
# Idempotent: the pip steps are skipped while .venv matches pyproject.toml.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.kreg-installed"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
source "$VENV/bin/activate"

want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ] || ! python -c "import kreg, torch, triton" 2>/dev/null; then
  echo "== installing kreg into $VENV" >&2
  # torch first and pinned: plain 'torch' would fetch a multi-GB CUDA build; 2.13.0 is the
  # CPU wheel on this machine's disk.
  python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
  pip install -q -e "$ROOT[test]"
  echo "$want" > "$STAMP"
fi
