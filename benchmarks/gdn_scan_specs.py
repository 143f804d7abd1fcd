"""GDN's scan side spec by spec, on the scenario's own inputs: the prep runs once with the
dispatcher's tile spec, then the scan (with its segment map and combine) is timed for each scan
spec variant over those tiles. Says whether the dispatcher's scan spec is the fastest here.

    PYTHONPATH=. python3 benchmarks/gdn_scan_specs.py [--cases SUBSTR ...] [--out DIR]

Per case and variant: the scan side's median device ms (``kreg.bench.device_ms``: CUDA-graph
replays, L2 flushed) and whether its output equals the dispatcher's within 1e-2 relative RMS.
Appends JSON lines to ``DIR/gdn_scan_specs.jsonl``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
from pathlib import Path

import attrs

VARIANTS = {"block_v": (32, 64), "num_stages": (1, 2), "segment_chunks": (0, 16, 64)}


def measure(bench_cases, device="cuda", timer=None):
    """One row per (case, valid scan variant) of ``bench_cases`` (GDN scenario cases);
    ``timer``: ``kreg.bench.device_ms`` unless given."""
    import torch

    from kreg.bench import device_ms
    from kreg.families.gdn.bench import scenario
    from kreg.families.kda import api, launch, specs
    from kreg.registry import get_registry

    timer = timer or device_ms
    target = get_registry().targets["sm90"]
    torch.set_grad_enabled(False)
    for case in bench_cases:
        params = case.params
        x = scenario.make_inputs(params, device, 0)
        kw = dict(scale=params["K"] ** -0.5, initial_state=x["initial_state"],
                  output_final_state=True, use_qk_l2norm=True, cu_seqlens=x["cu_seqlens"])  # fmt: skip
        if scenario.gate_in_kernel(params):
            kw.update(gate_activation="softplus", A_log=x["A_log"], dt_bias=x["dt_bias"])
        problem, call = api._prepare(x["q"], x["k"], x["v"], x["g"], x["beta"], gate="scalar", **kw)
        chosen = scenario.select(params, "sm90").spec
        call, tables = launch.chunk_tables(call, chosen.tile.chunk)
        tiles = launch.run_prep(call, chosen.tile, tables)
        ref = launch.run_scan(call, chosen.tile, chosen.scan, tables, tiles)[0].float()
        for values in itertools.product(*VARIANTS.values()):
            scan = attrs.evolve(chosen.scan, **dict(zip(VARIANTS, values, strict=True)))
            if not specs.is_valid_scan_spec(scan, target, problem).ok:
                continue
            run = functools.partial(launch.run_scan, call, chosen.tile, scan, tables, tiles)
            with torch.inference_mode():
                o = run()[0].float()
                ms = timer(run)
            err = ((o - ref).norm() / ref.norm()).item()
            yield {"case": case.name, **dict(zip(VARIANTS, values, strict=True)),
                   "chosen": scan == chosen.scan, "ms": round(ms, 4), "rel_err": err}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", metavar="SUBSTR", help="cases whose name contains one")
    ap.add_argument("--out", default=os.environ.get("OUT", "gdn_scan_specs_out"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from kreg.bench import filter_cases
    from kreg.families.gdn.bench import scenario

    with open(out / "gdn_scan_specs.jsonl", "a") as f:
        for row in measure(filter_cases(list(scenario.cases()), args.cases)):
            print(json.dumps(row), file=f, flush=True)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
