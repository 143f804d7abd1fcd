"""Host time per call of KDA (or, ``--family gdn``, GDN) prefill and decode, kreg against
fla-core, called as engines call them: ``kreg.compat.fla.chunk_kda`` / ``fused_recurrent_kda``
(GDN: ``chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule``, a scalar gate) with
exactly fla's keywords
(softplus gate in the kernel from ``A_log`` / ``dt_bias``, L2 norm in the kernel, varlen with
device ``cu_seqlens`` only, K = V = 128, bf16), fla-core's own functions in the same process
(``FLA_DISABLE_BACKEND_DISPATCH=1``) where importable.

Host time: N calls back to back after warm-up, ``time.perf_counter`` around the Python calls
only (no sync inside), then one sync; the median over repetitions, in microseconds per call.
GPU time: CUDA-graph replays timed with events (median), for kreg with device offsets alone and
with ``cu_seqlens_cpu`` beside them, to show the device-only path launches the same work.
Writes ``host_time.json`` under ``--out``::

    PYTHONPATH=. python3 benchmarks/kda_host_time.py --out OUT [--calls 200] [--reps 7] \
        [--family kda|gdn]

(``host_time.json``; ``host_time_gdn.json`` with ``--family gdn``.)

``--profile CASE...`` instead profiles kreg's planned calls of the cases named (cProfile, the
functions by own time) into ``profile.txt``: where a planned call's host time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # before fla is imported

import torch  # noqa: E402
import triton  # noqa: E402

from kreg.compat import fla as kreg_fla  # noqa: E402

K = 128
BF16 = torch.bfloat16
# (name, kind, H, sequence lengths): prefill fixed length (B sequences of T), varlen mixed,
# decode (N sequences of one token; "decode-pool": on a state pool, as engines call it)
CASES = [
    ("prefill 1x4096 H32", "prefill", 32, [4096]),
    ("prefill 4x2048 H16", "prefill", 16, [2048] * 4),
    ("prefill 1x16384 H32", "prefill", 32, [16384]),
    ("varlen 7 mixed H32", "prefill", 32, [1, 300, 4000, 17, 2000, 64, 1800]),
    ("varlen 64 short H16", "prefill", 16, [37, 90, 5, 260] * 16),
    ("decode N1 H4", "decode", 4, [1]),
    ("decode N16 H16", "decode", 16, [1] * 16),
    ("decode N64 H32", "decode", 32, [1] * 64),
    ("decode N256 H32", "decode", 32, [1] * 256),
    ("decode N512 H64", "decode", 64, [1] * 512),
    # as vLLM's and SGLang's decode steps call it: a state pool read and written in place
    # through int32 slots, int32 offsets
    ("decode pool N64 H32", "decode-pool", 32, [1] * 64),
    ("decode pool N256 H16", "decode-pool", 16, [1] * 256),
]


# family -> (fla's module, its prefill and decode entries: kreg.compat.fla has the same names;
# the gate's channels per value head: K per-channel, 1 scalar)
FAMILIES = {
    "kda": ("fla.ops.kda", "chunk_kda", "fused_recurrent_kda", K),
    "gdn": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule",
            "fused_recurrent_gated_delta_rule", 1),
}  # fmt: skip


def entries(family):
    """kreg's (prefill, decode) shims of ``family``."""
    _, prefill, decode, _ = FAMILIES[family]
    return getattr(kreg_fla, prefill), getattr(kreg_fla, decode)


def load_fla(family="kda"):
    """fla-core 0.6.0's (prefill, decode, version) of ``family``, or (None, None, why)."""
    module, prefill, decode, _ = FAMILIES[family]
    try:
        import importlib

        import fla

        ops = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure means: no fla rows
        return None, None, f"not importable ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    return getattr(ops, prefill), getattr(ops, decode), getattr(fla, "__version__", "?")


