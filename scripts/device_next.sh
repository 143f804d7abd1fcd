#!/usr/bin/env bash
# Device calls for the open speed work, each under the 10-minute call limit (carry .whl/ with
# fla-core's wheel); outputs under $OUT (at most 8 files come back).
#
#   OUT=... bash scripts/device_next.sh gates [CASE...]
#     - the KDA GPU tests (split == fused bit for bit, containment, oracles): $OUT/tests.log
#     - `kreg bench kda --quick` on the cases named (default: the B1 T8192 H32 regimes, the B4
#       softplus pair and the varlen batch: three fla shapes, ~100 s of fla autotuning each),
#       fla in the same run: $OUT/gates.md, $OUT/gates.json (-> docs/kda/quick/, GATES.md)
#   OUT=... bash scripts/device_next.sh heads
#     - the KDA GPU tests of masked tiles (hand-padded runs and split == fused, bit for bit)
#     - `kreg bench kda --quick` on the head-dim cases (K = V = 96, 192: masked tiles since
#       939838d, never timed; 256), fla in the same run: $OUT/heads.md, $OUT/heads.json
#       (-> merge into docs/kda/quick with `python benchmarks/kda_grid.py merge
#       docs/kda/quick/results.json OUT/heads.json --supersede --out docs/kda/quick`, GATES.md)
#   OUT=... bash scripts/device_next.sh gdn
#     - the GDN GPU tests, the host-path ones and JIT = AOT: $OUT/tests.log
#     - `kreg bench gdn --quick` (its twelve cases, four held out; fla in the same run): $OUT/gdn.md, $OUT/gdn.json
#       (-> docs/gdn/results.json, then `kreg bench --render docs/gdn/results.json --out docs/gdn`)
#   OUT=... bash scripts/device_next.sh kernels SCENARIO [CASE...]
#     - benchmarks/prefill_kernels.py: each kreg kernel's time beside the call's, fla's total in
#       the same run: $OUT/prefill_kernels.jsonl (a change against its baseline: run it on each
#       tree, or copy the baseline's kernels.py in between, in one call)
#   OUT=... bash scripts/device_next.sh ab SCENARIO BASE [CASE...]
#     - the same on this tree (label tree, fla's rows too) and then on the kreg package of an
#       earlier commit unpacked in BASE (label base; make it here with
#       `mkdir -p scratch/base && git archive REV kreg | tar -x -C scratch/base`, carry scratch):
#       a change against its baseline in one call, on one card: $OUT/prefill_kernels.jsonl
#   OUT=... bash scripts/device_next.sh scans SCENARIO [CASE...]
#     - benchmarks/scan_specs.py: the scan side spec by spec over one prep's tiles (V block,
#       stages, segments), kreg only: $OUT/scan_specs.jsonl (GDN's measured 2026-12-07:
#       docs/gdn/scan_specs.jsonl; KDA's not yet)
#   OUT=... bash scripts/device_next.sh host
#     - benchmarks/kda_host_time.py (issue 23's 30 us goal): $OUT/host_time.json
#   OUT=... bash scripts/device_next.sh check BASE [CASE...]
#     - the masked-tile and host-path GPU tests ($OUT/tests.log, $OUT/hostpath_tests.log),
#       then hostab BASE (below); BASE from `mkdir -p scratch/base && git archive c5c49ae kreg |
#       tar -x -C scratch/base` (the commit before the replay-address change), carry scratch
#   OUT=... bash scripts/device_next.sh hostab BASE [CASE...]
#     - host time of kreg alone on this tree and on BASE's kreg package (as for ab), then
#       the tree's profile with the stages of a planned call: $OUT/{tree,base}/host_time.json,
#       $OUT/profile.txt
#   OUT=... bash scripts/device_next.sh sweep | grid CASE...
#     - the spec sweep over the whole grid, kreg only, and the GPU tests it needs; then the grid
#       cases whose selection the refit changed, fla in the same run. Here (CPU), between the two:
#     cp kreg/families/kda/kda_model.json /tmp/before.json
#     python benchmarks/kda_grid.py fit SWEEP.json                  # the refit, fit shapes only
#     cases=$(python benchmarks/kda_grid.py changed /tmp/before.json)
#     cp SWEEP.json docs/kda/grid_sweep.json; commit; then the grid call, then
#     `python benchmarks/kda_grid.py merge docs/kda/grid/results.json OUT/grid/results.json
#     --supersede --out docs/kda/grid` and `... validate docs/kda/grid_sweep.json --bench
#     docs/kda/grid/results.json`.
set -uo pipefail
step="${1:?usage: device_next.sh gates [CASE...] | heads | gdn | kernels SCENARIO [CASE...] | ab SCENARIO BASE [CASE...] | scans SCENARIO [CASE...] | host | check BASE | hostab BASE [CASE...] | sweep | grid CASE...}"
shift
source "$(dirname "$0")/gpu_env.sh"
case "$step" in
gates)
  [ "$#" -gt 0 ] || set -- b1-t8192-h32 b4-t8192-h32-softplus varlen6-t8192-h32-softplus
  timeout "${TESTS_TIMEOUT:-150}" python3 -m pytest -m gpu -q -n 14 -p no:cacheprovider \
    tests/test_kda_gpu.py >"$OUT/tests.log" 2>&1
  timeout "${GATES_TIMEOUT:-400}" python3 -m kreg bench kda --cases "$@" --quick --no-progress \
    --workers 14 --deadline-s "${GATES_DEADLINE:-370}" --out /tmp/gates >"$OUT/gates.log" 2>&1
  cp /tmp/gates/RESULTS.md "$OUT/gates.md"
  cp /tmp/gates/results.json "$OUT/gates.json"
  ;;
