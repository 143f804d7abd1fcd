"""The KDA benchmark scenario ``kda`` (run by ``kreg bench kda``).

Cases are K = V = 128, bf16, gates within [-5, 0), HV = H. Each case times like-with-like
pairs on the same inputs: kreg's default (``gate_lower_bound=None``) against fla-core's default
``chunk_kda(...)``, and kreg bounded (``gate_lower_bound=-5.0``) against
``chunk_kda(..., safe_gate=True, lower_bound=-5.0)``; the production argument set
(``gate_activation="sigmoid_bound"``, which needs its bound) has the bounded pair only. Beside
them: the fused candidate (pinned, opt-in) and up to three other valid split specs, bounded.
See :data:`HARNESS_DOC` (rendered at the top of docs/kda/RESULTS.md) for the method and formulas.
"""

from __future__ import annotations

import functools
import os
import zlib

import attrs

from kreg.bench import BenchCase, Impl, Pair, Prepared, Skip, run_cases

HEAD_DIM = 128
LOWER_BOUND = -5.0
NOMINAL_CHUNK = 64  # the chunk size of the nominal FLOP count (every implementation alike)
MAIN_SHAPES = ((1, 2048, 32), (1, 8192, 32), (4, 8192, 32), (16, 8192, 32), (1, 65536, 4),
               (1, 65536, 32))  # fmt: skip
SWEEP_T = 8192
SWEEP_BH = ((1, 4), (1, 8), (1, 16), (1, 32), (2, 32), (4, 32), (8, 32), (16, 32))
VARLEN_LENGTHS = (1300, 547, 2048, 963, 271, 3063)
VARLEN_H = 32
PEER = "fla"  # fla-core's default chunk_kda: the peer of kreg's default
SAFE_PEER = "fla.safe_gate"  # chunk_kda(..., safe_gate=True, lower_bound=-5): of kreg bounded
KREG_DEFAULT = "kreg.split"  # kda_prefill default (gate_lower_bound=None): the safe anchor
KREG_BOUNDED = "kreg.split.bounded"  # kda_prefill(gate_lower_bound=-5.0): the block anchor
FUSED = "kreg.fused.bounded"  # the opt-in fused candidate, bounded
VARIANT_PREFIX = "split.bounded"  # other split specs of the bounded problem: split.bounded[...]
PAIR_DEFAULT = "default"
PAIR_BOUNDED = "bounded"
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
MAX_VARIANTS = 3

