"""The GDN decode benchmark scenario ``gdn-decode`` (run by ``kreg bench gdn-decode``).

Decode steps at Qwen3-Next's heads (H = 16, HV = 32, K = V = 128, bf16): N sequences x one token,
fp32 states, against fla-core 0.6.0's ``fused_recurrent_gated_delta_rule`` in the same run, on
the keyword dict of the prefill scenario (``scenario.fla_kwargs``: L2 norm of q and k and the
softplus gate in the kernel, beta precomputed). The kreg rows reach the recurrent path as the
prefill scenario's do (``scenario.kreg_entry``: ``kreg.compat.fla.fused_recurrent_gated_delta_rule``
with fla's keywords);
the pooled row adds ``initial_state=pool, initial_state_indices=slots`` (kreg's extension: fla's
GDN step takes no state indices). See :data:`HARNESS_DOC`.
"""

from __future__ import annotations

import functools

from kreg.bench import BenchCase, Impl, Pair, Prepared, Skip, run_cases
from kreg.families.kda.bench import decode as kda_decode
from kreg.families.kda.bench import scenario as kda_bench
from kreg.families.kda.bench.decode import main_row

from . import scenario as prefill

SCENARIO = "gdn-decode"
BATCHES = (1, 16, 64, 256)
REGIME = "softplus"  # the engines' decode step activates the gate in its kernel
SHIM = "fused_recurrent_gated_delta_rule"  # kreg.compat.fla's name for fla's decode entry
PEER = "fla.fused_recurrent"
POOL = ".pool"  # suffix of the kreg row on a state pool, in place
PAIR = "decode"

POOL_NOTE = (
    "fla-core 0.6.0's `fused_recurrent_gated_delta_rule` takes no state indices, so the pooled "
    "kreg row's × peer is against fla's states-in/out step (the same state bytes: N states read "
    "and N written); its outputs are not compared (the pool changes at every call)"
)

HARNESS_DOC = f"""# GDN decode: benchmark results

## The harness

`kreg bench gdn-decode` (scenario `gdn-decode`, `kreg/families/gdn/bench/decode.py`, runner
`kreg/bench/`, the measurement of the `gdn` and `kda` scenarios: CUDA-graph replays with the L2
flushed, medians) times GDN decode steps on one GPU against fla-core in the same run:

```
source scripts/gpu_env.sh          # on the GPU machine: kreg and fla-core's wheel on PYTHONPATH
python3 -m kreg bench gdn-decode --quick --out bench_out/gdn-decode    # 4 cases
python3 -m kreg bench --render bench_out/gdn-decode/results.json --out docs/gdn/decode
```

**Cases.** N = {", ".join(map(str, BATCHES))} sequences, one token each (q `[N, 1, H, K]`),
Qwen3-Next's heads H = {prefill.QWEN_H}, HV = {prefill.QWEN_HV}, K = V = {prefill.HEAD_DIM}, bf16
activations, fp32 states 0.1·N(0, 1); the gate in the `{REGIME}` regime, activated in the kernel
(`use_gate_in_kernel=True, A_log, dt_bias`), `use_qk_l2norm_in_kernel=True`, beta =
sigmoid(N(0, 1)) precomputed, `output_final_state=True`: the prefill scenario's keyword dict.

**Rows.** `kreg.recurrent` (the dispatcher's selection, `gdn.recurrent` for these shapes):
`kreg.compat.fla.{SHIM}(**kw)`; `{PEER}` (its pair): fla-core's `{SHIM}(**kw)` with
`FLA_DISABLE_BACKEND_DISPATCH=1`; `kreg.recurrent{POOL}`: the kreg row's call on a state pool of 2N
slots through `initial_state_indices` (int32 on the device, a permutation, no host copy: the
graph-captured serving step; kreg's extension of the same call, `initial_state=pool,
initial_state_indices=slots` added), final states written in place. {POOL_NOTE}.

**Formulas.** FLOP = 7·K·V per token and value head (decay, Sᵀk, the rank-1 write, Sᵀq), as
`kda-decode`. Compulsory bytes: as the `gdn` scenario (the fp32 state read and written per
sequence and value head, K·V·8 bytes, dominates).
"""