heads)
  timeout "${TESTS_TIMEOUT:-150}" python3 -m pytest -m gpu -q -rf -n 8 -p no:cacheprovider \
    tests/test_kda_gpu.py -k "masked or padded_head_dims" >"$OUT/tests.log" 2>&1
  timeout "${HEADS_TIMEOUT:-400}" python3 -m kreg bench kda --cases head_dims --quick \
    --no-progress --workers 14 --deadline-s "${HEADS_DEADLINE:-370}" --out /tmp/heads \
    >"$OUT/heads.log" 2>&1
  cp /tmp/heads/RESULTS.md "$OUT/heads.md"
  cp /tmp/heads/results.json "$OUT/heads.json"
  ;;
gdn)
  timeout "${TESTS_TIMEOUT:-150}" python3 -m pytest -m gpu -q -rf -n 8 -p no:cacheprovider \
    tests/test_gdn_gpu.py tests/test_kda_hostpath_gpu.py tests/test_jit_equals_aot.py \
    >"$OUT/tests.log" 2>&1
  timeout "${GDN_TIMEOUT:-480}" python3 -m kreg bench gdn --quick --no-progress --workers 14 \
    --deadline-s "${GDN_DEADLINE:-450}" --out /tmp/gdn >"$OUT/gdn.log" 2>&1
  cp /tmp/gdn/RESULTS.md "$OUT/gdn.md"
  cp /tmp/gdn/results.json "$OUT/gdn.json"
  ;;
kernels)
  scenario="${1:?device_next.sh kernels: name the scenario (gdn or kda)}"
  shift
  timeout "${KERNELS_TIMEOUT:-500}" python3 benchmarks/prefill_kernels.py "$scenario" --fla \
    --out "$OUT" ${1:+--cases "$@"} >"$OUT/kernels.log" 2>&1
  ;;
ab)
  scenario="${1:?device_next.sh ab: name the scenario (gdn or kda)}"
  base="${2:?device_next.sh ab: name the folder holding the baseline kreg package}"
  shift 2
  timeout "${TREE_TIMEOUT:-330}" python3 benchmarks/prefill_kernels.py "$scenario" --fla \
    --label tree --out "$OUT" ${1:+--cases "$@"} >"$OUT/tree.log" 2>&1
  PYTHONPATH="$PWD/$base:$PYTHONPATH" timeout "${BASE_TIMEOUT:-150}" \
    python3 benchmarks/prefill_kernels.py "$scenario" --label base --out "$OUT" \
    ${1:+--cases "$@"} >"$OUT/base.log" 2>&1
  ;;
scans)
  scenario="${1:?device_next.sh scans: name the scenario (gdn or kda)}"
  shift
  timeout "${SCANS_TIMEOUT:-300}" python3 benchmarks/scan_specs.py "$scenario" --out "$OUT" \
    ${1:+--cases "$@"} >"$OUT/scans.log" 2>&1
  ;;
host)
  timeout "${HOST_TIMEOUT:-500}" python3 benchmarks/kda_host_time.py --out "$OUT" \
    >"$OUT/host.log" 2>&1
  ;;
check)
  # the first call of a session after kernel or host-path work no GPU has run: the masked-tile
  # and host-path GPU tests, then hostab against BASE
  timeout "${TESTS_TIMEOUT:-170}" python3 -m pytest -m gpu -q -rf -n 8 -p no:cacheprovider \
    tests/test_kda_gpu.py -k "masked or padded_head_dims" >"$OUT/tests.log" 2>&1
  timeout "${HOSTPATH_TIMEOUT:-120}" python3 -m pytest -m gpu -q -rf -p no:cacheprovider \
    tests/test_kda_hostpath_gpu.py >"$OUT/hostpath_tests.log" 2>&1
  bash "$0" hostab "$@"
  ;;
hostab)
  base="${1:?device_next.sh hostab: name the folder holding the baseline kreg package}"
  shift
  [ "$#" -gt 0 ] || set -- "prefill 1x4096 H32" "varlen 7 mixed H32" "decode N64 H32" "decode pool N64 H32"
  for side in tree base; do
    path="$PYTHONPATH"
    [ "$side" = base ] && path="$PWD/$base:$PYTHONPATH"
    PYTHONPATH="$path" timeout "${HOSTAB_TIMEOUT:-150}" python3 benchmarks/kda_host_time.py \
      --no-fla --out "$OUT/$side" --cases "$@" >"$OUT/$side.log" 2>&1
  done
  timeout "${PROFILE_TIMEOUT:-100}" python3 benchmarks/kda_host_time.py --profile "$@" \
    --calls 300 --out "$OUT" >"$OUT/profile.log" 2>&1
  ;;
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
  echo "device_next.sh: unknown step $step (gates | gdn | kernels | ab | scans | host | check | hostab | sweep | grid)" >&2
  exit 2
  ;;
esac