HARNESS_DOC = f"""# KDA prefill: benchmark results

## The harness

`kreg bench kda` (scenario `kda`, `kreg/families/kda/bench.py`, runner `kreg/bench.py`) times
KDA prefill on one GPU. Rerun it and regenerate this page with

```
kreg bench kda --out bench_out/kda            # ~5-6 min on one H200; --quick for fewer reps
kreg bench --render bench_out/kda/results.json --out docs/kda
kreg bench --list                             # the cases and implementations (no GPU needed)
```

(`--cases SUBSTR...` and `--impls NAME...` select cases and implementations by substring.)
For the peer, install fla-core 0.6.0 (`pip install fla-core==0.6.0`; `scripts/gpu_lane.sh` also
installs a wheel from an untracked `.whl/` folder where one is present); without it the peer rows
are skipped with a note.

**Like with like.** A promise about the gates buys speed on both sides, so every kreg row is
measured against the fla-core call that makes the same promise, on the same inputs (whose
gates lie within [-5, 0), so all four calls serve them exactly):

| pair | kreg row | peer row |
|---|---|---|
| default | `{KREG_DEFAULT}`: `kda_prefill(...)`, `gate_lower_bound=None` (any gate, exact; the safe anchor) | `{PEER}`: `chunk_kda(...)`, fla-core's default |
| bounded | `{KREG_BOUNDED}`: `kda_prefill(..., gate_lower_bound=-5.0)` (the promise admits the block anchor) | `{SAFE_PEER}`: `chunk_kda(..., safe_gate=True, lower_bound=-5.0)` |

The production argument set is bounded by construction (`gate_activation="sigmoid_bound"` needs
its bound), so it has the bounded pair only, against fla-core's equivalent call
(`use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0` with `A_log` and `dt_bias`).
× peer is always taken within a pair: fla default / kreg default, fla `safe_gate` / kreg bounded.

**Cases.** K = V = 128, bf16 activations, gates within [-5, 0), HV = H:
B×T×H = 1×2048×32, 1×8192×32, 4×8192×32, 16×8192×32, 1×65536×4, 1×65536×32; a B·H sweep at
T = 8192 over (B, H) = {", ".join(f"({b},{h})" for b, h in SWEEP_BH)} (B·H 4 to 512, shared
with the cases above); a varlen batch of lengths {", ".join(map(str, VARLEN_LENGTHS))} packed as
B = 1 with H = 32 (`cu_seqlens` on the device and `cu_seqlens_cpu` beside it, so no call
synchronises); and the production argument set (`gate_activation="sigmoid_bound"` with `A_log`
[HV] and `dt_bias` [HV·K] fp32, `use_qk_l2norm`, `use_beta_sigmoid`, fp32 initial state, final
state out) at 1×8192×32 and on the varlen batch. Plain cases output the final state (no initial
state).

**Inputs** (the same tensors for every implementation, seeded per case): q, k ~ N(0, 1),
L2-normalised per head (raw in the production set, which normalises inside the kernel);
v ~ N(0, 1); g = -5·sigmoid(exp(A_log)·(x + dt_bias)) with x ~ N(0, 1), A_log = log U(0.5, 2),
dt_bias ~ 0.5·N(0, 1) (so -5 ≤ g < 0; the production set passes x, A_log and dt_bias instead);
beta = sigmoid(N(0, 1)) (the production set passes the logits); initial state 0.1·N(0, 1) fp32.

**Implementations.** `{KREG_DEFAULT}`: what the dispatcher selects for `kda_prefill`'s default
(`gate_lower_bound=None`; plain cases only); `{KREG_BOUNDED}`: what it selects with
`gate_lower_bound=-5.0`; `{FUSED}`: the opt-in fused candidate, pinned
(`algorithm="kda.fused", allow_opt_in=True`), bounded; `{VARIANT_PREFIX}[...]`: up to
{MAX_VARIANTS} other valid split specs of the bounded problem, from
`enumerate_split_specs(target)` specialised and validated for the problem (filled up with
block_v variants of the selected spec when fewer are enumerated), labelled by the fields that
differ from the bounded selection. The extra bounded rows are measured against `{SAFE_PEER}`.
The peer is `fla.ops.kda.chunk_kda` of fla-core with `FLA_DISABLE_BACKEND_DISPATCH=1`, under
`torch.inference_mode()`: `{PEER}` as `chunk_kda(q, k, v, g, beta, scale=K**-0.5,
initial_state=None, output_final_state=True, cu_seqlens=..., cu_seqlens_cpu=...)` (plain cases
only), `{SAFE_PEER}` as the same with `safe_gate=True, lower_bound=-5.0`, and in the production
set with `use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0, A_log=A_log,
dt_bias=dt_bias`.

**Measurement.** Kernels are compiled first, in parallel: worker processes (`--workers`,
default half the cores, at most 8) call every implementation of every case once, filling
Triton's on-disk cache (the workers run with `FLA_CACHE_RESULTS=0`, so fla's autotuning choice
is not made on a shared GPU). Then, case by case in one process, every implementation is called
twice (loading kernels, fla's autotuning on the idle GPU and allocator warm-up are excluded from
every figure). Its outputs are then checked against the case's references, `{KREG_DEFAULT}`
and `{PEER}` (in the production set `{KREG_BOUNDED}` and `{SAFE_PEER}`):
relative RMS error ‖a − b‖/‖b‖ over all elements of o and of the final state, flagged ⚠ above
1e-2. The kreg rows time the launch path alone (problem and arguments prepared once, the spec
fixed; the dispatcher's choice is cached anyway). Device time: one call captured in a CUDA graph
and replayed, the L2 cache flushed (256 MiB zeroed) before every replay, median of at least 50
replays and 200 ms (`--quick`: 10 replays, 40 ms); an implementation that cannot be captured is
timed with `triton.testing.do_bench(return_mode="median")` instead (column "timing").
Host µs: wall clock of one whole public call (`kda_prefill(...)` for the kreg.* rows,
argument checks + launch for the split variants, `chunk_kda(...)` for fla) without a
synchronisation inside the timed region, median of up to 100 calls. Extra MiB: peak device
memory of one call beyond its inputs and outputs (`max_memory_allocated` after
`reset_peak_memory_stats`, minus the memory allocated before the call, minus the outputs).
× peer: the ms of the row's peer (its pair's fla row) / the row's ms (above 1: faster than
that fla call); the fla rows have none.

**Formulas.** Per token and head, with chunk C = {NOMINAL_CHUNK} for every implementation
(a nominal dense count of the chunkwise algorithm, so TFLOP/s compares like with like):

    FLOP = 6·K·V                 state products W·S, (Q⊙Γ)·S, (K⊙Γ')ᵀ·Vnew (2·K·V each)
         + 2·C·(3K + 2V)         A, Aqk, W (C×C×K each) and U, Aqk·Vnew (C×C×V each), dense
         + C²/3                  the triangular solve (I + A)⁻¹, C³/3 per chunk

= 6d² + 10Cd + C²/3 at K = V = d: 181,589 FLOP at d = 128, C = 64.
Compulsory bytes: q, k, v, g, beta read and o written once at their element sizes
(bf16: (10d + 2) bytes per token·head = 1282 at d = 128), plus per sequence and head the
initial state read (fp32, K·V·4) and the final state written (K·V·4), plus A_log and dt_bias in
the production set. GB/s = compulsory bytes / time; % copy BW = that over a 1 GiB
device-to-device `copy_` measured in the same run (read + write counted).
"""


