# Sourced by the scripts run on a lent GPU machine (gpu_lane.sh, device_grid.sh): the repository
# root, $OUT, kreg on PYTHONPATH, fla-core from its wheel in .whl/ when present (the machine has
# no network; its image already has torch, triton, pluggy, attrs and pytest), and fla's own
# kernels rather than its backend dispatch.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
export FLA_DISABLE_BACKEND_DISPATCH=1 PYTHONUNBUFFERED=1
