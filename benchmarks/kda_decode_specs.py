"""Every valid ``kda.recurrent`` spec timed on decode shapes, with fla's fused_recurrent_kda (GPU).

    python benchmarks/kda_decode_specs.py --out DIR/decode_specs.json [--quick]

The data behind the decode cost model (``recurrent.recurrent_cost``): per shape (N sequences x
H heads x T tokens each, K = V = 128, bf16, fp32 states in and out) the median CUDA-graph time of
each valid spec, the dispatcher's choice and fla's row, in one process on one GPU. Shapes with
``holdout`` true are never used to set the model's constants; they check it
(``python benchmarks/kda_decode_specs.py --report DIR/decode_specs.json``, CPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

BATCHES = (1, 8, 32, 64, 256, 512)
HEADS = (4, 16, 32, 64)
TOKENS = (1, 4)
HOLDOUT_BATCHES = (32, 256)  # and every H = 32 shape
HOLDOUT_HEADS = (32,)


def shapes():
    for T in TOKENS:
        for N in BATCHES:
            for H in HEADS:
                if T > 1 and N * H > 64 * 64:
                    continue
                yield {"N": N, "H": H, "T": T,
                       "holdout": N in HOLDOUT_BATCHES or H in HOLDOUT_HEADS}  # fmt: skip


def run(out: str, quick: bool) -> int:
    import attrs
    import torch

    from kreg.bench import Impl, Timer, environment
    from kreg.dispatch import select
    from kreg.families.kda.api import _prepare, run_selection
    from kreg.families.kda.bench import decode as bench_decode
    from kreg.families.kda.recurrent import (
        enumerate_recurrent_specs,
        is_valid_recurrent_spec,
        specialize_recurrent,
    )
    from kreg.registry import get_registry

    target = get_registry().targets["sm90"]
    timer = Timer(torch, "cuda")
    fla_rec, fla_version = bench_decode.load_fla_recurrent()
    reps = dict(min_reps=10, min_ms=20.0, max_reps=200) if quick else dict(
        min_reps=30, min_ms=100.0, max_reps=1000)  # fmt: skip
    results = {"env": environment(target), "fla": fla_version, "shapes": []}
    started = time.perf_counter()
    for sh in shapes():
        case = bench_decode.make_case(sh["N"], sh["H"], sh["T"])
        p = case.params
        x = bench_decode.prefill_bench.make_inputs(p, "cuda", 1234)
        h0 = 0.1 * torch.randn((p["B"], p["HV"], p["K"], p["V"]), device="cuda")
        kw = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=p["K"] ** -0.5,
                  initial_state=h0, output_final_state=True)  # fmt: skip
        args = {**bench_decode._defaults(), **kw}
        problem, call = _prepare(**{n: args[n] for n in bench_decode._prepare_args()})
        sel = select(problem, target)
        pinned = select(problem, target, algorithm="kda.recurrent")
        row = dict(sh, selected=repr(sel.spec), candidate=sel.candidate.name, specs=[])
        for spec in enumerate_recurrent_specs(target):
            spec = specialize_recurrent(spec, problem)
            if spec is None or not is_valid_recurrent_spec(spec, target, problem).ok:
                continue
            s = attrs.evolve(pinned, spec=spec)
            impl = Impl("spec", run=lambda s=s, c=call, p=problem: run_selection(s, c, p))
            t = timer.time(impl, **reps)
            row["specs"].append({"block_v": spec.block_v, "num_warps": spec.num_warps,
                                 "num_stages": spec.num_stages, "ms": t["ms"]})  # fmt: skip
        if fla_rec is not None:

            def run_fla(kw=kw):
                with torch.inference_mode():
                    return fla_rec(**kw)

            row["fla_ms"] = timer.time(Impl("fla", run=run_fla), **reps)["ms"]
        best = min(r["ms"] for r in row["specs"])
        print(f"N{sh['N']:4d} H{sh['H']:3d} T{sh['T']} best {best:.4f} ms fla "
              f"{row.get('fla_ms', float('nan')):.4f} ({time.perf_counter() - started:.0f} s)",
              flush=True)  # fmt: skip
        results["shapes"].append(row)
        with open(out, "w") as f:
            json.dump(results, f, indent=1, default=str)
        del x, h0, kw, call, problem
        torch.cuda.empty_cache()
    return 0


KEYS = ("block_v", "num_warps", "num_stages")


def _spec_key(r: dict) -> tuple:
    return tuple(r[k] for k in KEYS)


def _spec(r: dict):
    from kreg.families.kda.recurrent import KdaRecurrentSpec

    return KdaRecurrentSpec(**{k: r[k] for k in KEYS}, initial_state=True, output_final_state=True)


def report(path: str) -> int:
    """Per shape: best spec, the model's pick, fla; the holdout's regrets (CPU)."""
    from kreg.families.kda.recurrent import is_valid_recurrent_spec, recurrent_cost
    from kreg.problems import LinearAttentionProblem
    from kreg.registry import get_registry

    target = get_registry().targets["sm90"]
    data = json.load(open(path))
    regrets = {True: [], False: []}
    for row in data["shapes"]:
        problem = LinearAttentionProblem(
            batch=row["N"], seq_len=row["T"], heads_qk=row["H"], heads_v=row["H"], head_dim_k=128,
            head_dim_v=128,
            initial_state=True, output_final_state=True,
        )  # fmt: skip
        times = {_spec_key(r): r["ms"] for r in row["specs"]
                 if is_valid_recurrent_spec(_spec(r), target, problem).ok}  # fmt: skip
        pick = min(
            times,
            key=lambda k: recurrent_cost(_spec(dict(zip(KEYS, k, strict=True))), problem, target),
        )
        best = min(times, key=times.get)
        regret = times[pick] / times[best]
        regrets[row["holdout"]].append(regret)
        fla = row.get("fla_ms")
        print(f"{'hold' if row['holdout'] else 'fit '} N{row['N']:4d} H{row['H']:3d} "
              f"T{row['T']} best {best} {times[best]:.4f} pick {pick} x{regret:.2f} "
              f"fla/pick {fla / times[pick] if fla else float('nan'):.2f}")  # fmt: skip
    for k, v in regrets.items():
        if v:
            print(f"{'holdout' if k else 'fit'}: median {statistics.median(v):.2f} worst "
                  f"{max(v):.2f} over {len(v)}")  # fmt: skip
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--report")
    a = ap.parse_args(argv)
    return report(a.report) if a.report else run(a.out, a.quick)


if __name__ == "__main__":
    sys.exit(main())
