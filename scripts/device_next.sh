#!/usr/bin/env bash
# The H200 runs issues 14 and 15 wait for, as two device calls (carry .whl/ with fla-core's
# wheel). Each step stays under the 10-minute call limit; outputs under $OUT.
#
#   call 1:  OUT=... bash scripts/device_next.sh sweep
#     - the spec sweep over the whole grid, kreg only (1054 specs of the 15 roles, the K = 256
#       segmented and 8-warp-prep ones never timed yet): $OUT/sweep.json
#     - the GPU tests written but never run (segmented scans at K = 256, kreg's pooled decode
#       step against fla's): $OUT/gpu_tests.log
#     - the decode scenario with the pool pair against fla's own pooled step: $OUT/decode/
#   here (CPU), from the repository root:
#     cp kreg/families/kda/kda_model.json /tmp/before.json
#     python benchmarks/kda_grid.py fit SWEEP.json                  # the refit, fit shapes only
#     cases=$(python benchmarks/kda_grid.py changed /tmp/before.json)
#     cp SWEEP.json docs/kda/grid_sweep.json; commit; then
#   call 2:  OUT=... bash scripts/device_next.sh grid $cases
#     - `kreg bench kda-grid` on the cases whose selection the refit changed, fla in the same
#       run; then `python benchmarks/kda_grid.py merge docs/kda/grid/results.json
#       OUT/grid/results.json --supersede --out docs/kda/grid` and `... validate
#       docs/kda/grid_sweep.json --bench docs/kda/grid/results.json`.
set -uo pipefail
step="${1:?usage: device_next.sh sweep | grid CASE...}"
shift
source "$(dirname "$0")/gpu_env.sh"
case "$step" in
sweep)
  timeout "${SWEEP_TIMEOUT:-400}" python3 benchmarks/kda_grid.py sweep --no-peer --workers 14 \
    --deadline-s "${SWEEP_DEADLINE:-380}" --out "$OUT/sweep.json" 2>&1 | tail -n 60 >"$OUT/sweep.log"
  timeout "${TESTS_TIMEOUT:-100}" python3 -m pytest -m gpu -q -rA -p no:cacheprovider \
    tests/test_kda_gpu.py tests/test_kda_recurrent_gpu.py \
    -k "head_dim_256 or pooled_step_equals_fla" >"$OUT/gpu_tests.log" 2>&1
  timeout "${DECODE_TIMEOUT:-80}" python3 -m kreg bench kda-decode --quick --no-progress \
    --out "$OUT/decode" >"$OUT/decode.log" 2>&1
  ;;
grid)
  [ "$#" -gt 0 ] || { echo "device_next.sh grid: name the cases (kda_grid.py changed)" >&2; exit 2; }
  timeout "${GRID_TIMEOUT:-570}" python3 -m kreg bench kda-grid --quick --no-progress \
    --workers 14 --deadline-s "${GRID_DEADLINE:-540}" --out "$OUT/grid" --cases "$@" \
    >"$OUT/grid.log" 2>&1
  ;;
*)
  echo "device_next.sh: unknown step $step (sweep | grid)" >&2
  exit 2
  ;;
esac