def load_fla_pooled(family):
    """(fla-core's decode step on a pool, its name), or (None, why): its public steps take no
    slots (they would ignore ``ssm_state_indices`` and refuse the pool's size). KDA's is the
    decode scenario's peer (``kda.bench.decode.load_fla_pooled``)."""
    if family != "kda":
        return None, "fla-core 0.6.0 has no GDN step on a pool (vLLM carries its own)"
    from kreg.families.kda.bench.decode import load_fla_pooled as load_kda_pooled

    fn, why = load_kda_pooled()
    return (fn, "fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd") if fn else (None, why)


def make(H, lengths, seed=0, family="kda", pool=False):
    """Inputs as an engine holds them: packed [1, T, H, K], raw gate ([1, T, H] for GDN), beta
    probabilities, the layer's A_log / dt_bias, device offsets, initial states (``pool``: a
    pool of 2N states, N int32 slots into it and int32 offsets, written in place)."""
    T, N = sum(lengths), len(lengths)
    G = FAMILIES[family][3]
    gate = (1, T, H, G) if G > 1 else (1, T, H)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device="cuda")  # noqa: E731
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    x = dict(q=rnd(1, T, H, K).to(BF16), k=rnd(1, T, H, K).to(BF16), v=rnd(1, T, H, K).to(BF16),
             g=rnd(*gate).to(BF16),
             beta=torch.rand(1, T, H, generator=gen, device="cuda").to(BF16))  # fmt: skip
    kw = dict(use_gate_in_kernel=True, A_log=torch.log(torch.rand(H, device="cuda") * 15 + 1),
              dt_bias=rnd(H * G) * 0.5, use_qk_l2norm_in_kernel=True,
              initial_state=torch.zeros(N, H, K, K, device="cuda"), output_final_state=True)  # fmt: skip
    if N > 1 or T > 1:
        kw["cu_seqlens"] = cu
    if pool:
        del kw["output_final_state"]
        kw["initial_state"] = torch.zeros(2 * N, H, K, K, device="cuda")
        kw["ssm_state_indices"] = torch.randperm(2 * N, generator=gen, device="cuda")[:N].int()
        kw["inplace_final_state"] = True
        kw["cu_seqlens"] = cu.int()
    return x, kw


