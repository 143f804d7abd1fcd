#!/usr/bin/env bash
# One part of `kreg bench kda-grid` for one call on a lent H200 (the whole grid with the peer
# timed honestly does not fit one 10-minute call: fla autotunes each head configuration in the
# measuring process). Usage on the GPU machine, with fla-core's wheel in .whl/:
#   OUT=... bash scripts/device_grid.sh 1     # then, in the next call: ... 2
# and here:  python benchmarks/kda_grid.py merge P1/results.json P2/results.json --out docs/kda/grid
set -uo pipefail
part="${1:?usage: device_grid.sh PART [PARTS]}"
parts="${2:-2}"
source "$(dirname "$0")/gpu_env.sh"
# shellcheck disable=SC2046  # one case pattern per word
timeout "${GRID_TIMEOUT:-570}" python3 -m kreg bench kda-grid --quick --no-progress --workers 14 \
  --deadline-s "${GRID_DEADLINE:-540}" --out "$OUT/grid-$part" \
  --cases $(python3 benchmarks/kda_grid.py part "$part" "$parts") 2>&1 | tee "$OUT/grid-$part.log"
