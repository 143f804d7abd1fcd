"""The split path's scan side spec by spec, on a scenario's own inputs (GDN's or KDA's default
pair: the engines' gates, device offsets): the prep runs once with the dispatcher's tile spec,
then the scan (with its segment map and combine) is timed for each scan spec variant over those
tiles. Says whether the dispatcher's scan spec is the fastest there.

    PYTHONPATH=. python3 benchmarks/scan_specs.py {gdn,kda} [--cases SUBSTR ...] [--out DIR]

Per case and valid variant: the scan side's median device ms (``kreg.bench.device_ms``:
CUDA-graph replays, L2 flushed), whether it is the dispatcher's spec, and its output's relative
RMS distance to the dispatcher's. Appends JSON lines to ``DIR/scan_specs.jsonl``.
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
SCENARIOS = {"gdn": "kreg.families.gdn.bench.scenario", "kda": "kreg.families.kda.bench.scenario"}


def prepared(scenario: str, params, device):
    """(problem, call, selected split spec) of a case's default kreg call, with the engines'
    keywords (device offsets only), selected as that call selects; None for a case without a
    default row (KDA's bounded-only regime)."""
    from kreg.dispatch import select
    from kreg.families.kda import api

    module = _scenario(scenario)
    x = module.make_inputs(params, device, 0)
    if scenario == "gdn":
        kw = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], gate="scalar",
                  scale=params["K"] ** -0.5, initial_state=x["initial_state"],
                  output_final_state=True, use_qk_l2norm=True, cu_seqlens=x["cu_seqlens"])  # fmt: skip
        if module.gate_in_kernel(params):
            kw.update(gate_activation="softplus", A_log=x["A_log"], dt_bias=x["dt_bias"])
    elif module.PAIR_DEFAULT not in module.pair_names(params):
        return None
    else:
        kw = module.kreg_kwargs(params, x, bounded=False) | {"cu_seqlens_cpu": None}
    problem, call = api._prepare(**kw)
    return problem, call, select(problem, "sm90").spec


def _scenario(name: str):
    import importlib

    return importlib.import_module(SCENARIOS[name])


def measure(scenario: str, bench_cases, device="cuda", timer=None):
    """One row per (case, valid scan variant) of ``bench_cases`` (``scenario``'s cases);
    ``timer``: ``kreg.bench.device_ms`` unless given."""
    import torch

    from kreg.bench import device_ms
    from kreg.families.kda import launch, specs
    from kreg.registry import get_registry

    timer = timer or device_ms
    target = get_registry().targets["sm90"]
    torch.set_grad_enabled(False)
    for case in bench_cases:
        found = prepared(scenario, case.params, device)
        if found is None:
            continue
        problem, call, chosen = found
        call, tables = launch.chunk_tables(call, chosen.tile.chunk)
        tiles = launch.run_prep(call, chosen.tile, tables)
        ref = launch.run_scan(call, chosen.tile, chosen.scan, tables, tiles)[0].float()
        # the dispatcher's own values join the variants (KDA's scan runs three stages)
        axes = {f: sorted({*vals, getattr(chosen.scan, f)}) for f, vals in VARIANTS.items()}
        for values in itertools.product(*axes.values()):
            changes = dict(zip(axes, values, strict=True))
            scan = attrs.evolve(chosen.scan, **changes)
            if not specs.is_valid_scan_spec(scan, target, problem).ok:
                continue
            run = functools.partial(launch.run_scan, call, chosen.tile, scan, tables, tiles)
            with torch.inference_mode():
                o = run()[0].float()
                ms = timer(run)
            err = ((o - ref).norm() / ref.norm()).item()
            yield {"scenario": scenario, "case": case.name, **changes,
                   "chosen": scan == chosen.scan, "ms": round(ms, 4), "rel_err": err}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--cases", nargs="+", metavar="SUBSTR", help="cases whose name contains one")
    ap.add_argument("--out", default=os.environ.get("OUT", "scan_specs_out"))
    args = ap.parse_args(argv)
    from kreg.bench import filter_cases

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench_cases = filter_cases(list(_scenario(args.scenario).cases()), args.cases)
    with open(out / "scan_specs.jsonl", "a") as f:
        for row in measure(args.scenario, bench_cases):
            print(json.dumps(row), file=f, flush=True)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
