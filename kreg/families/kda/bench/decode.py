"""The KDA decode benchmark scenario ``kda-decode`` (run by ``kreg bench kda-decode``).

Decode steps: N sequences x H heads, one token each (and four tokens, a speculative step),
K = V = 128, bf16, fp32 states, against fla-core's ``fused_recurrent_kda`` in the same run.
See :data:`HARNESS_DOC` (rendered at the top of the results page) for the method.
"""

from __future__ import annotations

import functools

from kreg.bench import BenchCase, Impl, Pair, Prepared, Skip, run_cases

from . import scenario as prefill_bench

HEAD_DIM = 128
BATCHES = (1, 8, 64, 512)
HEADS = (4, 16, 64)
MULTI_TOKEN = ((8, 16), (64, 16))  # (N, H) of the four-token cases
MULTI_TOKENS = 4
KREG = "kreg.recurrent"  # kda_prefill with states in and out, as fla's call
KREG_POOL = "kreg.recurrent.pool"  # kda_prefill on a state pool, written in place
KREG_SPLIT = "kreg.split"  # the chunked form pinned: where the dispatcher's crossover lies
PEER = "fla.fused_recurrent"
PEER_POOL = "fla.fused_recurrent.pool"  # fla's own pooled step, in place (as engines call it)
PAIR = "decode"
PAIR_POOL = "pool"

HARNESS_DOC = f"""# KDA decode: benchmark results

## The harness

`kreg bench kda-decode` (scenario `kda-decode`, `kreg/families/kda/bench/decode.py`, runner
`kreg/bench/`, the same measurement as the `kda` scenario: CUDA-graph replays with the L2
flushed, medians; see docs/kda/RESULTS.md) times KDA decode steps on one GPU:

```
kreg bench kda-decode --quick --out bench_out/kda-decode   # well under 5 min on one H200
kreg bench --render bench_out/kda-decode/results.json --out docs/kda/decode
```

**Cases.** N sequences x H heads (HV = H), N = {", ".join(map(str, BATCHES))}, H =
{", ".join(map(str, HEADS))}, one token each (q ``[N, 1, H, K]``); and {MULTI_TOKENS} tokens per
sequence at (N, H) = {", ".join(map(str, MULTI_TOKEN))}. K = V = {HEAD_DIM}, bf16 activations,
gates within [-5, 0), fp32 states of 0.1·N(0, 1), inputs as in the `kda` scenario.

**Implementations.** `{KREG}`: `kda_prefill(..., initial_state=h0, output_final_state=True)`
(the dispatcher's selection: `kda.recurrent` for these shapes); `{PEER}` (its peer, the same
call): fla-core's `fused_recurrent_kda(q, k, v, g, beta, initial_state=h0,
output_final_state=True)` with `FLA_DISABLE_BACKEND_DISPATCH=1`; `{KREG_POOL}`: the same step on
a state pool of 2N slots (`initial_state_indices` int32 on the device, a permutation, no host
copy: the graph-captured serving step), final states written in place (its outputs are not
compared: the pool changes at every call; the GPU tests check it); `{PEER_POOL}` (its peer):
fla-core's pooled step on its own pool of 2N slots through the same slots,
`fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool, ssm_state_indices=slots,
inplace_final_state=True)` (the function engines' decode paths reach; the public
`fused_recurrent_kda` takes no indices); `{KREG_SPLIT}` (four-token cases): the chunked candidate
pinned, to locate the crossover the dispatcher's cost model predicts.

**Formulas.** FLOP = 7·K·V per token and head (decay, Sᵀk, the rank-1 write, Sᵀq). Compulsory
bytes: q, k, v, g, beta read and o written once, and per sequence and head the fp32 state read
and written (K·V·8 bytes: the dominant term).
"""


def decode_flops(tokens: int, heads: int, K: int = HEAD_DIM, V: int = HEAD_DIM) -> float:
    return 7.0 * tokens * heads * K * V


