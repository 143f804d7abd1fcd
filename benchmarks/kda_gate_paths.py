"""KDA gate paths like with like on one GPU: kreg's default (any gate) against fla's default, and
kreg's bounded path against fla's ``safe_gate`` at the same bound; then extreme and non-finite
gates against the float64 loop. Prints a table and writes ``gate_paths.json`` under ``--out``.

    PYTHONPATH=. python3 benchmarks/kda_gate_paths.py --out OUT [--shapes B,T,H[,D] ...]

Timings are CUDA-graph medians (``triton.testing.do_bench_cudagraph``) on the same inputs, gates
g in [-5, 0) so that both paths of both implementations serve them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import triton

from kreg.dispatch import select
from kreg.families.kda import api, kda_prefill
from kreg.families.kda.oracles import relative_rms, token_serial_oracle

DEFAULT_SHAPES = (
    "1,8192,32",
    "16,8192,32",
    "1,65536,4",
    "1,2048,32",
    "4,8192,32,64",
    "2,4096,8",
    "1,8192,32,128,1",
)  # the last: gates 10x wider (B,T,H,D,wide)
BOUND = -5.0


def inputs(B, T, H, D, seed=0, bound=BOUND):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q = r(B, T, H, D).bfloat16()
    k = torch.nn.functional.normalize(r(B, T, H, D), dim=-1).bfloat16()
    v = r(B, T, H, D).bfloat16()
    g = (bound * torch.rand(B, T, H, D, device="cuda", generator=gen)).clamp(max=-1e-4)
    beta = torch.rand(B, T, H, device="cuda", generator=gen).bfloat16()
    return q, k, v, g.float(), beta


def runners(x, fla):
    q, k, v, g, beta = x
    out = {
        "kreg default": lambda: kda_prefill(q, k, v, g, beta, output_final_state=True),
        "kreg bounded": lambda: kda_prefill(q, k, v, g, beta, output_final_state=True,
                                            gate_lower_bound=BOUND),
    }  # fmt: skip
    if fla is not None:
        out["fla default"] = lambda: fla(q, k, v, g, beta, output_final_state=True)
        out["fla safe_gate"] = lambda: fla(q, k, v, g, beta, output_final_state=True,
                                           safe_gate=True, lower_bound=BOUND)  # fmt: skip
    return out


def selected(x, bound):
    q, k, v, g, beta = x
    problem, _ = api._prepare(q, k, v, g, beta, None, None, True, bound, None, None, None, None,
                              "none", False, False, "kv", False)  # fmt: skip
    sel = select(problem, "sm90", family="kda")
    t, s = sel.spec.tile, sel.spec.scan
    return (f"c{t.chunk} bs{t.solve_block} {t.anchor} w{t.num_warps} | bv{s.block_v} "
            f"w{s.num_warps} st{s.num_stages} seg{s.segment_chunks}")  # fmt: skip


def speed(shapes, fla, save):
    rows = []
    for text in shapes:
        B, T, H, *rest = (int(p) for p in text.split(","))
        D = rest[0] if rest else 128
        wide = len(rest) > 1  # gates 10x wider than the bound: the safe path's tree rows
        x = inputs(B, T, H, D, bound=10 * BOUND if wide else BOUND)
        res = {"shape": f"B{B} T{T} H{H} D{D}" + (" g in [-50, 0)" if wide else ""),
               "default_spec": selected(x, None), "bounded_spec": selected(x, BOUND)}  # fmt: skip
        outs = {}
        for name, fn in runners(x, fla).items():
            if wide and name.endswith(("bounded", "safe_gate")):
                continue
            outs[name] = fn()
            torch.cuda.synchronize()
            res[name] = triton.testing.do_bench_cudagraph(fn, rep=200)
        ref = outs.get("fla default", outs["kreg default"])
        for name, o in outs.items():
            res[f"err {name}"] = relative_rms(o[0].float().cpu(), ref[0].float().cpu())
        if fla is not None:
            res["x default"] = res["fla default"] / res["kreg default"]
            if not wide:
                res["x bounded"] = res["fla safe_gate"] / res["kreg bounded"]
        rows.append(res)
        save(rows)
        print(json.dumps(res), flush=True)
    return rows


def extremes(fla):
    """One huge or -inf gate at t = 20, a NaN at t = 50: against the float64 loop."""
    B, T, H, D = 1, 256, 2, 128
    q, k, v, g, beta = inputs(B, T, H, D, seed=3)
    cases = {}
    for label, val in (("g=-1e8 at t=20", -1e8), ("g=-1e5 at t=20", -1e5),
                       ("g=-inf at t=20", float("-inf"))):  # fmt: skip
        g2 = g.clone()
        g2[:, 20] = val
        ref_o, ref_s = token_serial_oracle(q.cpu(), k.cpu(), v.cpu(), g2.cpu(), beta.cpu())
        row = {}
        o, s = kda_prefill(q, k, v, g2, beta, output_final_state=True)
        row["kreg"] = (relative_rms(o.float().cpu(), ref_o), relative_rms(s.cpu(), ref_s))
        if fla is not None:
            o, s = fla(q, k, v, g2, beta, output_final_state=True)
            row["fla"] = (relative_rms(o.float().cpu(), ref_o), relative_rms(s.cpu(), ref_s))
        cases[label] = row
    for name in ("k", "v", "g", "beta"):
        x = dict(q=q, k=k, v=v, g=g, beta=beta)
        base = kda_prefill(**x)[0]
        x[name] = x[name].clone()
        x[name][:, 50] = float("nan")
        o = kda_prefill(**x)[0]
        cases[f"nan {name} at t=50"] = {
            "rows < 50 bitwise": bool(torch.equal(o[:, :50], base[:, :50])),
            "rows >= 50 all nan": bool(o[:, 50:].isnan().all()),
        }
    for label, row in cases.items():
        print(label, row, flush=True)
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "gate_paths_out"))
    ap.add_argument("--shapes", nargs="*", default=list(DEFAULT_SHAPES))
    args = ap.parse_args()
    try:
        from fla.ops.kda import chunk_kda as fla
    except ImportError:
        fla = None
        print("fla-core not importable: kreg rows only")
    t0 = time.time()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    Path(args.out).mkdir(parents=True, exist_ok=True)

    def save(rows):
        result["speed"] = rows
        result["wall_s"] = time.time() - t0
        Path(args.out, "gate_paths.json").write_text(json.dumps(result, indent=1))

    result["extremes"] = extremes(fla)
    save(speed(args.shapes, fla, save))


if __name__ == "__main__":
    main()
