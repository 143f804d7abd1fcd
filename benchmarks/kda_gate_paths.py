"""KDA gate paths per gate regime, like with like, on one GPU; then extreme and non-finite gates
against the float64 loop. Writes ``results.json`` and ``RESULTS.md`` (``kreg bench --render``
reads it) and ``gate_paths.json`` (the extremes) under ``--out``.

    PYTHONPATH=. python3 benchmarks/kda_gate_paths.py --out OUT [--shapes B,T,H[,D] ...]
        [--regimes NAME ...] [--full]  # --full: the full repetition budget (default: quick)

The speed part is the ``kda`` scenario's harness (kreg/families/kda/bench/scenario.py) on these shapes in
each regime of kreg/families/kda/bench/gate_regimes.py: kreg through ``kreg.compat.fla.chunk_kda`` with
the keywords fla receives, the pairs each regime admits, CUDA-graph medians. (``kreg bench kda
--cases quick`` covers every regime on the scenario's shapes.) The extremes call both sides the
same way, with ``logsigmoid`` gates and one extreme value.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

DEFAULT_SHAPES = ("1,8192,32", "16,8192,32", "1,65536,4", "1,2048,32", "4,8192,32,64")


def speed(shapes, regimes, quick: bool) -> dict:
    from kreg.bench import require_gpu
    from kreg.families.kda.bench import scenario as kda

    cases = []
    for text in shapes:
        B, T, H, *rest = (int(p) for p in text.split(","))
        cases += [kda.make_case(B, T, H, K=rest[0] if rest else kda.HEAD_DIM, regime=r,
                                tags=("gate_paths",), extras=False) for r in regimes]  # fmt: skip
    return kda.run(cases, scenario="kda-gate-paths", target=require_gpu(), quick=quick,
                   progress=False)  # fmt: skip


def extremes(fla) -> dict:
    """One huge or -inf gate at t = 20, a NaN at t = 50: against the float64 loop."""
    import torch

    from kreg.compat.fla import chunk_kda
    from kreg.families.kda.bench import scenario as kda
    from kreg.families.kda.oracles import relative_rms, token_serial_oracle

    case = kda.make_case(1, 256, 2, regime="logsigmoid")
    x = kda.make_inputs(case.params, torch.device("cuda"), kda.seed_of(case))
    kw = kda.fla_kwargs(case.params, x)
    q, k, v, beta = (kw[n] for n in ("q", "k", "v", "beta"))
    cases = {}
    for label, val in (("g=-1e8 at t=20", -1e8), ("g=-1e5 at t=20", -1e5),
                       ("g=-inf at t=20", float("-inf"))):  # fmt: skip
        g = kw["g"].clone()
        g[:, 20] = val
        ref_o, ref_s = token_serial_oracle(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(),
                                           scale=kw["scale"])  # fmt: skip
        row = {}
        for name, fn in (("kreg", chunk_kda), ("fla", fla)):
            if fn is not None:
                o, s = fn(**dict(kw, g=g))
                row[name] = (relative_rms(o.float().cpu(), ref_o), relative_rms(s.cpu(), ref_s))
        cases[label] = row
    base = chunk_kda(**kw)[0]
    for name in ("k", "v", "g", "beta"):
        bad = kw[name].clone()
        bad[:, 50] = float("nan")
        o = chunk_kda(**dict(kw, **{name: bad}))[0]
        cases[f"nan {name} at t=50"] = {
            "rows < 50 bitwise": bool(torch.equal(o[:, :50], base[:, :50])),
            "rows >= 50 all nan": bool(o[:, 50:].isnan().all()),
        }
    for label, row in cases.items():
        print(label, row, flush=True)
    return cases


def main():
    import torch
    import triton

    from kreg import bench
    from kreg.families.kda.bench import scenario as kda
    from kreg.families.kda.bench.gate_regimes import BY_NAME

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "gate_paths_out"))
    ap.add_argument("--shapes", nargs="*", default=list(DEFAULT_SHAPES), help="B,T,H[,K=V]")
    ap.add_argument("--regimes", nargs="*", default=list(BY_NAME), choices=list(BY_NAME))
    ap.add_argument("--full", action="store_true", help="the full repetition budget")
    args = ap.parse_args()
    fla, version = kda.load_fla()
    if fla is None:
        print(f"fla-core not importable: kreg rows only ({version})")
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "fla-core": version,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    result["extremes"] = extremes(fla)
    (out / "gate_paths.json").write_text(json.dumps(result, indent=1))
    written = bench.write_results(speed(args.shapes, args.regimes, not args.full), out)
    result["wall_s"] = time.time() - t0
    (out / "gate_paths.json").write_text(json.dumps(result, indent=1))
    print(", ".join(f"{k}: {p}" for k, p in written.items()))


if __name__ == "__main__":
    main()