# --- cases ------------------------------------------------------------------------------------


def kda_flops(tokens: int, heads: int, K: int = HEAD_DIM, V: int = HEAD_DIM,
              chunk: int = NOMINAL_CHUNK) -> float:  # fmt: skip
    """Nominal FLOPs (see HARNESS_DOC): tokens · heads · (6KV + 2C(3K + 2V) + C²/3)."""
    return tokens * heads * (6 * K * V + 2 * chunk * (3 * K + 2 * V) + chunk * chunk / 3)


def kda_bytes(tokens: int, heads_qk: int, heads_v: int, K: int = HEAD_DIM, V: int = HEAD_DIM, *,
              act_bytes: int = 2, g_bytes: int = 2, beta_bytes: int = 2, num_states: int = 1,
              initial_state_bytes: int = 0, final_state: bool = True,
              gate_params: bool = False) -> int:  # fmt: skip
    """Compulsory device-memory bytes of one prefill call (see HARNESS_DOC)."""
    per_token = (2 * heads_qk * K * act_bytes + heads_v * V * act_bytes  # q, k, v
                 + heads_v * K * g_bytes + heads_v * beta_bytes  # g, beta
                 + heads_v * V * act_bytes)  # o  # fmt: skip
    state = num_states * heads_v * K * V * (initial_state_bytes + (4 if final_state else 0))
    params = heads_v * 4 + heads_v * K * 4 if gate_params else 0
    return tokens * per_token + state + params


def make_case(B: int, T: int, H: int, *, lengths: tuple[int, ...] | None = None,
              production: bool = False, tags=(), name: str | None = None,
              head_dim: int = HEAD_DIM, dtype: str = "bf16", target: str = "sm90",
              HV: int | None = None, K: int | None = None, V: int | None = None,
              extras: bool = True, extra_params: dict | None = None) -> BenchCase:  # fmt: skip
    """One KDA case (by default K = V = 128, bf16, gates within [-5, 0), HV = H); ``lengths``
    makes it varlen. ``params["lower_bound"]`` bounds the inputs' gates and is the promise of the
    bounded rows; the default rows promise nothing (``gate_lower_bound=None``). ``extras=False``
    times the like-with-like pairs only (no fused row, no spec variants); ``extra_params`` are
    stored in the params (JSON-able, e.g. a grid's split label)."""
    if lengths is not None:
        if B != 1 or sum(lengths) != T:
            raise ValueError("varlen: B must be 1 and T the sum of the lengths")
    HV = H if HV is None else HV
    K = head_dim if K is None else K
    V = K if V is None else V
    n = len(lengths) if lengths else B
    params = {
        "B": B, "T": T, "H": H, "HV": HV, "K": K, "V": V, "dtype": dtype,
        "lower_bound": LOWER_BOUND, "lengths": list(lengths) if lengths else None,
        "production": production, **({} if extras else {"extras": False}),
        **(extra_params or {}),
    }  # fmt: skip
    if name is None:
        shape = f"varlen{n}-t{T}-h{H}" if lengths else f"b{B}-t{T}-h{H}"
        name = ("prod-" if production else "") + shape
    tokens = B * T
    case = BenchCase(
        name=name,
        params=params,
        flops=kda_flops(tokens, HV, K, V),
        bytes=kda_bytes(
            tokens,
            H,
            HV,
            K,
            V,
            act_bytes=DTYPE_BYTES[dtype],
            g_bytes=DTYPE_BYTES[dtype],
            beta_bytes=DTYPE_BYTES[dtype],
            num_states=n,
            initial_state_bytes=4 if production else 0,
            final_state=True,
            gate_params=production,
        ),  # fmt: skip
        tokens=tokens,
        heads=HV,
        bh=n * HV,
        tags=tags,
        description=("production argument set, " if production else "")
        + (f"varlen lengths {', '.join(map(str, lengths))}" if lengths else f"B={B} T={T} H={H}")
        + ("" if (HV, K, V) == (H, HEAD_DIM, HEAD_DIM) else f" HV={HV} K={K} V={V}"),
    )
    try:
        impls = planned_impls(case, target)
    except Exception as e:  # planning is informative only (--list)
        impls = (f"? ({type(e).__name__}: {e})",)
    return attrs.evolve(case, impls=impls)


