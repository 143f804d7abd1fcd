# Sourced by demo.sh and test.sh: make .venv (if missing), install kreg into it, activate it.
# Idempotent: the pip steps are skipped while .venv matches pyproject.toml.
#
# torch is installed first, as $KREG_TORCH says (the line starting "== torch" says what):
#   auto     (default) a torch .venv already imports, as it is; else one in a local wheel folder
#            that pip's configuration names (find-links: no download); else as cpu
#   cpu      the CPU build from PyTorch's index, https://download.pytorch.org/whl/cpu (~190 MB)
#   default  what plain `pip install torch` resolves: on Linux x86_64 from PyPI the CUDA build
#            with its nvidia-* libraries and its own Triton, about 3 GB to download
#   system   the torch of $PYTHON, used as it is: .venv is made with --system-site-packages
# KREG_DRY_RUN=1 prints the pip commands instead of running them (nothing is installed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KREG_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.kreg-installed"
GOLDEN_TRITON=3.6.0
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
KREG_TORCH="${KREG_TORCH:-auto}"

case "$KREG_TORCH" in
auto | cpu | default | system) ;;
*)
  echo "scripts/venv.sh: KREG_TORCH=$KREG_TORCH: expected auto, cpu, default or system" >&2
  exit 2
  ;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' ||
    { echo "scripts/venv.sh: kreg needs Python 3.11 or later (PYTHON=...)" >&2; exit 1; }
  [ "$KREG_TORCH" = system ] && site=--system-site-packages || site=
  # shellcheck disable=SC2086  # no option: no word
  "$PYTHON" -m venv $site "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"

run_pip() {
  echo "== pip install $*" >&2
  [ "${KREG_DRY_RUN:-0}" = 1 ] || python -m pip install -q "$@"
}

torch_version() { python -c "import torch; print(torch.__version__)" 2>/dev/null || true; }

# the version of the torch wheel pip finds without any index (a local wheel folder), or nothing
local_torch() {
  python -m pip install --dry-run --no-index --no-deps --ignore-installed -q --report - torch \
    2>/dev/null | python -c "import json, sys; print(json.load(sys.stdin)['install'][0]['metadata']['version'])" \
    2>/dev/null || true
}

want="$(cat "$ROOT/pyproject.toml" <(echo "$GOLDEN_TRITON") | sha256sum | cut -d' ' -f1)"
if [ "${KREG_DRY_RUN:-0}" = 1 ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ] ||
  ! python -c "import kreg, torch, triton" 2>/dev/null; then
  echo "== installing kreg into $VENV" >&2
  have="$(torch_version)"
  if [ -n "$have" ]; then
    echo "== torch $have, already installed: used as it is" >&2
  elif [ "$KREG_TORCH" = system ]; then
    echo "scripts/venv.sh: KREG_TORCH=system: no torch in $VENV, which sees $PYTHON's packages" \
      "only when made with --system-site-packages (remove an older one first)" >&2
    exit 1
  else
    found=""
    [ "$KREG_TORCH" = auto ] && found="$(local_torch)"
    if [ -n "$found" ]; then
      echo "== torch $found from a local wheel folder pip's configuration names (no download)" >&2
      run_pip "torch==$found"
    elif [ "$KREG_TORCH" = default ]; then
      echo "== torch: pip's default build; from PyPI on Linux x86_64 the CUDA build with its" \
        "nvidia-* libraries and its own Triton, about 3 GB (KREG_TORCH=cpu: ~190 MB)" >&2
      run_pip torch
    else
      echo "== torch: the CPU build from $TORCH_CPU_INDEX, about 190 MB" \
        "(KREG_TORCH=default: the CUDA build)" >&2
      run_pip torch --index-url "$TORCH_CPU_INDEX"
    fi
    have="$(torch_version)"
  fi
  # kreg takes any Triton >= 3.1; the lane installs the one golden/ir_sha256.json pins, so the
  # golden check compares hashes instead of skipping (tests/test_packaging.py keeps them equal),
  # unless the torch brought a Triton of its own (CUDA builds pin theirs): that one stays
  triton="triton==$GOLDEN_TRITON"
  if python -c "import triton" 2>/dev/null; then
    triton="triton"
    echo "== triton $(python -c 'import triton; print(triton.__version__)'), already installed" >&2
  else
    echo "== triton $GOLDEN_TRITON, kreg's other dependencies and the test tools (about 260 MB)" >&2
  fi
  # the torch above stays as it is: pip may not swap it for another
  run_pip -e "$ROOT[test]" "$triton" ${have:+"torch==$have"}
  [ "${KREG_DRY_RUN:-0}" = 1 ] || echo "$want" >"$STAMP"
fi
