#!/usr/bin/env bash
# kreg on a CPU-only machine: install, list the registry, explain a KDA selection, compile the
# selected kernels for sm90 and gfx950 and print their resource use.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh

# each command in bold on a terminal; plain where the output is a pipe or a log
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold='' plain=''; fi
step() { printf '\n%s$ %s%s\n' "$bold" "$*" "$plain"; "$@"; }

step kreg list
step kreg explain kda --target sm90 B=2 T=4096 H=16
step kreg explain kda --target gfx950 T=8192
step kreg build kda --target sm90
step kreg build kda --target gfx950

# ---- a small KDA prefill on the CPU (Triton interpreter) checked against both oracles ----
step python -m kreg.families.kda.demo
