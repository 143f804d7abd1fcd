#!/usr/bin/env bash
# The CPU test lane: install into .venv, then run pytest (GPU tests skip themselves).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
set +e
python -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests" >&2
fi
exit "$rc"