def make_case(N: int, H: int, T: int = 1, tags=(), target: str = "sm90") -> BenchCase:
    params = {"B": N, "T": T, "H": H, "HV": H, "K": HEAD_DIM, "V": HEAD_DIM, "dtype": "bf16",
              "lower_bound": prefill_bench.LOWER_BOUND, "lengths": None, "production": False}  # fmt: skip
    case = BenchCase(
        name=f"n{N}-h{H}-t{T}",
        params=params,
        flops=decode_flops(N * T, H),
        bytes=prefill_bench.kda_bytes(N * T, H, H, num_states=N, initial_state_bytes=4),
        tokens=N * T,
        heads=H,
        bh=N * H,
        tags=tags,
        description=f"N={N} sequences, H={H}, {T} token(s) each",
    )
    return prefill_bench.with_planned_impls(case, planned_impls, target)


@functools.cache
def cases() -> tuple[BenchCase, ...]:
    out = [make_case(n, h, tags=("decode",)) for n in BATCHES for h in HEADS]
    out += [make_case(n, h, MULTI_TOKENS, tags=("tokens4",)) for n, h in MULTI_TOKEN]
    return tuple(out)


def problem_of(params, pool: bool = False):
    from kreg.problems import LinearAttentionProblem

    return LinearAttentionProblem(
        batch=params["B"], seq_len=params["T"], heads_qk=params["H"], heads_v=params["HV"],
        head_dim_k=params["K"], head_dim_v=params["V"], dtype=params["dtype"],
        initial_state=True, output_final_state=True, state_pool=pool,
    )  # fmt: skip


def planned_impls(case: BenchCase, target="sm90") -> tuple[str, ...]:
    from ..selection import select_kda

    target = prefill_bench._target(target)
    names = [main_row(select_kda(problem_of(case.params), target)), PEER, KREG_POOL, PEER_POOL]
    if case.params["T"] > 1:
        names.append(KREG_SPLIT)
    return tuple(names)


def main_row(selection) -> str:
    """The dispatcher's row, named by what it selected (kreg.recurrent for these shapes)."""
    return prefill_bench._kreg_names(selection.candidate.name)[0]


def load_fla_recurrent():
    """``(fused_recurrent_kda, version)`` or ``(None, reason)`` (as ``bench.load_fla``)."""
    chunk_kda, version = prefill_bench.load_fla()
    if chunk_kda is None:
        return None, version
    from fla.ops.kda import fused_recurrent_kda

    return fused_recurrent_kda, version


def load_fla_pooled():
    """``(fused_recurrent_kda_fwd, version)``: fla's step with ``ssm_state_indices`` and
    ``inplace_final_state``, or ``(None, reason)``."""
    fn, version = load_fla_recurrent()
    if fn is None:
        return None, version
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except ImportError as e:
        return None, f"fla-core {version} has no pooled step: {e}"
    return fused_recurrent_kda_fwd, version