def make_case(N: int, tags=("decode",), target: str = "sm90") -> BenchCase:
    H, HV, K = prefill.QWEN_H, prefill.QWEN_HV, prefill.HEAD_DIM
    shape, params = prefill.case_params(N, 1, H, HV, regime=REGIME, K=K)
    case = BenchCase(
        name=f"n{N}-h{H}x{HV}-t1",
        params=params,
        flops=kda_decode.decode_flops(N, HV, K, K),
        bytes=prefill.gdn_bytes(N, H, HV, K, K, g_bytes=2, num_states=N, gate_params=True),
        tokens=N,
        heads=HV,
        bh=N * HV,
        tags=tags,
        description=f"N={N} sequences, H={H} HV={HV}, one token each",
    )
    return kda_bench.with_planned_impls(case, planned_impls, target)


@functools.cache
def cases() -> tuple[BenchCase, ...]:
    return tuple(make_case(n) for n in BATCHES)


def planned_impls(case: BenchCase, target="sm90") -> tuple[str, ...]:
    main = main_row(prefill.select(case.params, target))
    pool = main_row(prefill.select(case.params, target, pool=True)) + POOL
    return (main, PEER, pool)


def prepare(case: BenchCase, target, device) -> Prepared:
    import torch

    params = case.params
    seed = kda_bench.seed_of(case)
    x = prefill.make_inputs(params, device, seed)
    N, HV, K, V = params["B"], params["HV"], params["K"], params["V"]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)
    pool = 0.1 * torch.randn((2 * N, HV, K, V), generator=gen, device=device)
    slots = torch.randperm(2 * N, generator=gen, device=device)[:N].to(torch.int32)
    kw = prefill.fla_kwargs(params, x)  # one dict: both sides get exactly these keywords
    args = kda_bench._describe_kwargs(kw)
    fn, call = prefill.kreg_entry(SHIM)
    sel = prefill.select(params, target)
    main = main_row(sel)
    run = prefill.in_inference(fn, kw)
    impls: list = [Impl(main, run=run, call=run, peer=PEER,
                        info={**prefill.selection_info(sel), "call": call, "args": args})]  # fmt: skip
    module, version = prefill.load_fla_gdn()
    if module is None:
        impls.append(Skip(PEER, version))
    else:
        run_fla = prefill.in_inference(module.fused_recurrent_gated_delta_rule, kw)
        impls.append(Impl(PEER, run=run_fla, call=run_fla, info={"version": version, "args": args}))
    # kreg's extension (under SGLang's name): the pool read and written in place through slots
    pool_kw = dict(kw, initial_state=pool, initial_state_indices=slots)
    pool_sel = prefill.select(params, target, pool=True)

    def run_pool():  # the pool changes at every call: not compared
        with torch.inference_mode():
            fn(**pool_kw)
        return None, None

    impls.append(Impl(main_row(pool_sel) + POOL, run=run_pool, peer=PEER,
                      info={**prefill.selection_info(pool_sel), "call": call,
                            "args": kda_bench._describe_kwargs(pool_kw)}))  # fmt: skip
    pairs = (Pair(PAIR, main, PEER, f"one decode step, states in and out: kreg "
                  f"(`{call.split(' ')[0]}`) against fla-core's `{SHIM}(**kw)`, kw = "
                  f"{prefill.call_text(params)}"),)  # fmt: skip
    return Prepared(impls=impls, outputs=lambda ret: {"o": ret[0], "state": ret[1]},
                    references=(main, PEER), peer=PEER, notes=(POOL_NOTE,), pairs=pairs)  # fmt: skip


def run(bench_cases, **options) -> dict:
    meta = {"versions": prefill.versions(flashinfer=False), "flop_formula": "tokens*HV*7*K*V",
            "bytes_formula": "as the gdn scenario: fp32 state read and written per sequence"}  # fmt: skip
    options.setdefault("worker_env", {"FLA_CACHE_RESULTS": "0"})
    return run_cases(SCENARIO, bench_cases, prepare, doc=HARNESS_DOC, meta=meta, **options)


def scenario():
    from kreg.registry.model import Scenario

    return Scenario(
        name=SCENARIO,
        family="gdn",
        description="GDN decode steps at Qwen3-Next's heads (H 16, HV 32, K = V = 128, bf16): "
        "N 1-256 x one token, fp32 states; kreg's recurrent path (states in/out, and on a pool "
        "in place) vs fla fused_recurrent_gated_delta_rule",
        cases=cases,
        run=run,
    )
