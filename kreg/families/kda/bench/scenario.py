"""The KDA benchmark scenario ``kda`` (run by ``kreg bench kda``).

Cases cross shapes (bf16, HV = H, K = V = 128 and the head dims engines use: 96, 192, 256) with
gate regimes (:mod:`kreg.families.kda.bench.gate_regimes`: how the gate reaches ``chunk_kda`` and
which values it takes). Each case times the like-with-like pairs its regime admits, on the same
inputs and with the same keyword dict: kreg through ``kreg.compat.fla.chunk_kda(**kw)`` against
fla-core's ``chunk_kda(**kw)``; the default pair (no promise about the gates) for unbounded
regimes, the bounded pair (``safe_gate=True, lower_bound=-5``) where every gate is >= -5. Varlen
cases pass device offsets only, as engines do, plus one kreg row with ``cu_seqlens_cpu`` beside
them (kreg's extension). The cases tagged ``quick`` are the affordable device run (``kreg bench
kda --cases quick``). See :data:`HARNESS_DOC` (rendered at the top of docs/kda/RESULTS.md).
"""

from __future__ import annotations

import functools
import os
import zlib

import attrs

from kreg.bench import BenchCase, Impl, Pair, Prepared, Skip, run_cases

from . import gate_regimes
from .gate_regimes import LOWER_BOUND, regime_of

HEAD_DIM = 128
NOMINAL_CHUNK = 64  # the chunk size of the nominal FLOP count (every implementation alike)
MAIN_SHAPES = ((1, 2048, 32), (1, 8192, 32), (4, 8192, 32), (16, 8192, 32), (1, 65536, 4),
               (1, 65536, 32))  # fmt: skip
SWEEP_T = 8192
SWEEP_BH = ((1, 4), (1, 8), (1, 16), (1, 32), (2, 32), (4, 32), (8, 32), (16, 32))
VARLEN_LENGTHS = (1300, 547, 2048, 963, 271, 3063)
VARLEN_H = 32
# (B, T, H, K = V): the head dims engines use besides 128 (96 and 192 run zero-padded today)
HEAD_DIM_SHAPES = ((1, 8192, 16, 256), (1, 8192, 16, 192), (1, 8192, 32, 96))
NEW_REGIMES = ("bounded", "softplus", "softplus_pre", "logsigmoid", "heavy", "resets")
ENGINE_REGIMES = ("softplus", "softplus_pre", "bounded")  # what SGLang and vLLM send
EVERY_REGIME_SHAPES = ((1, 8192, 32), (4, 8192, 32))  # and the varlen batch
SWEEP_REGIME = "softplus"  # the B·H sweep's (one regime: the plot's series are rows)
PRODUCTION_REGIMES = ("bounded", "softplus")
HEAD_DIM_REGIMES = ("softplus", "bounded")
QUICK = "quick"  # the tag of the affordable device run
# shape name -> regimes in the quick run: every regime on few fla autotuning classes (fla tunes
# per (H, K, V, gate path, varlen), not per T): H = 32 fixed, H = 32 varlen, H = 4, K = 256
QUICK_CASES = {
    "b1-t8192-h32": NEW_REGIMES,
    "b4-t8192-h32": ("softplus", "heavy", "bounded"),
    "b1-t2048-h32": ("softplus", "bounded"),  # host-bound: engines' short prefills
    "b1-t65536-h4": ("softplus", "bounded"),
    "varlen6-t8192-h32": ENGINE_REGIMES,
    "b1-t8192-h16-d256": ("softplus", "bounded"),
}
PEER = "fla"  # fla-core's default chunk_kda: the peer of kreg's default
SAFE_PEER = "fla.safe_gate"  # chunk_kda(..., safe_gate=True, lower_bound=-5): of kreg bounded
KREG_DEFAULT = "kreg.split"  # kda_prefill default (gate_lower_bound=None): the safe anchor
KREG_BOUNDED = "kreg.split.bounded"  # kda_prefill(gate_lower_bound=-5.0): the block anchor
CPU_OFFSETS = "+cu_seqlens_cpu"  # suffix of a varlen kreg row given the host offsets too
FUSED = "kreg.fused.bounded"  # the opt-in fused candidate, bounded
VARIANT_PREFIX = "split.bounded"  # other split specs of the bounded problem: split.bounded[...]
PAIR_DEFAULT = "default"
PAIR_BOUNDED = "bounded"
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
MAX_VARIANTS = 3

