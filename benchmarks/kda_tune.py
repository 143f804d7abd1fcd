"""Measure every valid split spec of the KDA scenario's shapes on this GPU; write the fastest per
shape bucket as tuning-table entries (``kreg/dispatch/tuning.json`` format) and the raw timings.

    python benchmarks/kda_tune.py [--out DIR] [--shapes B,T,H ...]

Timings are medians of CUDA-graph replays (kreg.bench.device_ms), inputs as in the KDA
scenario (bf16, K = V = 128, gates bounded at -5). Writes DIR/tuning_sm90.json, DIR/tune.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import attrs
import torch
import triton

from kreg.bench import device_ms
from kreg.dispatch import select
from kreg.families.kda import api
from kreg.registry import get_registry
from kreg.registry.targets import detect

SHAPES = ((1, 2048, 32), (1, 8192, 32), (4, 8192, 32), (16, 8192, 32), (1, 65536, 4),
          (1, 65536, 32), (1, 8192, 4), (1, 8192, 8), (1, 8192, 16), (2, 8192, 32),
          (8, 8192, 32))  # fmt: skip
TUNING_FIELDS = {
    "tile": ("chunk", "solve_block", "num_warps", "fp32_dot"),
    "scan": ("chunk", "block_v", "num_stages", "segment_chunks"),
}


def make_call(B, T, H, K=128):
    gen = torch.Generator(device="cuda").manual_seed(B * 1000 + H)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q = torch.nn.functional.normalize(r(B, T, H, K), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(r(B, T, H, K), dim=-1).bfloat16()
    v = r(B, T, H, K).bfloat16()
    g = (-5.0 * torch.sigmoid(r(B, T, H, K) + 1.0)).bfloat16()
    beta = torch.sigmoid(r(B, T, H)).bfloat16()
    h0 = r(B, H, K, K) * 0.1
    return api._prepare(q, k, v, g, beta, None, h0, True, -5.0, None, None, None, None, "none",
                        False, False, "kv", False)  # fmt: skip


def spec_fields(spec) -> dict:
    return {part: {f: getattr(getattr(spec, part), f) for f in fields}
            for part, fields in TUNING_FIELDS.items()}  # fmt: skip


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "tune_out"))
    ap.add_argument("--shapes", nargs="*")
    ap.add_argument("--budget-s", type=float, default=420.0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes] if args.shapes else SHAPES
    target = detect()
    split = get_registry().candidates["kda.split"]
    rows, entries, t_start = [], [], time.time()
    for B, T, H in shapes:
        problem, call = make_call(B, T, H)
        base = select(problem, target=target)
        ref, _ = api.run_selection(base, call, problem)
        valid = []
        for s in split.enumerate_specs(target):
            s = split.specialize(s, problem)
            if s is not None and split.is_valid(s, target, problem) and s not in valid:
                valid.append(s)
        timed = []
        for s in valid:
            if time.time() - t_start > args.budget_s:
                break
            sel = attrs.evolve(base, spec=s)
            try:
                o, _ = api.run_selection(sel, call, problem)
                err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                ms = device_ms(lambda s=sel, c=call, p=problem: api.run_selection(s, c, p))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(B=B, T=T, H=H, spec=spec_fields(s), error=repr(e)[:300]))
                continue
            timed.append((ms, s))
            rows.append(dict(B=B, T=T, H=H, spec=spec_fields(s), ms=ms, rel_vs_default=err))
        if not timed:
            continue
        ms, best = min(timed, key=lambda t: t[0])
        entries.append({"candidate": "kda.split", "bucket": problem.bucket(),
                        "spec": spec_fields(best), "measured_ms": round(ms, 4),
                        "shape": f"B={B} T={T} H={H}"})  # fmt: skip
        print(f"B={B} T={T} H={H}: best {ms:.3f} ms {spec_fields(best)} "
              f"(default {base.decided_by})", flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    section = {"header": {"target": target.name, "triton": triton.__version__,
                          "abi": {"kda": get_registry().families["kda"].abi_version},
                          "device": torch.cuda.get_device_name(),
                          "date": time.strftime("%Y-%m-%d")},
               "entries": entries}  # fmt: skip
    with open(os.path.join(args.out, f"tuning_{target.name}.json"), "w") as f:
        json.dump(section, f, indent=1)
    with open(os.path.join(args.out, "tune.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