def prepare(case: BenchCase, target, device) -> Prepared:
    import torch

    from ..api import _prepare, kda_prefill, run_selection
    from ..selection import select_kda

    params = case.params
    x = prefill_bench.make_inputs(params, device, prefill_bench._seed(case.name))
    N, HV, K, V = params["B"], params["HV"], params["K"], params["V"]
    gen = torch.Generator(device=device).manual_seed(prefill_bench._seed(case.name) + 1)
    h0 = 0.1 * torch.randn((N, HV, K, V), generator=gen, device=device)
    pool = 0.1 * torch.randn((2 * N, HV, K, V), generator=gen, device=device)
    fla_pool = pool.clone()
    slots = torch.randperm(2 * N, generator=gen, device=device)[:N].to(torch.int32)
    base = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=K**-0.5)
    plain = dict(base, initial_state=h0, output_final_state=True)
    pooled = dict(base, initial_state=pool, initial_state_indices=slots)

    def kreg_impl(name, kw, algorithm="auto", compare=True, peer=PEER):
        args = {**_defaults(), **kw}
        problem, call = _prepare(**{n: args[n] for n in _prepare_args()})
        sel = select_kda(problem, target, algorithm=algorithm)
        name = name or main_row(sel)

        def run():
            ret = run_selection(sel, call, problem)
            return ret if compare else (None, None)

        return Impl(name, run=run, call=lambda: kda_prefill(**kw, algorithm=algorithm,
                                                            target=target),
                    info={"candidate": sel.candidate.name, "spec": repr(sel.spec),
                          "decided_by": sel.decided_by}, peer=peer)  # fmt: skip

    impls: list = [kreg_impl(None, plain)]
    main = impls[0].name
    fused_recurrent_kda, version = load_fla_recurrent()
    if fused_recurrent_kda is None:
        impls.append(Skip(PEER, version))
    else:

        def run_fla():
            with torch.inference_mode():
                return fused_recurrent_kda(**plain)

        impls.append(Impl(PEER, run=run_fla, info={"version": version}))
    impls.append(kreg_impl(KREG_POOL, pooled, compare=False, peer=PEER_POOL))
    fla_pooled, pooled_version = load_fla_pooled()
    if fla_pooled is None:
        impls.append(Skip(PEER_POOL, pooled_version))
    else:

        def run_fla_pool():  # the pool changes at every call: not compared
            with torch.inference_mode():
                fla_pooled(**base, initial_state=fla_pool, ssm_state_indices=slots,
                           inplace_final_state=True)  # fmt: skip
            return None, None

        impls.append(Impl(PEER_POOL, run=run_fla_pool, info={"version": pooled_version}))
    if params["T"] > 1:
        impls.append(kreg_impl(KREG_SPLIT, plain, algorithm="kda.split"))
    pairs = (Pair(PAIR, main, PEER, "`kda_prefill(...)` (states in and out) against fla-core's "
                  "`fused_recurrent_kda(...)`, the same call"),
             Pair(PAIR_POOL, KREG_POOL, PEER_POOL, "the pooled step in place, "
                  "`kda_prefill(..., initial_state=pool, initial_state_indices=slots)` against "
                  "fla-core's `fused_recurrent_kda_fwd(..., ssm_state_indices=slots, "
                  "inplace_final_state=True)`"))  # fmt: skip
    return Prepared(impls=impls, outputs=lambda ret: {"o": ret[0], "state": ret[1]},
                    references=(main, PEER), peer=PEER, pairs=pairs)  # fmt: skip


@functools.cache
def _defaults() -> dict:
    import inspect

    from ..api import kda_prefill

    return {n: p.default for n, p in inspect.signature(kda_prefill).parameters.items()
            if p.default is not inspect.Parameter.empty}  # fmt: skip


def _prepare_args() -> tuple[str, ...]:
    import inspect

    from ..api import _prepare

    return tuple(inspect.signature(_prepare).parameters)


def run(bench_cases, **options) -> dict:
    versions = {}
    fn, version = load_fla_recurrent()
    if fn is not None:
        versions["fla-core"] = version
    meta = {"versions": versions, "flop_formula": "tokens*heads*7*K*V",
            "bytes_formula": "as the kda scenario, fp32 state read and written per sequence"}  # fmt: skip
    options.setdefault("worker_env", {"FLA_CACHE_RESULTS": "0"})
    return run_cases("kda-decode", bench_cases, prepare, doc=HARNESS_DOC, meta=meta, **options)


def scenario():
    from kreg.registry.model import Scenario

    return Scenario(
        name="kda-decode",
        family="kda",
        description="KDA decode steps, K=V=128 bf16: N 1-512 x H 4-64, one token (and four); "
        "kreg.recurrent (states in/out, and on a pool in place) vs fla fused_recurrent_kda",
        cases=cases,
        run=run,
    )