HARNESS_DOC = f"""# KDA prefill: benchmark results

## The harness

`kreg bench kda` (scenario `kda`, `kreg/families/kda/bench/scenario.py`, runner `kreg/bench/`) times
KDA prefill on one GPU. Rerun it and regenerate this page with

```
kreg bench kda --out bench_out/kda            # the whole scenario: several device calls
kreg bench kda --cases {QUICK} --quick --out bench_out/kda-quick   # every regime, ~5 min
kreg bench --render bench_out/kda/results.json --out docs/kda
kreg bench --list kda                         # the cases and implementations (no GPU needed)
```

(`--cases SUBSTR...` selects cases whose name contains one, or that carry it as a tag;
`--impls NAME...` implementations by substring.) For the peer, install fla-core 0.6.0
(`pip install fla-core==0.6.0`; `scripts/gpu_lane.sh` also installs a wheel from an untracked
`.whl/` folder where one is present); without it the peer rows are skipped with a note.

**Gate regimes.** Every case feeds one regime of `kreg/families/kda/bench/gate_regimes.py` (the
table, with its parameters and sources, is in docs/kda/GATES.md): `bounded` (sigmoid gate with
bound -5, activated in the kernel), `softplus` (`-exp(A_log)·softplus(x + dt_bias)` in the
kernel: SGLang's extend), `softplus_pre` (the same gates precomputed in fp32: vLLM),
`logsigmoid` (fla's test recipe), `heavy` (KDA's initialisation: mean about -7 nats per token,
single gates to -70), `resets` (`logsigmoid` with rows of -inf) and `legacy` (what this page
fed before issue 23: gates within [-5, 0), precomputed in bf16). The case name ends in its
regime; cases of one shape share their seed, so `softplus`, `softplus_pre` and `bounded` see the
same raw inputs.

**Like with like.** A promise about the gates buys speed on both sides, so every kreg row is
measured against the fla-core call that makes the same promise, with the same keyword dict
(one object, passed to both): `kreg.compat.fla.chunk_kda(**kw)` against
`fla.ops.kda.chunk_kda(**kw)`.

| pair | kreg row | peer row | regimes |
|---|---|---|---|
| default | `{KREG_DEFAULT}`: no promise (kreg's default, exact for any g ≤ 0) | `{
    PEER
}`: fla-core's default | every regime but `bounded` |
| bounded | `{KREG_BOUNDED}`: `safe_gate=True, lower_bound=-5.0` (kreg's `gate_lower_bound=-5`) | `{
    SAFE_PEER
}`: the same call | `bounded`, `legacy` |

× peer is always taken within a pair. Varlen cases pass `cu_seqlens` on the device only (no
`cu_seqlens_cpu`), as vLLM and SGLang do; each adds a kreg row `<row>{CPU_OFFSETS}` given
`cu_seqlens_cpu` beside them (kreg's extension: no host synchronisation), against the same peer.

**Cases.** bf16, HV = H, K = V = 128 unless named: B×T×H = 1×2048×32, 1×8192×32, 4×8192×32,
16×8192×32, 1×65536×4, 1×65536×32 in {", ".join(f"`{r}`" for r in ENGINE_REGIMES)} and
`legacy`, and 1×8192×32, 4×8192×32 in every regime; a B·H sweep at T = 8192 over (B, H) =
{", ".join(f"({b},{h})" for b, h in SWEEP_BH)} in `{SWEEP_REGIME}` (the plot); a varlen batch of
lengths {", ".join(map(str, VARLEN_LENGTHS))} packed as B = 1 with H = {VARLEN_H} in every regime;
the production argument set (`use_qk_l2norm_in_kernel`, `use_beta_sigmoid_in_kernel`, fp32
initial state, final state out) at 1×8192×32 and on the varlen batch in
{", ".join(f"`{r}`" for r in PRODUCTION_REGIMES)}; and the head dims engines use,
{", ".join(f"{b}×{t}×{h} at K = V = {d}" for b, t, h, d in HEAD_DIM_SHAPES)}, in
{", ".join(f"`{r}`" for r in HEAD_DIM_REGIMES)}. Plain cases output the final state (no initial
state). The cases tagged `{QUICK}`: {
    "; ".join(f"{s} in {', '.join(r)}" for s, r in QUICK_CASES.items())
}.

**Inputs** (the same tensors for every implementation, seeded per shape): q, k ~ N(0, 1),
L2-normalised per head (raw in the production set, which normalises inside the kernel);
v ~ N(0, 1); the gate as its regime says; beta = sigmoid(N(0, 1)) (the production set passes
the logits); initial state 0.1·N(0, 1) fp32.

**Implementations.** The pairs' rows above; the kreg rows are named after the candidate the
dispatcher selects for the case's problem (`kreg explain`). In `legacy` cases beside them:
`{FUSED}`, the opt-in fused candidate, pinned (`algorithm="kda.fused", allow_opt_in=True`),
bounded; `{VARIANT_PREFIX}[...]`: up to {MAX_VARIANTS} other valid split specs of the bounded
problem, from `enumerate_split_specs(target)` specialised and validated for the problem (filled
up with block_v variants of the selected spec when fewer are enumerated), labelled by the fields
that differ from the bounded selection; these time kreg's launch path alone (`kda_prefill`'s
problem and arguments prepared once, the spec fixed) against `{SAFE_PEER}`. The peer is
`fla.ops.kda.chunk_kda` of fla-core with `FLA_DISABLE_BACKEND_DISPATCH=1`; both sides run under
`torch.inference_mode()`.

**Measurement.** Kernels are compiled first, in parallel: worker processes (`--workers`,
default half the cores, at most 8) call each kreg kernel and each fla autotuning class once, on
the smallest case that needs it (`bench_warm_jobs`), filling Triton's on-disk cache (the
workers run with `FLA_CACHE_RESULTS=0`, so fla's autotuning choice is not made on a shared GPU). Then, case by case in one process, every implementation is called
twice (loading kernels, fla's autotuning on the idle GPU and allocator warm-up are excluded from
every figure). Its outputs are then checked against the case's references, the first pair's
kreg and fla rows: relative RMS error ‖a − b‖/‖b‖ over all elements of o and of the final
state, flagged ⚠ above 1e-2; a reference whose own output is not finite (fla's default under
`resets`) judges nothing. Device time: one call captured in a CUDA graph and replayed, the L2
cache flushed (256 MiB zeroed) before every replay, median of at least 50 replays and 200 ms
(`--quick`: 10 replays, 40 ms); a call that cannot be captured (one that synchronises with the
host, e.g. to read device offsets) is timed with `triton.testing.do_bench(return_mode="median")`
instead, events around eager calls, host work included (column "timing", and a note naming the
capture error). Host µs: wall clock of one whole public call (the kreg and fla rows' calls
above; argument checks + launch for the split variants) without a synchronisation inside the
timed region, median of up to 100 calls. Extra MiB: peak device memory of one call beyond its
inputs and outputs (`max_memory_allocated` after `reset_peak_memory_stats`, minus the memory
allocated before the call, minus the outputs). × peer: the ms of the row's peer (its pair's fla
row) / the row's ms (above 1: faster than that fla call); the fla rows have none.

**Formulas.** Per token and head, with chunk C = {NOMINAL_CHUNK} for every implementation
(a nominal dense count of the chunkwise algorithm, so TFLOP/s compares like with like):

    FLOP = 6·K·V                 state products W·S, (Q⊙Γ)·S, (K⊙Γ')ᵀ·Vnew (2·K·V each)
         + 2·C·(3K + 2V)         A, Aqk, W (C×C×K each) and U, Aqk·Vnew (C×C×V each), dense
         + C²/3                  the triangular solve (I + A)⁻¹, C³/3 per chunk

= 6d² + 10Cd + C²/3 at K = V = d: 181,589 FLOP at d = 128, C = 64.
Compulsory bytes: q, k, v, g (or the raw gate), beta read and o written once at their element
sizes (all bf16: (10d + 2) bytes per token·head = 1282 at d = 128; a precomputed fp32 g adds 2d),
plus per sequence and head the initial state read (fp32, K·V·4) and the final state written
(K·V·4), plus A_log and dt_bias where the gate is activated in the kernel. GB/s = compulsory
bytes / time; % copy BW = that over a 1 GiB device-to-device `copy_` measured in the same run
(read + write counted).
"""