@functools.cache
def cases() -> tuple[BenchCase, ...]:
    """Every case of the scenario, deduplicated (the sweep shares shapes with the main cases)."""
    shapes: dict[tuple[int, int, int], set[str]] = {}
    for shape in MAIN_SHAPES:
        shapes.setdefault(shape, set()).add("main")
    for b, h in SWEEP_BH:
        shapes.setdefault((b, SWEEP_T, h), set()).add("sweep")
    out = [make_case(B, T, H, tags=sorted(tags)) for (B, T, H), tags in shapes.items()]
    T = sum(VARLEN_LENGTHS)
    out.append(make_case(1, T, VARLEN_H, lengths=VARLEN_LENGTHS, tags=("varlen",)))
    out.append(make_case(1, SWEEP_T, 32, production=True, tags=("production",)))
    out.append(make_case(1, T, VARLEN_H, lengths=VARLEN_LENGTHS, production=True,
                         tags=("production", "varlen")))  # fmt: skip
    return tuple(out)


# --- problems, selections and spec variants (CPU-safe) ------------------------------------------


def has_extras(params) -> bool:
    """Whether a case times the fused row and spec variants beside its pairs."""
    return params.get("extras", True)


def has_default_pair(params) -> bool:
    """The production set's ``sigmoid_bound`` needs its bound: it has the bounded pair only."""
    return not params["production"]


def problem_of(params, bounded: bool = True) -> object:
    """The problem of a case's bounded rows (``bounded=False``: of its default rows)."""
    from kreg.problems import LinearAttentionProblem

    lengths = params.get("lengths")
    prod = params["production"]
    if not bounded and not has_default_pair(params):
        raise ValueError("the production set (sigmoid_bound) has no unbounded problem")
    return LinearAttentionProblem(
        batch=params["B"], seq_len=params["T"], heads_qk=params["H"], heads_v=params["HV"],
        head_dim_k=params["K"], head_dim_v=params["V"], dtype=params["dtype"],
        gate_lower_bound=params["lower_bound"] if bounded else None,
        gate_activation="sigmoid_bound" if prod else "none", qk_l2norm=prod, beta_sigmoid=prod,
        initial_state=prod, state_dtype="fp32", output_final_state=True,
        varlen=bool(lengths), num_seqs=len(lengths) if lengths else params["B"],
        max_seqlen=max(lengths) if lengths else None,  # as kda_prefill reads it from cu_seqlens
    )  # fmt: skip


def _target(target):
    if isinstance(target, str):
        from kreg.registry import get_registry

        return get_registry().targets[target]
    return target


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
    from . import specs

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


def pairs_of(params, default_name: str = KREG_DEFAULT,
             bounded_name: str = KREG_BOUNDED) -> tuple[Pair, ...]:  # fmt: skip
    """The like-with-like pairs of a case (see HARNESS_DOC)."""
    lb = params["lower_bound"]
    if params["production"]:
        return (Pair(PAIR_BOUNDED, bounded_name, SAFE_PEER,
                     f'production arguments, bounded by construction (`gate_activation='
                     f'"sigmoid_bound"` needs its bound): `kda_prefill(..., '
                     f'gate_lower_bound={lb})` against fla-core\'s equivalent `chunk_kda(..., '
                     f'use_gate_in_kernel=True, safe_gate=True, lower_bound={lb}, A_log=..., '
                     f'dt_bias=...)`; no default pair'),)  # fmt: skip
    return (
        Pair(PAIR_DEFAULT, default_name, PEER,
             "`kda_prefill(...)` (`gate_lower_bound=None`: any gate, exact) against fla-core's "
             "default `chunk_kda(...)`"),
        Pair(PAIR_BOUNDED, bounded_name, SAFE_PEER,
             f"`kda_prefill(..., gate_lower_bound={lb})` against `chunk_kda(..., "
             f"safe_gate=True, lower_bound={lb})`"),
    )  # fmt: skip


