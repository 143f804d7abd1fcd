# Sourced by demo.sh and test.sh: make .venv (if missing), install kreg into it, activate it.
# Idempotent: the pip steps are skipped while .venv matches pyproject.toml.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.kreg-installed"
GOLDEN_TRITON=3.6.0

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
source "$VENV/bin/activate"

want="$(cat "$ROOT/pyproject.toml" <(echo "$GOLDEN_TRITON") | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ] || ! python -c "import kreg, torch, triton" 2>/dev/null; then
  echo "== installing kreg into $VENV" >&2
  # torch first and pinned: plain 'torch' would fetch a multi-GB CUDA build; 2.13.0 is the
  # CPU wheel on this machine's disk.
  python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
  # kreg takes any Triton >= 3.1; the lane installs the one golden/ir_sha256.json pins, so the
  # golden check compares hashes instead of skipping (tests/test_packaging.py keeps them equal)
  pip install -q -e "$ROOT[test]" "triton==$GOLDEN_TRITON"
  echo "$want" > "$STAMP"
fi