# --- cases ------------------------------------------------------------------------------------


def kda_flops(tokens: int, heads: int, K: int = HEAD_DIM, V: int = HEAD_DIM,
              chunk: int = NOMINAL_CHUNK) -> float:  # fmt: skip
    """Nominal FLOPs (see HARNESS_DOC): tokens · heads · (6KV + 2C(3K + 2V) + C²/3)."""
    return tokens * heads * (6 * K * V + 2 * chunk * (3 * K + 2 * V) + chunk * chunk / 3)


def kda_bytes(tokens: int, heads_qk: int, heads_v: int, K: int = HEAD_DIM, V: int = HEAD_DIM, *,
              act_bytes: int = 2, g_bytes: int = 2, beta_bytes: int = 2, num_states: int = 1,
              initial_state_bytes: int = 0, final_state: bool = True,
              gate_params: bool = False, gate_channels: int | None = None) -> int:  # fmt: skip
    """Compulsory device-memory bytes of one prefill call (see HARNESS_DOC); ``gate_channels``:
    the gate's values per token and value head (K per-channel, the default; 1 scalar: GDN)."""
    G = K if gate_channels is None else gate_channels
    per_token = (2 * heads_qk * K * act_bytes + heads_v * V * act_bytes  # q, k, v
                 + heads_v * G * g_bytes + heads_v * beta_bytes  # g, beta
                 + heads_v * V * act_bytes)  # o  # fmt: skip
    state = num_states * heads_v * K * V * (initial_state_bytes + (4 if final_state else 0))
    params = heads_v * 4 + heads_v * G * 4 if gate_params else 0
    return tokens * per_token + state + params


def shape_name(B: int, T: int, H: int, *, lengths=None, production: bool = False,
               K: int = HEAD_DIM, V: int | None = None, HV: int | None = None) -> str:  # fmt: skip
    """The shape part of a case name (the seed of its inputs: every regime of a shape alike)."""
    V = K if V is None else V
    shape = f"varlen{len(lengths)}-t{T}-h{H}" if lengths else f"b{B}-t{T}-h{H}"
    if HV not in (None, H):
        shape += f"x{HV}"
    if (K, V) != (HEAD_DIM, HEAD_DIM):
        shape += f"-d{K}" if K == V else f"-d{K}x{V}"
    return ("prod-" if production else "") + shape