def planned_impls(case: BenchCase, target="sm90") -> tuple[str, ...]:
    """The implementations a run would time on ``target`` (the peers whenever importable), in
    the order :func:`prepare` makes them: the pairs first, then the extra bounded rows."""
    from kreg.dispatch import NoCandidateError

    from .plugin import select_kda

    target = _target(target)
    params = case.params
    problem = problem_of(params)
    sel = select_kda(problem, target)
    names = []
    if has_default_pair(params):
        dsel = select_kda(problem_of(params, bounded=False), target)
        names += [_kreg_names(dsel.candidate.name)[0], PEER]
    names += [_kreg_names(sel.candidate.name)[1], SAFE_PEER]
    if not has_extras(params):
        return tuple(names)
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
    """The case's tensors (the same for every implementation); see HARNESS_DOC."""
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
    A_log = torch.empty(HV, device=device).uniform_(0.5, 2.0, generator=gen).log_()
    dt_bias = 0.5 * randn(HV * K)
    x = randn(B, T, HV, K, dtype=act)
    beta_logits = randn(B, T, HV, dtype=act)
    if prod:
        g, beta = x, beta_logits
    else:
        z = A_log.exp().view(HV, 1) * (x.float() + dt_bias.view(HV, K))
        g = (LOWER_BOUND * torch.sigmoid(z)).to(act)
        beta = torch.sigmoid(beta_logits.float()).to(act)
        del z
    n = len(lengths) if lengths else B
    h0 = 0.1 * randn(n, HV, K, V) if prod else None
    cu = cu_cpu = None
    if lengths:
        cu_cpu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
        cu = cu_cpu.to(device)
    return {
        "q": q, "k": k, "v": v, "g": g, "beta": beta, "A_log": A_log if prod else None,
        "dt_bias": dt_bias if prod else None, "initial_state": h0, "cu_seqlens": cu,
        "cu_seqlens_cpu": cu_cpu,
    }  # fmt: skip


def kreg_kwargs(params, x, bounded: bool = True) -> dict:
    """Keyword arguments of ``kda_prefill`` for a case's tensors: the bounded rows' call, or
    with ``bounded=False`` the default rows' (``gate_lower_bound=None``)."""
    prod = params["production"]
    if not bounded and not has_default_pair(params):
        raise ValueError("the production set (sigmoid_bound) needs its bound")
    return dict(
        q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=params["K"] ** -0.5,
        initial_state=x["initial_state"], output_final_state=True,
        gate_lower_bound=params["lower_bound"] if bounded else None, cu_seqlens=x["cu_seqlens"],
        cu_seqlens_cpu=x["cu_seqlens_cpu"], A_log=x["A_log"], dt_bias=x["dt_bias"],
        gate_activation="sigmoid_bound" if prod else "none", use_qk_l2norm=prod,
        use_beta_sigmoid=prod,
    )  # fmt: skip


