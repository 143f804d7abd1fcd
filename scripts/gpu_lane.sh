#!/usr/bin/env bash
# The GPU lane, for one call on a lent GPU machine (its image already has torch, triton, pluggy,
# attrs and pytest; fla-core travels as a wheel in .whl/ when present): the gpu-marked tests, then
# the case-study probes. Logs and JSON under ${OUT:-gpu_out}.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
# tests in parallel processes where pytest-xdist is there: the lane is compile-bound (whole, on
# the lent 16-core H100 with 14 workers: 124 passed, 3 skipped in 258 s on 2026-12-07)
par=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${GPU_LANE_WORKERS:-14}")
timeout "${GPU_LANE_TIMEOUT:-540}" python3 -m pytest -m gpu -q -rP $par -p no:cacheprovider \
  --junitxml="$OUT/gpu_lane.xml" 2>&1 | tee "$OUT/gpu_lane.log"
rc=${PIPESTATUS[0]}
# the gate paths like with like against fla (default/default, bounded/safe_gate), extremes
[ "${SKIP_GATE_PATHS:-0}" = 1 ] ||
  timeout "${GATE_PATHS_TIMEOUT:-400}" python3 benchmarks/kda_gate_paths.py --out "$OUT" 2>&1 | tee "$OUT/gate_paths.log"
[ "${SKIP_CASE_STUDY:-0}" = 1 ] ||
  timeout "${CASE_STUDY_TIMEOUT:-190}" python3 benchmarks/kda_case_study.py --out "$OUT" 2>&1 | tee "$OUT/case_study.log"
exit "$rc"