def make_case(B: int, T: int, H: int, *, lengths: tuple[int, ...] | None = None,
              production: bool = False, tags=(), name: str | None = None,
              head_dim: int = HEAD_DIM, dtype: str = "bf16", target: str = "sm90",
              HV: int | None = None, K: int | None = None, V: int | None = None,
              extras: bool | None = None, extra_params: dict | None = None,
              regime: str = gate_regimes.DEFAULT) -> BenchCase:  # fmt: skip
    """One KDA case (by default K = V = 128, bf16, HV = H, the ``legacy`` gates); ``lengths``
    makes it varlen. ``regime`` (gate_regimes.REGIMES) sets the gates and the pairs timed;
    the name is the shape's and the regime's, the inputs' seed the shape's. ``extras``: the
    fused row and spec variants beside the pairs (default: in ``legacy`` cases only);
    ``extra_params`` are stored in the params (JSON-able, e.g. a grid's split label)."""
    if lengths is not None:
        if B != 1 or sum(lengths) != T:
            raise ValueError("varlen: B must be 1 and T the sum of the lengths")
    r = gate_regimes.BY_NAME[regime]
    HV = H if HV is None else HV
    K = head_dim if K is None else K
    V = K if V is None else V
    n = len(lengths) if lengths else B
    shape = shape_name(B, T, H, lengths=lengths, production=production, K=K, V=V, HV=HV)
    extras = regime == "legacy" if extras is None else extras
    params = {
        "B": B, "T": T, "H": H, "HV": HV, "K": K, "V": V, "dtype": dtype,
        "lower_bound": LOWER_BOUND, "lengths": list(lengths) if lengths else None,
        "production": production, "regime": regime, "seed": _seed(name or shape),
        **({} if extras else {"extras": False}), **(extra_params or {}),
    }  # fmt: skip
    in_kernel = r.gate_in_kernel(production)
    act = DTYPE_BYTES[dtype]
    tokens = B * T
    case = BenchCase(
        name=name or f"{shape}-{regime}",
        params=params,
        flops=kda_flops(tokens, HV, K, V),
        bytes=kda_bytes(
            tokens,
            H,
            HV,
            K,
            V,
            act_bytes=act,
            g_bytes=4 if r.g_fp32 and not in_kernel else act,
            beta_bytes=act,
            num_states=n,
            initial_state_bytes=4 if production else 0,
            final_state=True,
            gate_params=in_kernel,
        ),  # fmt: skip
        tokens=tokens,
        heads=HV,
        bh=n * HV,
        tags=tags,
        description=("production argument set, " if production else "")
        + (f"varlen lengths {', '.join(map(str, lengths))}" if lengths else f"B={B} T={T} H={H}")
        + ("" if (HV, K, V) == (H, HEAD_DIM, HEAD_DIM) else f" HV={HV} K={K} V={V}")
        + f", {regime} gates",
    )
    return with_planned_impls(case, planned_impls, target)


@functools.cache
def cases() -> tuple[BenchCase, ...]:
    """Every case of the scenario (see HARNESS_DOC), each (shape, regime) once, tagged."""
    plan: dict[tuple, set[str]] = {}  # (B, T, H, K, lengths, production, regime) -> tags

    def add(B, T, H, regimes, tag, K=HEAD_DIM, lengths=None, production=False):
        for r in regimes:
            plan.setdefault((B, T, H, K, lengths, production, r), set()).add(tag)

    for B, T, H in MAIN_SHAPES:
        add(B, T, H, (*ENGINE_REGIMES, "legacy"), "main")
    for B, T, H in EVERY_REGIME_SHAPES:
        add(B, T, H, gate_regimes.BY_NAME, "main")
    for b, h in SWEEP_BH:
        add(b, SWEEP_T, h, (SWEEP_REGIME,), "sweep")
    T = sum(VARLEN_LENGTHS)
    add(1, T, VARLEN_H, gate_regimes.BY_NAME, "varlen", lengths=VARLEN_LENGTHS)
    for lengths in (None, VARLEN_LENGTHS):
        add(1, T, 32, PRODUCTION_REGIMES, "production", lengths=lengths, production=True)
    for B, T, H, K in HEAD_DIM_SHAPES:
        add(B, T, H, HEAD_DIM_REGIMES, "head_dims", K=K)
    out = []
    for (B, T, H, K, lengths, production, regime), tags in plan.items():
        shape = shape_name(B, T, H, lengths=lengths, production=production, K=K)
        if regime in QUICK_CASES.get(shape, ()):
            tags = tags | {QUICK}
        out.append(make_case(B, T, H, K=K, lengths=lengths, production=production,
                             regime=regime, tags=sorted(tags)))  # fmt: skip
    return tuple(out)


# --- problems, selections and spec variants (CPU-safe) ------------------------------------------


def has_extras(params) -> bool:
    """Whether a case times the fused row and spec variants beside its pairs."""
    return params.get("extras", True)


def pair_names(params) -> tuple[str, ...]:
    """The like-with-like pairs a case's regime admits ("default", "bounded")."""
    return regime_of(params).pairs_for(params["production"])


def _pair_check(params, pair: str) -> None:
    if pair not in pair_names(params):
        prod = " (production set)" if params["production"] else ""
        raise ValueError(f"gate regime {regime_of(params).name!r}{prod} has no {pair} pair "
                         f"(its pairs: {', '.join(pair_names(params))})")  # fmt: skip


def problem_of(params, bounded: bool | None = None) -> object:
    """The problem of a case's bounded rows (``bounded=False``: of its default rows; None: the
    bounded one where the regime admits it)."""
    from kreg.problems import LinearAttentionProblem

    if bounded is None:
        bounded = PAIR_BOUNDED in pair_names(params)
    _pair_check(params, PAIR_BOUNDED if bounded else PAIR_DEFAULT)
    lengths = params.get("lengths")
    prod = params["production"]
    r = regime_of(params)
    return LinearAttentionProblem(
        batch=params["B"], seq_len=params["T"], heads_qk=params["H"], heads_v=params["HV"],
        head_dim_k=params["K"], head_dim_v=params["V"], dtype=params["dtype"],
        gate_lower_bound=params["lower_bound"] if bounded else None,
        gate_activation=r.activation if r.gate_in_kernel(prod) else "none", qk_l2norm=prod,
        beta_sigmoid=prod, initial_state=prod, state_dtype="fp32", output_final_state=True,
        varlen=bool(lengths), num_seqs=len(lengths) if lengths else params["B"],
        max_seqlen=max(lengths) if lengths else None,  # as kda_prefill reads it from cu_seqlens
    )  # fmt: skip


