"""The Python share of a planned call's host time, measured on a CPU without a GPU: the inner
loop of host-path work while no GPU is at hand (``kda_host_time.py`` measures the whole on one).

Each case records its plan under the Triton interpreter (tiny shapes: Python's work does not
depend on them), then replays it as a GPU replay runs, with the two CUDA calls stubbed: the
launcher's C entry (``_Launch.direct``) does nothing and the stream is 0. What remains is
everything Python does per call: the shim's checks, the plan key, the allocations (on the CPU:
cheaper than CUDA's caching allocator) and the launch arguments. Device offsets and pool slots
are CPU tensors here, read as device ones (as ``tests/interpreter/test_kda_plans.py`` does)::

    python3 benchmarks/kda_host_python.py [--calls 2000] [--reps 7] [--profile CASE]

Prints one line per case: microseconds per call, the median of ``reps`` loops of ``calls``.
"""

from __future__ import annotations

import argparse
import os
import types

os.environ["TRITON_INTERPRET"] = "1"  # before kreg's kernels are imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from kda_host_time import host_us  # noqa: E402  (benchmarks/, the script's folder)

from kreg.compat import fla  # noqa: E402
from kreg.families.kda import api, plans  # noqa: E402

H, K = 2, 32


def make(lengths, pool=False, seed=0):
    """Engine-shaped arguments of fla's entries (as ``kda_host_time.make``), tiny."""
    gen = torch.Generator().manual_seed(seed)
    T, N = sum(lengths), len(lengths)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    x = dict(q=rnd(1, T, H, K), k=F.normalize(rnd(1, T, H, K), dim=-1), v=rnd(1, T, H, K),
             g=rnd(1, T, H, K), beta=torch.rand(1, T, H, generator=gen))  # fmt: skip
    kw = dict(use_gate_in_kernel=True, A_log=rnd(H), dt_bias=rnd(H * K),
              use_qk_l2norm_in_kernel=True, initial_state=torch.zeros(N, H, K, K),
              output_final_state=True)  # fmt: skip
    if N > 1:
        kw["cu_seqlens"] = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    if pool:
        del kw["output_final_state"]
        kw["initial_state"] = torch.zeros(2 * N, H, K, K)
        kw["ssm_state_indices"] = torch.arange(N, dtype=torch.int32)
        kw["inplace_final_state"] = True
        kw["cu_seqlens"] = kw["cu_seqlens"].int()
    return x, kw


# (name, entry, sequence lengths, pool)
CASES = [
    ("prefill 1x96", fla.chunk_kda, [96], False),
    ("prefill varlen 3", fla.chunk_kda, [40, 1, 55], False),
    ("decode N4", fla.fused_recurrent_kda, [1] * 4, False),
    ("decode pool N4", fla.fused_recurrent_kda, [1] * 4, True),
]


def as_gpu_replay(plan) -> None:
    """Make an interpreted plan replay as a compiled one does, its CUDA calls stubbed."""
    for L in plan.launches:
        L.run, L.function, L.packed = (lambda *args: None), 0, (4, 1, 0)
        if hasattr(type(L), "direct"):  # kreg since fc9ef15 (a baseline before it: L.run)
            L.pointers = [x.data_ptr() if isinstance(x, torch.Tensor) else x for x in L.template]
            L.direct = lambda stream, packed, *args: None
    device = plan.device
    returned = {src[1] for src in plan.returns if src is not None and src[0] == "buf"}
    plans.Plan.__init__(plan, plan.buffers, plan.launches, plan.returns, returned,
                        types.SimpleNamespace(type="cuda", index=0))  # fmt: skip
    plan.device = device


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--profile", metavar="CASE", help="cProfile this case instead")
    args = ap.parse_args()
    api._readable_offsets = lambda cu, cu_cpu: cu_cpu  # CPU offsets stand for device ones
    api._readable_slots = lambda indices, indices_cpu: indices_cpu
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    with torch.no_grad():
        for name, entry, lengths, pool in CASES:
            if args.profile and name != args.profile:
                continue
            x, kw = make(lengths, pool)
            call = lambda entry=entry, x=x, kw=kw: entry(**x, **kw)  # noqa: E731
            api.clear_plans()
            call(), call()  # the second call records
            recorded = [p for p in api._plans.values() if p]
            if not recorded:
                print(f"{name}: no plan (the normal path)")
                continue
            as_gpu_replay(recorded[0])
            if args.profile:
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.runcall(lambda call=call: [call() for _ in range(args.calls)])
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
                continue
            us = host_us(call, args.calls, args.reps, warmup=50)
            print(f"{name:<20} {us:6.1f} us per call ({len(recorded[0].launches)} launches)")


if __name__ == "__main__":
    main()