def fla_kwargs(params, x, safe_gate: bool = True) -> dict:
    """Keyword arguments of fla's ``chunk_kda`` making the same promise as kreg's call (see
    HARNESS_DOC): ``safe_gate=True, lower_bound=...`` for the bounded rows, fla's default call
    with ``safe_gate=False`` (plain cases only)."""
    prod = params["production"]
    if not safe_gate and prod:
        raise ValueError("the production set (sigmoid_bound) pairs with safe_gate only")
    kw = dict(
        q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=params["K"] ** -0.5,
        initial_state=x["initial_state"], output_final_state=True, cu_seqlens=x["cu_seqlens"],
        cu_seqlens_cpu=x["cu_seqlens_cpu"],
    )  # fmt: skip
    if prod:
        kw.update(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"])  # fmt: skip
    if safe_gate:
        kw.update(safe_gate=True, lower_bound=params["lower_bound"])
    return kw


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


def prepare(case: BenchCase, target, device) -> Prepared:
    """Inputs on the device and every implementation of one case: the like-with-like pairs
    (kreg default / fla default, kreg bounded / fla safe_gate) on the same tensors, then the
    extra bounded kreg rows."""
    import torch

    from kreg.dispatch import NoCandidateError

    from .api import _prepare, kda_prefill, run_selection
    from .plugin import select_kda

    params = case.params
    x = make_inputs(params, device, _seed(case.name))
    impls: list = []
    notes: list[str] = []

    def kreg_impl(name, selection, kw, public, peer):
        prep_kw = dict(kw, state_layout="kv", output_chunk_states=False)
        problem, call = _prepare(**prep_kw)
        spec = selection.spec

        def run():
            return run_selection(selection, call, problem)

        def host():
            if public is not None:
                return public()
            p, c = _prepare(**prep_kw)
            return run_selection(selection, c, p)

        return Impl(name, run=run, call=host, peer=peer,
                    info={"candidate": selection.candidate.name, "spec": spec_text(spec),
                          "decided_by": selection.decided_by,
                          "gate_lower_bound": kw["gate_lower_bound"]})  # fmt: skip

    chunk_kda, fla_version = load_fla()

    def fla_impl(name, safe_gate):
        if chunk_kda is None:
            return Skip(name, fla_version)
        fkw = fla_kwargs(params, x, safe_gate=safe_gate)

        def run_fla():
            with torch.inference_mode():
                return chunk_kda(**fkw)

        return Impl(name, run=run_fla, call=run_fla,
                    info={"version": fla_version, "args": _describe_kwargs(fkw)})  # fmt: skip

    default_name = bounded_name = None
    if has_default_pair(params):
        dkw = kreg_kwargs(params, x, bounded=False)
        dsel = select_kda(problem_of(params, bounded=False), target)
        default_name = _kreg_names(dsel.candidate.name)[0]
        impls.append(kreg_impl(default_name, dsel, dkw,
                               lambda: kda_prefill(**dkw, target=target), PEER))  # fmt: skip
        impls.append(fla_impl(PEER, safe_gate=False))
    kw = kreg_kwargs(params, x)
    problem = problem_of(params)
    sel = select_kda(problem, target)
    bounded_name = _kreg_names(sel.candidate.name)[1]
    impls.append(kreg_impl(bounded_name, sel, kw, lambda: kda_prefill(**kw, target=target),
                           SAFE_PEER))  # fmt: skip
    impls.append(fla_impl(SAFE_PEER, safe_gate=True))
    if has_extras(params):
        try:
            fsel = select_kda(problem, target, algorithm="kda.fused", allow_opt_in=True)
            impls.append(kreg_impl(FUSED, fsel, kw, lambda: kda_prefill(
                **kw, algorithm="kda.fused", allow_opt_in=True, target=target), SAFE_PEER))  # fmt: skip
        except NoCandidateError as e:
            impls.append(Skip(FUSED, str(e).splitlines()[0]))
    if sel.candidate.name == "kda.split" and has_extras(params):
        for spec in split_variants(problem, target, sel.spec):
            impls.append(kreg_impl(spec_label(spec, sel.spec), attrs.evolve(sel, spec=spec), kw,
                                   None, SAFE_PEER))  # fmt: skip

    def outputs(ret):
        return {"o": ret[0], "state": ret[1]}

    pairs = pairs_of(params, default_name or KREG_DEFAULT, bounded_name)
    references = (pairs[0].impl, pairs[0].peer)  # the default pair where there is one
    return Prepared(impls=impls, outputs=outputs, references=references, peer=pairs[0].peer,
                    notes=tuple(notes), pairs=pairs)  # fmt: skip


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
                         "+ (HV + HV*K)*4 (A_log, dt_bias, production)",
        "torch_cuda_arch": torch.cuda.get_device_capability() if torch.cuda.is_available()
        else None,
    }  # fmt: skip
    # fla persists autotuning results (FLA_CACHE_RESULTS=1 by default): the compiling workers
    # share the GPU, so they must not, and fla tunes in the measuring process on an idle GPU.
    options.setdefault("worker_env", {"FLA_CACHE_RESULTS": "0"})
    return run_cases(scenario, bench_cases, prepare, doc=doc, meta=meta, **options)


def scenario():
    from kreg.registry.model import Scenario

    return Scenario(
        name="kda",
        family="kda",
        description="KDA prefill, K=V=128 bf16: shapes, B·H sweep, varlen, production set; "
        "kreg default vs fla default, kreg bounded (and fused, spec variants) vs fla safe_gate",
        cases=cases,
        run=run,
    )