def _target(target):
    from kreg.registry import get_registry
    from kreg.registry.targets import resolve

    return resolve(get_registry().targets, target)


_SHORT = {"tile.chunk": "chunk", "scan.block_v": "bv", "tile.solve_block": "sb",
          "tile.num_warps": "tw", "scan.num_warps": "sw", "scan.num_stages": "stages",
          "tile.fp32_dot": "dot", "scan.min_occupancy": "occ", "scan.segment_chunks": "seg"}  # fmt: skip


def _fields(spec, prefix="") -> dict:
    out = {}
    for f in attrs.fields(type(spec)):
        value = getattr(spec, f.name)
        if attrs.has(type(value)):
            out.update(_fields(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def spec_diff(spec, base) -> dict[str, object]:
    """The fields of ``spec`` that differ from ``base`` (chunk once, not per kernel)."""
    a, b = _fields(spec), _fields(base)
    diff = {k: a[k] for k in a if a[k] != b.get(k)}
    if "tile.chunk" in diff:
        diff.pop("scan.chunk", None)
    return diff


def spec_label(spec, base) -> str:
    diff = spec_diff(spec, base)
    parts = [f"{_SHORT.get(k, k)}={v}" for k, v in diff.items()]
    return VARIANT_PREFIX + "[" + ",".join(parts) + "]"


def spec_text(spec) -> str:
    t, s = getattr(spec, "tile", None), getattr(spec, "scan", None)
    if t is None or s is None:
        return repr(spec)
    return (f"chunk {t.chunk}, solve_block {t.solve_block}, tile warps {t.num_warps}, "
            f"{t.fp32_dot}; scan block_v {s.block_v}, warps {s.num_warps}, "
            f"stages {s.num_stages}, segment_chunks {getattr(s, 'segment_chunks', 0)}")  # fmt: skip


def split_variants(problem, target, selected, limit: int = MAX_VARIANTS) -> list:
    """Up to ``limit`` valid split specs other than ``selected``, for contrast, one per rule in
    turn: a different chunk; the same chunk with another scan block_v (a block_v variant of the
    selection when the enumeration has none); another segment length of the scan; another tile
    shape. Within a rule the spec differing in the fewest fields wins."""
    from .. import specs

    target = _target(target)
    valid = [s for s in specs.valid_split_specs(target, problem) if s != selected]
    evolved = []
    for bv in (32, 64, 128, 16):
        s = attrs.evolve(selected, scan=attrs.evolve(selected.scan, block_v=bv))
        if s != selected and s not in valid and specs.is_valid_split_spec(s, target, problem).ok:
            evolved.append(s)

    def n_diff(s):
        return (len(spec_diff(s, selected)), spec_label(s, selected))

    chunk, bv = selected.tile.chunk, selected.scan.block_v
    seg = getattr(selected.scan, "segment_chunks", None)
    rules = (
        (valid, lambda s: s.tile.chunk != chunk),
        (valid, lambda s: s.tile.chunk == chunk and s.scan.block_v != bv),
        (evolved, lambda s: True),  # only when the enumeration had no block_v variant
        (valid, lambda s: s.tile.chunk == chunk and s.scan.block_v == bv
         and getattr(s.scan, "segment_chunks", None) != seg),
        (valid, lambda s: s.tile.chunk == chunk and s.tile != selected.tile),
    )  # fmt: skip
    chosen: list = []
    for i, (pool, rule) in enumerate(rules):
        if len(chosen) >= limit:
            break
        if i == 2 and any(s.scan.block_v != bv for s in chosen):
            continue
        found = sorted((s for s in pool if rule(s) and s not in chosen), key=n_diff)
        if found:
            chosen.append(found[0])
    for s in sorted(valid, key=n_diff) + evolved:  # fill up from the rest
        if len(chosen) >= limit:
            break
        if s not in chosen:
            chosen.append(s)
    return chosen[:limit]


def _kreg_names(candidate: str) -> tuple[str, str]:
    """(default row, bounded row) names of the dispatcher's selection of ``candidate``."""
    main = "kreg." + candidate.partition(".")[2]
    return main, main + ".bounded"


def _call_text(params, pair: str) -> str:
    """The keywords of a pair's call (both sides), tensors by name: from fla_kwargs itself."""
    names = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "A_log", "dt_bias")
    x = {n: n for n in names}
    x["initial_state"] = "initial_state" if params["production"] else None
    x["cu_seqlens"] = "cu_seqlens (device only)" if params.get("lengths") else None
    kw = fla_kwargs(params, x, pair)
    return ", ".join(v if k == v or str(v).startswith(k + " ") else f"{k}={v}"
                     for k, v in kw.items() if k != "scale")  # fmt: skip


def pairs_of(params, default_name: str = KREG_DEFAULT,
             bounded_name: str = KREG_BOUNDED) -> tuple[Pair, ...]:  # fmt: skip
    """The like-with-like pairs of a case (see HARNESS_DOC)."""
    regime = regime_of(params).name
    rows = {PAIR_DEFAULT: (default_name, PEER, "no promise about the gates"),
            PAIR_BOUNDED: (bounded_name, SAFE_PEER, "the promise g >= -5")}  # fmt: skip
    out = []
    for pair in pair_names(params):
        kreg, peer, promise = rows[pair]
        out.append(Pair(pair, kreg, peer,
                        f"`{regime}` gates, {promise}: `kreg.compat.fla.chunk_kda(**kw)` against "
                        f"fla-core's `chunk_kda(**kw)`, kw = {_call_text(params, pair)}"))  # fmt: skip
    return tuple(out)


def fla_class(params, pair: str) -> tuple:
    """What fla-core autotunes and compiles once for (its autotuning keys hold H, HV, K, V and
    the dtypes of the tensor arguments, not T or B): the head configuration, varlen, the
    production options, how the gate arrives (in the kernel, or g's dtype) and the pair's
    promise (``safe_gate``, last)."""
    r = regime_of(params)
    prod = params["production"]
    gate = "kernel" if r.gate_in_kernel(prod) else ("fp32" if r.g_fp32 else params["dtype"])
    return (params["H"], params["HV"], params["K"], params["V"], bool(params.get("lengths")),
            prod, gate, pair == PAIR_BOUNDED)  # fmt: skip


def with_planned_impls(case: BenchCase, plan, target) -> BenchCase:
    """``case`` naming the rows ``plan(case, target)`` says a run would time (a scenario's
    ``planned_impls``); a failure to plan is shown in their place, as planning is informative
    only (``--list``)."""
    try:
        impls = plan(case, target)
    except Exception as e:  # noqa: BLE001 - shown, not raised
        impls = (f"? ({type(e).__name__}: {e})",)
    return attrs.evolve(case, impls=impls)


def planned_impls(case: BenchCase, target="sm90") -> tuple[str, ...]:
    """The implementations a run would time on ``target`` (the peers whenever importable), in
    the order :func:`prepare` makes them: each pair (and a varlen case's host-offsets kreg
    row), then the extra bounded rows."""
    from kreg.dispatch import NoCandidateError

    from ..selection import select_kda

    target = _target(target)
    params = case.params
    names = []
    for pair in pair_names(params):
        bounded = pair == PAIR_BOUNDED
        kreg = _kreg_names(select_kda(problem_of(params, bounded), target).candidate.name)[bounded]
        names += [kreg, SAFE_PEER if bounded else PEER]
        if params.get("lengths"):
            names.append(kreg + CPU_OFFSETS)
    if not has_extras(params):
        return tuple(names)
    problem = problem_of(params)
    sel = select_kda(problem, target)
    try:
        select_kda(problem, target, algorithm="kda.fused", allow_opt_in=True)
        names.append(FUSED)
    except NoCandidateError:
        pass
    if sel.candidate.name == "kda.split":
        names += [spec_label(s, sel.spec) for s in split_variants(problem, target, sel.spec)]
    return tuple(names)


# --- inputs and implementations (GPU) -----------------------------------------------------------


def make_inputs(params, device, seed: int) -> dict:
    """The case's tensors (the same for every implementation); see HARNESS_DOC. The gate is its
    regime's (gate_regimes.draw); ``cu_seqlens`` on the device, ``cu_seqlens_cpu`` beside it
    for the rows that pass it."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    B, T, H, HV, K, V = (params[x] for x in ("B", "T", "H", "HV", "K", "V"))
    prod, lengths = params["production"], params.get("lengths")
    act = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[params["dtype"]]

    def randn(*shape, dtype=torch.float32):
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)

    q, k = randn(B, T, H, K), randn(B, T, H, K)
    if not prod:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    q, k = q.to(act), k.to(act)
    v = randn(B, T, HV, V, dtype=act)
    gate = gate_regimes.draw(regime_of(params), B, T, HV, K, gen=gen, device=device, act=act,
                             production=prod)  # fmt: skip
    beta_logits = randn(B, T, HV, dtype=act)
    beta = beta_logits if prod else torch.sigmoid(beta_logits.float()).to(act)
    n = len(lengths) if lengths else B
    h0 = 0.1 * randn(n, HV, K, V) if prod else None
    cu = cu_cpu = None
    if lengths:
        cu_cpu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
        cu = cu_cpu.to(device)
    return {
        "q": q, "k": k, "v": v, "g": gate["g"], "beta": beta, "A_log": gate["A_log"],
        "dt_bias": gate["dt_bias"], "initial_state": h0, "cu_seqlens": cu,
        "cu_seqlens_cpu": cu_cpu,
    }  # fmt: skip


def fla_kwargs(params, x, pair: str = PAIR_DEFAULT) -> dict:
    """The keywords of a pair's call, the same for fla-core's ``chunk_kda`` and
    ``kreg.compat.fla.chunk_kda`` (see HARNESS_DOC): varlen offsets on the device only, the
    gate as the regime passes it, ``safe_gate=True, lower_bound=-5`` for the bounded pair."""
    _pair_check(params, pair)
    prod = params["production"]
    kw = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"],
              scale=params["K"] ** -0.5, output_final_state=True)  # fmt: skip
    if x["initial_state"] is not None:
        kw["initial_state"] = x["initial_state"]
    if x["cu_seqlens"] is not None:
        kw["cu_seqlens"] = x["cu_seqlens"]  # no cu_seqlens_cpu: engines pass none
    if prod:
        kw.update(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    if regime_of(params).gate_in_kernel(prod):
        kw.update(use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"])
    if pair == PAIR_BOUNDED:
        kw.update(safe_gate=True, lower_bound=params["lower_bound"])
    return kw


def kreg_kwargs(params, x, bounded: bool = True) -> dict:
    """Keyword arguments of ``kda_prefill`` for a case's tensors (the spec variants, fused row
    and grid sweep, which time kreg's launch path): the bounded rows' call, or with
    ``bounded=False`` the default rows' (``gate_lower_bound=None``)."""
    _pair_check(params, PAIR_BOUNDED if bounded else PAIR_DEFAULT)
    prod = params["production"]
    r = regime_of(params)
    in_kernel = r.gate_in_kernel(prod)
    return dict(
        q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=params["K"] ** -0.5,
        initial_state=x["initial_state"], output_final_state=True,
        gate_lower_bound=params["lower_bound"] if bounded else None, cu_seqlens=x["cu_seqlens"],
        cu_seqlens_cpu=x["cu_seqlens_cpu"], A_log=x["A_log"], dt_bias=x["dt_bias"],
        gate_activation=r.activation if in_kernel else "none", use_qk_l2norm=prod,
        use_beta_sigmoid=prod,
    )  # fmt: skip


def _describe_kwargs(kw) -> dict:
    """JSON-able summary of an argument dict (tensors as shape/dtype)."""
    out = {}
    for k, v in kw.items():
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            out[k] = f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}@{v.device.type}"
        else:
            out[k] = v
    return out