def host_us(fn, calls, reps, warmup=3):
    """Median over ``reps`` of the host microseconds per call of ``calls`` back-to-back calls
    (the GPU synchronised between loops where there is one)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        sync()
    return statistics.median(times)


def gpu_us(fn, reps=20):
    """Median GPU microseconds of one call, replayed from a CUDA graph and timed with events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def run_case(name, kind, H, lengths, fla_fns, calls, reps, family="kda"):
    x, kw = make(H, lengths, family=family, pool=kind == "decode-pool")
    kreg_prefill, kreg_decode = entries(family)
    kreg_fn = kreg_prefill if kind == "prefill" else kreg_decode
    row = {"case": name, "kind": kind, "H": H, "N": len(lengths), "T": sum(lengths)}
    # prefill: fewer calls, so the GPU's launch queue never fills (it would time the GPU)
    calls = calls if kind != "prefill" else max(1, calls // 4)
    row["kreg host us"] = host_us(lambda: kreg_fn(**x, **kw), calls, reps)
    fla_fn = fla_fns[0 if kind == "prefill" else 1]
    if kind == "decode-pool":
        fla_fn, row["fla"] = load_fla_pooled(family) if fla_fn is not None else (None, None)
    if fla_fn is not None:
        row["fla host us"] = host_us(lambda: fla_fn(**x, **kw), calls, reps)
    if "cu_seqlens" in kw and kind == "prefill":
        # the device-only path against the host-offsets one: the same kernels, the same time
        cpu = kw["cu_seqlens"].cpu()
        row["kreg gpu us (device offsets)"] = gpu_us(lambda: kreg_fn(**x, **kw))
        row["kreg gpu us (cu_seqlens_cpu)"] = gpu_us(lambda: kreg_fn(**x, **kw, cu_seqlens_cpu=cpu))
        hint = max(lengths)
        row["kreg gpu us (device offsets + max_seqlen)"] = gpu_us(
            lambda: kreg_prefill(**x, **kw, max_seqlen=hint)
        )
    return row


def profile(names, out: Path, calls: int, family="kda") -> None:
    import cProfile
    import io
    import pstats

    text = io.StringIO()
    for name, kind, H, lengths in CASES:
        if name not in names:
            continue
        x, kw = make(H, lengths, family=family, pool=kind == "decode-pool")
        fn = entries(family)[0 if kind == "prefill" else 1]
        for _ in range(3):
            fn(**x, **kw)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn(**x, **kw)
        prof.disable()
        torch.cuda.synchronize()
        text.write(f"== {name}: {calls} planned calls ==\n")
        try:  # a breakdown that fails must not cost the profile (one device call)
            text.write(stages(lambda fn=fn, x=x, kw=kw: fn(**x, **kw), calls) + "\n")
        except Exception as e:  # noqa: BLE001
            text.write(f"stages: failed ({type(e).__name__}: {e})\n")
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    (out / "profile.txt").write_text(text.getvalue())


def stages(call, calls: int, reps: int = 7) -> str:
    """A planned call's host time in stages (medians, microseconds per call, no profiler): the
    whole call; the plan's replay (``Plan.run``: allocations and launches); its launches alone
    on buffers allocated once; the rest (the entry's checks, the key) is the difference."""
    from kreg.families.kda import plans

    seen = []
    real = plans.Plan.run

    def spy(self, inputs):
        seen.append((self, inputs))
        return real(self, inputs)

    plans.Plan.run = spy
    try:
        call()
    finally:
        plans.Plan.run = real
    if not seen:
        return "stages: the call took the normal path (no plan)"
    plan, inputs = seen[-1]
    whole = host_us(call, calls, reps)
    replay = host_us(lambda: plan.run(inputs), calls, reps)
    if not plan.compiled:
        return f"stages: whole {whole:.1f} us, replay {replay:.1f} (interpreted)"
    held = [
        torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device, _ in plan.buffers
    ]
    buffers = [b.data_ptr() for b in held]
    addresses = {r: None if t is None else t.data_ptr() for r, t in inputs.items()}
    launches = host_us(lambda: plans._launch_compiled(plan.launches, addresses, buffers,
                                                      plan.device), calls, reps)  # fmt: skip
    direct = sum(L.direct is not None for L in plan.launches)
    return (
        f"stages: whole {whole:.1f} us = entry and key {whole - replay:.1f} + replay "
        f"{replay:.1f} (allocations {replay - launches:.1f} + {len(plan.launches)} launches "
        f"{launches:.1f}, {direct} direct)"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "host_time_out"))
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--cases", nargs="+", metavar="CASE", help="only these cases (default: all)")
    ap.add_argument("--profile", nargs="+", metavar="CASE", help="profile these cases instead")
    ap.add_argument("--family", choices=sorted(FAMILIES), default="kda")
    ap.add_argument("--no-fla", action="store_true", help="kreg's rows only (an A/B of kreg)")
    args = ap.parse_args()
    if args.profile:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with torch.no_grad():
            profile(set(args.profile), out, args.calls, args.family)
        return
    chunk, recurrent, version = (
        (None, None, "not run (--no-fla)") if args.no_fla else load_fla(args.family)
    )
    if chunk is None:
        print(f"fla-core {version}: kreg rows only", file=sys.stderr)
    result = {"family": args.family, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__,
              "triton": triton.__version__, "fla": version, "calls": args.calls,
              "reps": args.reps, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "rows": []}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with torch.no_grad():
        for case in CASES:
            if args.cases and case[0] not in args.cases:
                continue
            row = run_case(*case, (chunk, recurrent), args.calls, args.reps, args.family)
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            result["wall_s"] = time.time() - t0
            name = "host_time.json" if args.family == "kda" else f"host_time_{args.family}.json"
            (out / name).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
