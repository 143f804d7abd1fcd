"""Context parallel KDA prefill benchmark, for one multi-GPU host under ``torchrun``:

    torchrun --standalone --nproc-per-node 8 -m kreg.families.kda.bench.cp --out bench_out/kda_cp_8.json
    python -m kreg.families.kda.bench.cp --dry-run --world 8     # the plan alone, no GPU

Default case: one sequence of 2^20 tokens (B = 1), H = HV = 8, K = V = 128, bf16, the inputs of
``kreg bench kda`` (bench.make_inputs, gates within [-5, 0)). Every rank makes the whole batch
from one seed and keeps its slice, so every row sees the same tensors. Rows, in one run:

- ``kreg.single``: ``kda_prefill`` of the whole batch on one GPU (every rank at once, each on
  its own GPU; the slowest counts);
- ``kreg.cp``: ``kda_prefill_cp`` over all ranks, each with its slice;
- ``fla.single``: fla-core's ``chunk_kda`` of the whole batch;
- ``fla.cp``: ``chunk_kda(..., cp_context=build_cp_context(cu_seqlens, group))`` on equal
  slices (fla's CP needs the tokens divisible by the ranks and takes no initial or final
  state, so every row here runs without them).

``--bounded`` pairs kreg's ``gate_lower_bound=-5`` with fla's ``safe_gate=True,
lower_bound=-5``; the default pairs both defaults. Time: per repetition a barrier, then CUDA
events around one call on every rank; the repetition's time is the slowest rank's; the median
over ``--reps`` after ``--warmup`` calls. Accuracy: relative RMS of each row's outputs against
``kreg.single``'s over the whole batch (norms summed over ranks). Results JSON: rank 0 writes
``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

LOWER_BOUND = -5.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m kreg.families.kda.bench.cp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--tokens", type=int, default=1 << 20, help="tokens of the batch")
    p.add_argument("--heads", type=int, default=8, help="H = HV")
    p.add_argument("--dim", type=int, default=128, help="K = V")
    p.add_argument("--lengths", type=str, default=None,
                   help="comma-separated sequence lengths (varlen, summing to --tokens); "
                        "default one sequence")  # fmt: skip
    p.add_argument("--offsets", type=str, default=None,
                   help="comma-separated slice offsets, world + 1 from 0 to --tokens; default "
                        "equal slices")  # fmt: skip
    p.add_argument("--bounded", action="store_true", help="kreg bounded vs fla safe_gate")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-fla", action="store_true", help="skip the fla rows")
    p.add_argument("--no-single", action="store_true", help="skip the single-GPU rows")
    p.add_argument("--out", type=str, default=None, help="results JSON (rank 0)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, touch no GPU")
    p.add_argument("--world", type=int, default=None, help="ranks to plan for (--dry-run)")
    p.add_argument("--cpu", action="store_true",
                   help="smoke run of this script on CPU: gloo, fp16, the Triton interpreter "
                        "(TRITON_INTERPRET=1), wall-clock times; no fla")  # fmt: skip
    args = p.parse_args(argv)
    for name in ("tokens", "heads", "dim", "reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be positive")
    return args


def _ints(text):
    return None if text is None else [int(x) for x in text.split(",") if x.strip()]


def plan_run(args, world: int) -> dict:
    """The case, every rank's slice and which rows run, from the arguments alone."""
    T = args.tokens
    lengths = _ints(args.lengths) or [T]
    if sum(lengths) != T or min(lengths) < 0:
        raise ValueError(f"--lengths: must be non-negative and sum to --tokens={T}")
    offsets = _ints(args.offsets)
    if offsets is None:
        offsets = [T * r // world for r in range(world + 1)]
    if len(offsets) != world + 1 or offsets[0] != 0 or offsets[-1] != T or any(
        b < a for a, b in zip(offsets, offsets[1:], strict=False)
    ):  # fmt: skip
        raise ValueError(f"--offsets: need {world + 1} non-decreasing ints from 0 to {T}")
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    equal = all(b - a == T // world for a, b in zip(offsets, offsets[1:], strict=False))
    fla_cp = None if (T % world == 0 and equal) else (
        "fla's CP needs equal slices of tokens divisible by the ranks")  # fmt: skip
    from ..context_parallel import plan_cp

    plans = [plan_cp(offsets, r, cu_seqlens=cu) for r in range(world)]
    K = args.dim
    exchange = world * max(p.slots for p in plans) * args.heads * K * (K + K) * 4
    return {
        "world": world, "tokens": T, "heads": args.heads, "dim": K, "lengths": lengths,
        "cu_seqlens": cu, "offsets": offsets, "bounded": args.bounded,
        "rows": [r for r in ("kreg.single", "kreg.cp", "fla.single", "fla.cp")
                 if not (args.no_fla and r.startswith("fla"))
                 and not (args.no_single and r.endswith("single"))],
        "fla_cp_skip": fla_cp,
        "exchange_bytes": exchange,
        "pieces": [list(p.seqs) for p in plans],
        "owned": [list(p.owned_seqs) for p in plans],
    }  # fmt: skip


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        world = args.world or int(os.environ.get("WORLD_SIZE", "1"))
        plan = plan_run(args, world)
        text = json.dumps(plan, indent=1)
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
        return plan
    return _run(args)


def _run(args):
    import torch
    import torch.distributed as dist

    from ..api import kda_prefill
    from ..context_parallel import kda_prefill_cp
    from . import scenario as bench

    if args.cpu:
        dist.init_process_group("gloo")
        dev = torch.device("cpu")
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # before NCCL picks one
        dist.init_process_group("nccl")
        dev = torch.device("cuda", torch.cuda.current_device())
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = plan_run(args, world)
    T, H, K = args.tokens, args.heads, args.dim
    params = {"B": 1, "T": T, "H": H, "HV": H, "K": K, "V": K, "dtype": "fp16" if args.cpu else "bf16",
              "lower_bound": LOWER_BOUND, "production": False,
              "lengths": plan["lengths"] if len(plan["lengths"]) > 1 else None}  # fmt: skip
    x = bench.make_inputs(params, dev, seed=1234)
    cu = torch.tensor(plan["cu_seqlens"], dtype=torch.int64)
    cu_dev = cu.to(dev)
    a, b = plan["offsets"][rank], plan["offsets"][rank + 1]
    mine = {n: x[n][:, a:b].contiguous() for n in ("q", "k", "v", "g", "beta")}
    whole = {n: x[n] for n in ("q", "k", "v", "g", "beta")}
    bound = LOWER_BOUND if args.bounded else None
    kreg_kw = dict(scale=K**-0.5, gate_lower_bound=bound, cu_seqlens=cu_dev, cu_seqlens_cpu=cu)
    rows, notes = {}, []

    def reduce(value, op):
        t = torch.tensor([value], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=op)
        return float(t.item())

    def timed(fn):
        for _ in range(args.warmup):
            fn()
        times = []
        for _ in range(args.reps):
            dist.barrier()
            if args.cpu:
                t0 = time.perf_counter()
                fn()
                times.append(reduce(1e3 * (time.perf_counter() - t0), dist.ReduceOp.MAX))
                continue
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(reduce(start.elapsed_time(end), dist.ReduceOp.MAX))
        return statistics.median(times), times

    def error(o_slice, ref_slice):
        d = (o_slice.double() - ref_slice.double()).norm().item() ** 2
        r = ref_slice.double().norm().item() ** 2
        return math.sqrt(reduce(d, dist.ReduceOp.SUM) / max(reduce(r, dist.ReduceOp.SUM), 1e-300))

    def record(name, fn, out_slice):
        ms, times = timed(fn)
        rows[name] = {"ms": ms, "ms_reps": times}
        if ref is not None and out_slice is not None:
            rows[name]["rel_rms_o_vs_kreg_single"] = error(out_slice(), ref[:, a:b])

    with torch.inference_mode():
        ref = kda_prefill(**whole, **kreg_kw)[0]  # the reference of every row's accuracy
        if "kreg.single" in plan["rows"]:
            record("kreg.single", lambda: kda_prefill(**whole, **kreg_kw), None)
        group = dist.group.WORLD
        cp_call = lambda: kda_prefill_cp(  # noqa: E731
            **mine, **kreg_kw, group=group, cp_offsets=plan["offsets"]
        )
        record("kreg.cp", cp_call, lambda: cp_call()[0])
        if not args.cpu and any(r.startswith("fla") for r in plan["rows"]):
            chunk_kda, version = bench.load_fla()
            if chunk_kda is None:
                notes.append(f"fla rows skipped: {version}")
            else:
                fla_kw = dict(scale=K**-0.5, cu_seqlens=cu_dev, cu_seqlens_cpu=cu)
                if args.bounded:
                    fla_kw.update(safe_gate=True, lower_bound=LOWER_BOUND)
                if "fla.single" in plan["rows"]:
                    one = lambda: chunk_kda(**whole, **fla_kw)  # noqa: E731
                    record("fla.single", one, lambda: one()[0][:, a:b])
                if "fla.cp" in plan["rows"] and plan["fla_cp_skip"] is None:
                    notes.append(_fla_cp(rows, record, chunk_kda, mine, fla_kw, cu_dev, cu, group))
                elif "fla.cp" in plan["rows"]:
                    notes.append(f"fla.cp skipped: {plan['fla_cp_skip']}")
                notes.append(f"fla-core {version}")
    ratios = {}
    for fast, slow in (("kreg.cp", "kreg.single"), ("fla.cp", "fla.single"),
                       ("kreg.cp", "fla.cp"), ("kreg.single", "fla.single")):  # fmt: skip
        if fast in rows and slow in rows:
            ratios[f"{slow} / {fast}"] = rows[slow]["ms"] / rows[fast]["ms"]
    result = {
        "plan": plan, "rows": rows, "speedups": ratios, "notes": [n for n in notes if n],
        "device": "cpu" if args.cpu else torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv,
    }  # fmt: skip
    if rank == 0:
        print(json.dumps({k: result[k] for k in ("speedups", "notes")}, indent=1))
        for name, row in rows.items():
            extra = row.get("rel_rms_o_vs_kreg_single")
            print(f"{name:12s} {row['ms']:9.3f} ms" + (f"  rel RMS {extra:.2e}" if extra else ""))
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    dist.destroy_process_group()
    return result


def _fla_cp(rows, record, chunk_kda, mine, fla_kw, cu_dev, cu, group):
    """fla.cp's row, or the reason it could not run (its CP is fla's to refuse)."""
    try:
        from fla.ops.cp import build_cp_context

        ctx = build_cp_context(cu_dev, group, cu_seqlens_cpu=cu)
        kw = {k: v for k, v in fla_kw.items() if k not in ("cu_seqlens", "cu_seqlens_cpu")}
        call = lambda: chunk_kda(**mine, **kw, cp_context=ctx)  # noqa: E731
        record("fla.cp", call, lambda: call()[0])
    except Exception as e:  # noqa: BLE001 - a peer's failure is a note, not the run's end
        return f"fla.cp failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None


if __name__ == "__main__":
    main()