def load_fla():
    """``(chunk_kda, version)`` or ``(None, reason)``; the env var is set before the import."""
    import sys

    wanted = "1"
    if "fla" in sys.modules and os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") != wanted:
        return None, "fla was imported before FLA_DISABLE_BACKEND_DISPATCH=1 could be set"
    os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = wanted
    try:
        import fla
        from fla.ops.kda import chunk_kda
    except Exception as e:
        return None, f"fla-core not importable ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
    return chunk_kda, getattr(fla, "__version__", "?")


def _seed(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def seed_of(case: BenchCase) -> int:
    """The inputs' seed: the shape's (every regime of a shape draws the same q, k, v, x)."""
    return case.params.get("seed", _seed(case.name))


RESETS_NOTE = ("fla's default returns non-finite outputs for -inf gates, so it judges no row "
               "here (kreg's default against the float64 loop with -inf gates: "
               "tests/test_kda_gpu.py, benchmarks/kda_gate_paths.py)")  # fmt: skip


def prepare(case: BenchCase, target, device) -> Prepared:
    """Inputs on the device and every implementation of one case: per pair, the kreg row
    (``kreg.compat.fla.chunk_kda``) and the fla row called with one keyword dict, and a varlen
    case's kreg row with ``cu_seqlens_cpu``; then the extra bounded kreg rows."""
    import torch

    from kreg.compat import fla as compat_fla
    from kreg.dispatch import NoCandidateError

    from ..api import _prepare, kda_prefill, run_selection
    from ..selection import select_kda

    params = case.params
    x = make_inputs(params, device, seed_of(case))
    impls: list = []
    notes = [RESETS_NOTE] if regime_of(params).resets else []
    chunk_kda, fla_version = load_fla()

    def call(fn, kw):
        def run():
            with torch.inference_mode():
                return fn(**kw)

        return run

    def compat_impl(name, kw, peer, info):
        # looked up at call time: the module's chunk_kda, whatever its keywords are served by
        run = call(lambda **k: compat_fla.chunk_kda(**k), kw)
        return Impl(name, run=run, call=run, peer=peer,
                    info={**info, "call": "kreg.compat.fla.chunk_kda", "args": _describe_kwargs(kw)})  # fmt: skip

    names = {}
    for pair in pair_names(params):
        bounded = pair == PAIR_BOUNDED
        sel = select_kda(problem_of(params, bounded), target)
        kreg = names[pair] = _kreg_names(sel.candidate.name)[bounded]
        peer = SAFE_PEER if bounded else PEER
        kw = fla_kwargs(params, x, pair)  # one dict: both sides get exactly these keywords
        info = {"candidate": sel.candidate.name, "spec": spec_text(sel.spec),
                "decided_by": sel.decided_by,
                "gate_lower_bound": params["lower_bound"] if bounded else None}  # fmt: skip
        impls.append(compat_impl(kreg, kw, peer, info))
        if chunk_kda is None:
            impls.append(Skip(peer, fla_version))
        else:
            run_fla = call(chunk_kda, kw)
            impls.append(Impl(peer, run=run_fla, call=run_fla,
                              info={"version": fla_version, "args": _describe_kwargs(kw)}))  # fmt: skip
        if params.get("lengths"):
            impls.append(compat_impl(kreg + CPU_OFFSETS,
                                     dict(kw, cu_seqlens_cpu=x["cu_seqlens_cpu"]), peer,
                                     {**info, "extension": "cu_seqlens_cpu beside the device "
                                      "offsets (kreg's extension; its peer has none)"}))  # fmt: skip

    def kreg_impl(name, selection, kw, public):
        prep_kw = dict(kw, state_layout="kv", output_chunk_states=False)
        problem, launch = _prepare(**prep_kw)

        def run():
            return run_selection(selection, launch, problem)

        def host():
            if public is not None:
                return public()
            p, c = _prepare(**prep_kw)
            return run_selection(selection, c, p)

        return Impl(name, run=run, call=host, peer=SAFE_PEER,
                    info={"candidate": selection.candidate.name, "spec": spec_text(selection.spec),
                          "decided_by": selection.decided_by,
                          "gate_lower_bound": kw["gate_lower_bound"]})  # fmt: skip

    if has_extras(params):
        kw = kreg_kwargs(params, x)
        problem = problem_of(params)
        sel = select_kda(problem, target)
        try:
            fsel = select_kda(problem, target, algorithm="kda.fused", allow_opt_in=True)
            impls.append(kreg_impl(FUSED, fsel, kw, lambda: kda_prefill(
                **kw, algorithm="kda.fused", allow_opt_in=True, target=target)))  # fmt: skip
        except NoCandidateError as e:
            impls.append(Skip(FUSED, str(e).splitlines()[0]))
        if sel.candidate.name == "kda.split":
            for spec in split_variants(problem, target, sel.spec):
                impls.append(kreg_impl(spec_label(spec, sel.spec), attrs.evolve(sel, spec=spec),
                                       kw, None))  # fmt: skip

    def outputs(ret):
        return {"o": ret[0], "state": ret[1]}

    pairs = pairs_of(params, names.get(PAIR_DEFAULT, KREG_DEFAULT),
                     names.get(PAIR_BOUNDED, KREG_BOUNDED))  # fmt: skip
    references = (pairs[0].impl, pairs[0].peer)
    return Prepared(impls=impls, outputs=outputs, references=references, peer=pairs[0].peer,
                    notes=tuple(notes), pairs=pairs)  # fmt: skip


def bench_warm_jobs(bench_cases, target="sm90") -> list[tuple]:
    """The compile plan of a KDA bench run (``kda-grid``, ``kda``): each kreg kernel and each
    fla class once, on its smallest case (one job per case: its kreg rows, then one per fla
    class), and a case's extra rows (fused, spec variants) with its own job."""
    from ..builders import kernel_keys
    from ..selection import select_kda

    seen: set = set()
    jobs: dict[str, tuple] = {}
    for case in sorted(bench_cases, key=lambda c: c.tokens * c.heads):
        params = case.params
        for pair in pair_names(params):
            bounded = pair == PAIR_BOUNDED
            problem = problem_of(params, bounded)
            sel = select_kda(problem, target)
            kreg_row = _kreg_names(sel.candidate.name)[bounded]
            keys = (kernel_keys(problem, sel.spec) if sel.candidate.name == "kda.split"
                    else {(sel.candidate.name, problem)})  # fmt: skip
            if not keys <= seen:
                seen |= keys
                jobs.setdefault(case.name, (case, []))[1].append(kreg_row)
            fla = ("fla",) + fla_class(params, pair)
            fla_row = SAFE_PEER if bounded else PEER
            if fla not in seen:
                seen.add(fla)
                jobs.setdefault(case.name + "/" + fla_row, (case, []))[1].append(fla_row)
        if has_extras(params):
            paired = {r for p in pairs_of(params) for r in (p.impl, p.peer)}
            extra = [n for n in case.impls if n not in paired and not n.endswith(CPU_OFFSETS)]
            jobs.setdefault(case.name, (case, []))[1].extend(extra)
    # the peer's jobs compile every autotuning config: start them first
    return sorted(jobs.values(), key=lambda j: not any(n.startswith("fla") for n in j[1]))


def run(bench_cases, *, scenario: str = "kda", doc: str = HARNESS_DOC, **options) -> dict:
    """Scenario entry point: measure ``bench_cases`` (see :func:`kreg.bench.run_cases`); the
    grid scenario passes its own name and page text."""
    import torch

    versions = {}
    chunk_kda, fla_version = load_fla()
    if chunk_kda is not None:
        versions["fla-core"] = fla_version
    meta = {
        "versions": versions,
        "flop_formula": "tokens*heads*(6*K*V + 2*C*(3*K + 2*V) + C**2/3), C = 64",
        "bytes_formula": "tokens*(2*H*K + HV*V)*act + tokens*HV*K*g + tokens*HV*beta "
                         "+ tokens*HV*V*act (o) + seqs*HV*K*V*(h0 bytes + 4 if final state) "
                         "+ (HV + HV*K)*4 (A_log, dt_bias, gate in the kernel)",
        "torch_cuda_arch": torch.cuda.get_device_capability() if torch.cuda.is_available()
        else None,
    }  # fmt: skip
    return run_with_fla(scenario, bench_cases, prepare, bench_warm_jobs, doc=doc, meta=meta,
                        **options)  # fmt: skip


def run_with_fla(name, bench_cases, prepare, warm_jobs, **options) -> dict:
    """``run_cases`` with fla-core as a peer (the KDA and GDN scenarios): fla persists autotuning
    results (FLA_CACHE_RESULTS=1 by default), and the compiling workers share the GPU, so they
    must not (fla tunes in the measuring process on an idle GPU); ``warm_jobs(cases, target
    name)`` compiles each kreg kernel and each fla autotuning class once, not once per case."""
    options.setdefault("worker_env", {"FLA_CACHE_RESULTS": "0"})
    target = options.get("target")
    options.setdefault("warm_jobs", lambda cs: warm_jobs(cs, target.name if target else "sm90"))
    return run_cases(name, bench_cases, prepare, **options)


def scenario():
    from kreg.registry.model import Scenario

    return Scenario(
        name="kda",
        family="kda",
        description="KDA prefill, bf16: shapes x gate regimes (engines' gates, fla's tests, heavy, "
        "resets, legacy), B·H sweep, varlen (device offsets), production set, K = V = 96/192/256; "
        "kreg (via kreg.compat.fla) vs fla, like with like; --cases quick: the short run",
        cases=cases,
        run=run,
    )
