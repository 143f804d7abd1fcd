"""KDA kernel promises as properties over their domain, under the Triton interpreter.

A probe is one batch row of one kernel call: row b changes the inputs at position p_b (or from
it on), so one batched call (B = T = 2 * chunk, p_b = b) checks every position of two chunks,
against one unperturbed call. fp32, K = V = 32, H = HV = 1 unless said otherwise. Probes:

1. causality, all of q, k, v, g, beta perturbed from p (random valid values): split path on
   every valid (chunk, solve_block) x {block, safe, safe with -1e4 gates}: 3 x (32 + 64 + 64 +
   128 + 128) = 1248 probes; fused at chunk 32, solve_block 16 and 32, {block, safe with -1e4
   gates}: 4 x 64 = 256.
2. causality, each input alone (chunk 32, solve_block 16, both anchors): 2 x 5 x 64 = 640.
3. containment: NaN in k, v, g, beta at p (chunk 32): 4 x 64 = 256; +inf (chunk 16):
   4 x 32 = 128; NaN in q at p: 64. -inf resets and -1e8 / -1e5 gates against the float64
   token-serial oracle: 5 shapes x {split, fused} = 10 sequences, 7 extreme placements each;
   softplus of raw gates 1e8: 2 sequences.
4. the block anchor (bound -5) given one gate channel at -200 or -60 at p: 2 x 64 = 128, each
   output row checked against the oracle (exact or NaN).
5. determinism and batch invariance: 2 random shapes, 4 repeated-call pairs and 3 rows alone
   each; varlen: 2 random shapes x {split, fused}, 4 sequences (one empty) each.
6. the safe anchor's pairs kernel alone, every stored entry against float64 pairs (gates to
   -1e4 and -inf, grouped value heads, a partial chunk): chunks 16 and 32.

The chunk-64 causality cases take about 20 s each (marked slow); the whole file about 6 minutes
on two CPU cores. The interpreter runs a chunk program in about 0.05 s, and a probe costs two.
"""

from __future__ import annotations

import inspect

import attrs
import numpy as np
import pytest
import torch
from test_kda_numerics import NON_FINITE_EXPECTED  # same folder: pytest puts it on sys.path

from kreg.dispatch import select
from kreg.families.kda import api
from kreg.families.kda.oracles import gate_softplus, relative_rms, token_serial_oracle
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

FP32 = torch.float32
TARGET = "sm90"  # CPU runs select with sm90's rules
K = V = 32
TOL = 1e-5  # relative RMS against the float64 oracle, fp32 inputs
# the promised bound each solve block's block anchor takes at the rule's limit (80 nats)
BLOCK_BOUND = {16: -5.0, 32: -2.5}
SAFE_LB = -5.0  # safe-anchor gates lie in [-5, 0)
HUGE = -1e4
_PREFILL_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(api.kda_prefill).parameters.items()
    if p.default is not inspect.Parameter.empty
}
# the keywords a call binds (the gate kind, keyword-only, is the entry's: derived from g here)
_PREPARE_ARGS = tuple(n for n, p in inspect.signature(api._prepare).parameters.items()
                      if p.kind is not p.KEYWORD_ONLY)  # fmt: skip
INPUTS = ("q", "k", "v", "g", "beta")


# --- helpers -------------------------------------------------------------------------------------


def run(x: dict, *, chunk: int, solve_block: int, anchor: str, fused=False, **kw):
    """``kda_prefill`` with its spec pinned to (chunk, solve_block, anchor), validated against
    the problem (so a block anchor without a bound that fits is refused, not launched).

    The anchor is set explicitly on the selected spec: whatever the dispatcher would derive from
    the problem, the kernels under test are the ones named here.
    """
    opts = {**_PREFILL_DEFAULTS, **x, **kw}
    problem, call = api._prepare(**{name: opts[name] for name in _PREPARE_ARGS})
    algorithm = "kda.fused" if fused else "kda.split"
    sel = select(problem, TARGET, algorithm=algorithm, allow_opt_in=True)
    tile = attrs.evolve(sel.spec.tile, chunk=chunk, solve_block=solve_block, anchor=anchor)
    # one pipeline stage: stages only schedule the loads, and the selected depth may not fit
    # the pinned chunk's shared memory
    scan = attrs.evolve(sel.spec.scan, chunk=chunk, block_v=V, segment_chunks=0, num_stages=1)
    spec = attrs.evolve(sel.spec, tile=tile, scan=scan)
    verdict = sel.candidate.is_valid(spec, sel.target, problem)
    assert verdict.ok, verdict.reasons
    assert spec.tile.anchor == anchor and spec.tile.chunk == chunk
    return api.run_selection(attrs.evolve(sel, spec=spec), call, problem)


def make(B, T, *, lb=SAFE_LB, seed=0, huge_rows=()):
    """Random valid fp32 inputs, H = HV = 1: unit-norm keys, gates in [lb, 0), beta in [0, 1).
    ``huge_rows``: (row, channel slice) pairs whose gates become HUGE (-1e4)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, 1, K, generator=gen)
    k = torch.randn(B, T, 1, K, generator=gen)
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(B, T, 1, V, generator=gen)
    g = lb * (1.0 - torch.rand(B, T, 1, K, generator=gen))  # (lb, 0]: rand is in [0, 1)
    g = torch.minimum(g, torch.tensor(-1e-3))  # strictly negative: [lb, 0)
    beta = torch.rand(B, T, 1, generator=gen)
    for row, cols in huge_rows:
        g[:, row, :, cols] = HUGE
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def h0(B, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(1, 1, K, V, generator=gen)).expand(B, 1, K, V).contiguous()


def repeat(x: dict, B: int) -> dict:
    return {n: t.expand(B, *t.shape[1:]).contiguous() for n, t in x.items()}


def late_mask(p: torch.Tensor, T: int, ndim: int) -> torch.Tensor:
    """[B, T, 1, ...] True at positions >= p[b]."""
    m = torch.arange(T)[None, :] >= p[:, None]
    return m.reshape(*m.shape, *([1] * (ndim - 2)))


def perturb_from(base: dict, noise: dict, p: torch.Tensor, names=INPUTS) -> dict:
    """Batch row b: ``base`` (one row, repeated) with ``names`` replaced by ``noise`` from p[b] on."""
    B, T = p.numel(), base["q"].shape[1]
    out = repeat(base, B)
    for n in names:
        out[n] = torch.where(late_mask(p, T, out[n].dim()), noise[n], out[n])
    return out


def assert_equal(a, b, what=""):
    assert a.shape == b.shape, what
    if not torch.equal(a, b):
        both = torch.isfinite(a) & torch.isfinite(b)
        diff = (a[both].double() - b[both].double()).abs().max().item() if both.any() else 0.0
        raise AssertionError(f"{what}: not bitwise equal (max finite abs diff {diff:g})")


def assert_causal(o, ref, p, what):
    """o[b, :p_b] bitwise equals the unperturbed ``ref[0, :p_b]``; o[b, p_b:] does not."""
    for b, pb in enumerate(p.tolist()):
        assert_equal(o[b, :pb], ref[0, :pb], f"{what}, p={pb}: o[:p]")
        assert not torch.equal(o[b, pb:], ref[0, pb:]), f"{what}, p={pb}: probe changed nothing"


def oracle(x: dict, **kw):
    return token_serial_oracle(**{n: t.double() for n, t in x.items()}, **kw)


# --- 1, 2: causality, bit for bit, at every position -----------------------------------------

# every valid (chunk, solve_block): solve_block divides chunk
SHAPES = [(c, b) for c in (16, 32, 64) for b in (16, 32) if c % b == 0]
# "block": gates within its bound; "safe": gates in [-5, 0); "safe_huge": the same with -1e4
# gates at a few rows of the base and of the perturbations (clamped, far past any span)
VARIANTS = ("block", "safe", "safe_huge")


def _safe(variant):
    """The variant as a parameter: the safe anchor's may warn (see NON_FINITE_EXPECTED)."""
    return variant if variant == "block" else pytest.param(variant, marks=NON_FINITE_EXPECTED)


def _causality_case(chunk, solve_block, variant, seed):
    """(base, noise, kwargs) for a causality probe batch of B = 2 * chunk rows (p = 0..T-1)."""
    T = 2 * chunk
    B = T
    anchor = "block" if variant == "block" else "safe"
    lb = BLOCK_BOUND[solve_block] if anchor == "block" else SAFE_LB
    base_huge = noise_huge = ()
    if variant == "safe_huge":
        # base: a whole-row reset in chunk 0, half the channels of a row in chunk 1;
        # perturbations: other rows, before and after the base's
        base_huge = ((chunk // 2 + 1, slice(None)), (chunk + 5, slice(None, None, 2)))
        noise_huge = ((3, slice(1, None, 2)), (chunk + chunk // 2, slice(None)), (T - 2, slice(None)))  # fmt: skip
    base = make(1, T, lb=lb, seed=seed, huge_rows=base_huge)
    noise = make(B, T, lb=lb, seed=seed + 1, huge_rows=noise_huge)
    kw = dict(initial_state=h0(1), gate_lower_bound=lb if anchor == "block" else None)
    return base, noise, anchor, kw


def _check_causality(chunk, solve_block, variant, fused=False, names=INPUTS, seed=0):
    base, noise, anchor, kw = _causality_case(chunk, solve_block, variant, seed)
    T = base["q"].shape[1]
    p = torch.arange(T)
    args = dict(chunk=chunk, solve_block=solve_block, anchor=anchor, fused=fused)
    ref = run(base, **args, **kw)[0]
    y = perturb_from(base, noise, p, names)
    o = run(y, **args, **{**kw, "initial_state": h0(T)})[0]
    assert_causal(o, ref, p, f"{variant} chunk={chunk} solve_block={solve_block} {names}")


def _slow_if(cond):
    return [pytest.mark.slow] if cond else []


@pytest.mark.parametrize("variant", [_safe(v) for v in VARIANTS])
@pytest.mark.parametrize(
    "chunk,solve_block", [pytest.param(c, b, marks=_slow_if(c == 64)) for c, b in SHAPES]
)
def test_causality_at_every_position_split(chunk, solve_block, variant):
    """Outputs before p ignore every input (q, k, v, g, beta) at p and later, bit for bit, for
    every p in two chunks, on every valid (chunk, solve_block, anchor) of the split path."""
    _check_causality(chunk, solve_block, variant, seed=chunk + solve_block)


@pytest.mark.parametrize("variant", [_safe(v) for v in ("block", "safe_huge")])
@pytest.mark.parametrize("solve_block", [16, 32])
def test_causality_at_every_position_fused(solve_block, variant):
    """The fused kernel computes the same tiles (``_chunk_tiles``) inside its recurrence: chunk
    32, both anchors (the safe one on chunks with -1e4 gates too)."""
    _check_causality(32, solve_block, variant, fused=True, seed=100 + solve_block)


@pytest.mark.parametrize("name", INPUTS)
@pytest.mark.parametrize("anchor", ["block", "safe"])
def test_causality_per_input(anchor, name):
    """Each input alone, perturbed from every p: chunk 32, solve_block 16."""
    _check_causality(32, 16, anchor, names=(name,), seed=200 + INPUTS.index(name))


# --- 3: non-finite containment; -inf and huge gates are valid ------------------------------------

C3, SB3 = 32, 16  # containment probes: two chunks of two sub-blocks each
# (input, value, chunk): NaN at chunk 32 (the cut crosses sub-blocks), +inf at chunk 16 (half
# the probes for the same promise on another shape)
POISONS = [(n, kind, 32 if kind == "nan" else 16) for n in ("k", "v", "g", "beta")
           for kind in ("nan", "inf")]  # fmt: skip


def _poisoned(base: dict, name: str, value: float, p: torch.Tensor, seed: int) -> dict:
    """Batch row b: ``base`` with ``value`` at position p[b] of ``name``, in one random channel
    (every channel of beta, which has one)."""
    B = p.numel()
    y = repeat(base, B)
    t = y[name]
    gen = torch.Generator().manual_seed(seed)
    ch = torch.randint(0, t.shape[-1], (B,), generator=gen)
    rows = torch.arange(B)
    if t.dim() == 3:  # beta [B, T, HV]
        t[rows, p, 0] = value
    else:
        t[rows, p, 0, ch] = value
    return y


@NON_FINITE_EXPECTED
@pytest.mark.parametrize("name,kind,chunk", POISONS)
def test_non_finite_input_cuts_at_its_position(name, kind, chunk):
    """NaN or +inf in k, v, g or beta at p, for every p of two chunks: outputs before p bitwise
    unchanged, every output from p on NaN, and a NaN final state."""
    T = 2 * chunk
    base = make(1, T, seed=300)
    kw = dict(chunk=chunk, solve_block=16, anchor="safe", output_final_state=True)
    ref, _ = run(base, **kw, initial_state=h0(1))
    p = torch.arange(T)
    y = _poisoned(base, name, float(kind), p, seed=301)
    o, ht = run(y, **kw, initial_state=h0(T))
    for b, pb in enumerate(p.tolist()):
        assert_equal(o[b, :pb], ref[0, :pb], f"{name}={kind} at p={pb}: o[:p]")
        assert o[b, pb:].isnan().all(), f"{name}={kind} at p={pb}: a finite output from p on"
        assert ht[b].isnan().all(), f"{name}={kind} at p={pb}: final state not all NaN"


def test_nan_query_reaches_only_its_own_row():
    T = 2 * C3
    base = make(1, T, seed=310)
    kw = dict(chunk=C3, solve_block=SB3, anchor="safe", output_final_state=True)
    ref, ref_ht = run(base, **kw, initial_state=h0(1))
    p = torch.arange(T)
    o, ht = run(_poisoned(base, "q", float("nan"), p, seed=311), **kw, initial_state=h0(T))
    for b, pb in enumerate(p.tolist()):
        assert o[b, pb].isnan().all(), f"q=nan at p={pb}: its own row not NaN"
        keep = torch.arange(T) != pb
        assert_equal(o[b, keep], ref[0, keep], f"q=nan at p={pb}: other rows")
        assert_equal(ht[b], ref_ht[0], f"q=nan at p={pb}: final state")


def _extreme_gates(chunk: int, seed: int) -> dict:
    """Gates in [-5, 0) with -inf resets (a whole row, half a row, at a chunk's last and first
    rows, a sub-block start) and single huge finite gates (-1e8, -1e5)."""
    T = 2 * chunk
    x = make(1, T, seed=seed)
    g = x["g"]
    g[0, 5] = float("-inf")
    g[0, chunk - 1, :, ::2] = float("-inf")
    g[0, chunk] = float("-inf")
    g[0, chunk + 16 if chunk > 16 else chunk + 9, :, 3] = float("-inf")
    g[0, 9, :, 7] = -1e8
    g[0, chunk + 3] = -1e5
    g[0, T - 2, :, 1::2] = -1e8
    return x


@NON_FINITE_EXPECTED
@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
@pytest.mark.parametrize("chunk,solve_block", SHAPES)
def test_hard_resets_and_huge_gates_match_the_oracle(chunk, solve_block, fused):
    """g = -inf is a valid hard reset, not poison: safe anchor, finite and oracle-exact."""
    x = _extreme_gates(chunk, seed=320 + chunk + solve_block)
    s0 = h0(1)
    o, ht = run(x, chunk=chunk, solve_block=solve_block, anchor="safe", fused=fused,
                initial_state=s0, output_final_state=True)  # fmt: skip
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    ro, rh = oracle(x, initial_state=s0.double())
    assert relative_rms(o, ro) <= TOL, relative_rms(o, ro)
    assert relative_rms(ht, rh) <= TOL, relative_rms(ht, rh)


@NON_FINITE_EXPECTED
@pytest.mark.parametrize("huge", [1e8, float("inf"), float("-inf")])
@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_softplus_of_a_huge_raw_gate_matches_the_oracle(fused, huge):
    """gate_activation='softplus' with raw inputs of 1e8 (a decay of about -1e8 nats), or +-inf:
    the rule on non-finite inputs is on the activated gate, here -inf (a reset) or -0.0, both
    valid, so the output is the oracle's, finite."""
    chunk, T = 32, 64
    x = make(1, T, seed=330)
    gen = torch.Generator().manual_seed(331)
    raw = torch.randn(x["g"].shape, generator=gen)
    raw[0, 7] = huge
    raw[0, 40, :, ::3] = huge
    A_log = torch.randn(1, generator=gen) * 0.5
    dt_bias = torch.randn(K, generator=gen)
    x["g"] = raw
    s0 = h0(1)
    o, ht = run(x, chunk=chunk, solve_block=16, anchor="safe", fused=fused, initial_state=s0,
                output_final_state=True, gate_activation="softplus", A_log=A_log,
                dt_bias=dt_bias)  # fmt: skip
    g = gate_softplus(raw, A_log, dt_bias)
    assert g.min() < -1e7 if huge > 0 else g.max() <= 0
    ref = {n: t.double() for n, t in x.items()}
    ref["g"] = torch.from_numpy(g)
    ro, rh = token_serial_oracle(**ref, initial_state=s0.double())
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert relative_rms(o, ro) <= TOL, relative_rms(o, ro)
    assert relative_rms(ht, rh) <= TOL, relative_rms(ht, rh)


# --- 4: a broken bound on the block anchor is NaN, never silently wrong ----------------------------


@pytest.mark.parametrize("violation", [-200.0, -60.0])
def test_block_anchor_past_its_bound_is_exact_or_nan(violation):
    """anchor='block', promised bound -5, and one gate channel at ``violation`` at p (every p of
    two chunks): rows before p bitwise unchanged; every row and the final state are either
    within 1e-5 of the float64 oracle (relative to the sequence's RMS row norm) or all NaN.
    -200 leaves the anchor's span at p itself, so rows from p on must be NaN; -60 leaves it or
    not depending on the gates before it in its sub-block, and both happen."""
    chunk, sb, lb = 32, 16, BLOCK_BOUND[16]
    T = 2 * chunk
    base = make(1, T, lb=lb, seed=400)
    kw = dict(chunk=chunk, solve_block=sb, anchor="block", gate_lower_bound=lb,
              output_final_state=True)  # fmt: skip
    ref, _ = run(base, **kw, initial_state=h0(1))
    p = torch.arange(T)
    y = _poisoned(base, "g", violation, p, seed=401)
    o, ht = run(y, **kw, initial_state=h0(T))
    ro, rh = oracle(y, initial_state=h0(T).double())
    ro, rh = torch.from_numpy(ro), torch.from_numpy(rh)
    n_nan = n_late_finite = 0
    for b, pb in enumerate(p.tolist()):
        assert_equal(o[b, :pb], ref[0, :pb], f"g={violation} at p={pb}: o[:p]")
        scale = ro[b].norm(dim=(-2, -1)).pow(2).mean().sqrt()  # RMS row norm
        for t in range(T):
            row = o[b, t]
            if row.isnan().all():
                assert t >= pb, f"g={violation} at p={pb}: row {t} < p is NaN"
                n_nan += 1
                continue
            assert torch.isfinite(row).all(), f"g={violation} at p={pb}: row {t} partly NaN"
            n_late_finite += t >= pb
            err = (row.double() - ro[b, t]).norm() / scale
            assert err <= TOL, f"g={violation} at p={pb}: row {t} finite but off by {err:.3g}"
        if violation == -200.0:
            assert o[b, pb:].isnan().all(), f"g=-200 at p={pb}: a finite row from p on"
        if not ht[b].isnan().all():
            err = relative_rms(ht[b], rh[b])
            assert err <= TOL, f"g={violation} at p={pb}: final state finite but off by {err:.3g}"
    assert n_nan > 0  # the violation was caught
    if violation == -60.0:
        assert n_late_finite > 0  # and, where the span still fits, served exactly


# --- 5: determinism, batch and varlen invariance ------------------------------------------------


def _random_case(seed):
    rng = np.random.default_rng(seed)
    chunk, solve_block = SHAPES[rng.integers(len(SHAPES))]
    H = int(rng.integers(1, 3))
    HV = H * int(rng.integers(1, 3))
    T = int(rng.integers(chunk // 2, 2 * chunk + 8))
    return chunk, solve_block, H, HV, T, rng


def _inputs(B, T, H, HV, seed):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(B, T, H, K, generator=gen)
    return dict(
        q=torch.randn(B, T, H, K, generator=gen),
        k=k / k.norm(dim=-1, keepdim=True),
        v=torch.randn(B, T, HV, V, generator=gen),
        g=SAFE_LB * torch.rand(B, T, HV, K, generator=gen),
        beta=torch.rand(B, T, HV, generator=gen),
    )


def _states(n, HV, seed):
    gen = torch.Generator().manual_seed(seed)
    return 0.5 * torch.randn(n, HV, K, V, generator=gen)


@NON_FINITE_EXPECTED  # the safe anchor (see NON_FINITE_EXPECTED)
@pytest.mark.parametrize("seed", [0, 1])
def test_deterministic_and_batch_invariant(seed):
    """Two identical calls agree bit for bit (split and fused); each batch row equals that row
    run alone, bit for bit."""
    chunk, sb, H, HV, T, _ = _random_case(seed)
    B = 3
    x = _inputs(B, T, H, HV, seed=500 + seed)
    s0 = _states(B, HV, seed=510 + seed)
    kw = dict(chunk=chunk, solve_block=sb, anchor="safe", initial_state=s0,
              output_final_state=True)  # fmt: skip
    for fused in (False, True):
        a = run(x, **kw, fused=fused)
        b = run(x, **kw, fused=fused)
        for what, u, w in zip(("o", "final state"), a, b, strict=True):
            assert_equal(u, w, f"fused={fused}: repeated call, {what}")
    o, ht = a
    for i in range(B):
        alone = {n: t[i : i + 1].contiguous() for n, t in x.items()}
        oi, hi = run(alone, **{**kw, "initial_state": s0[i : i + 1]}, fused=True)
        assert_equal(o[i : i + 1], oi, f"batch row {i}: o")
        assert_equal(ht[i : i + 1], hi, f"batch row {i}: final state")


@NON_FINITE_EXPECTED  # the safe anchor (see NON_FINITE_EXPECTED)
@pytest.mark.parametrize("seed", [2, 3])
def test_varlen_equals_each_sequence_alone(seed):
    """Packed sequences of random lengths (one empty) equal each sequence run alone, bit for bit,
    on the split and the fused path."""
    check_varlen_alone(run, seed, lambda x: x, anchor="safe")


def check_varlen_alone(run, seed, inputs_of, **spec):
    """Random lengths (one empty) packed, against each sequence run alone, bit for bit, split and
    fused (``inputs_of`` maps KDA's inputs to the family's; ``spec`` pins the anchor)."""
    chunk, sb, H, HV, _, rng = _random_case(seed)
    lens = [int(n) for n in rng.integers(1, 2 * chunk + 8, size=3)]
    lens.insert(int(rng.integers(0, 4)), 0)
    cu = np.concatenate([[0], np.cumsum(lens)])
    x = inputs_of(_inputs(1, int(cu[-1]), H, HV, seed=520 + seed))
    s0 = _states(len(lens), HV, seed=530 + seed)
    kw = dict(chunk=chunk, solve_block=sb, output_final_state=True, **spec)
    for fused in (False, True):
        o, ht = run(x, **kw, fused=fused, initial_state=s0, cu_seqlens=torch.tensor(cu))
        for n in range(len(lens)):
            a, b = int(cu[n]), int(cu[n + 1])
            if a == b:
                assert_equal(ht[n], s0[n], f"fused={fused}: empty sequence's state")
                continue
            part = {name: t[:, a:b].contiguous() for name, t in x.items()}
            on, hn = run(part, **kw, fused=fused, initial_state=s0[n : n + 1])
            assert_equal(o[:, a:b], on, f"fused={fused}: o of sequence {n}")
            assert_equal(ht[n : n + 1], hn, f"fused={fused}: final state of sequence {n}")


# --- 6. the pairs kernel alone: every entry against float64 pairs ------------------------------


@pytest.mark.parametrize("chunk", [16, 32])
def test_pairs_kernel_entries_match_float64_pairs(chunk):
    """The safe anchor's diagonal sub-blocks, as the pairs kernel stores them (A strictly
    lower, Aqk with its diagonal), entry by entry against sum_k q_ik k_jk exp(sum of the gates after j up to i) in float64, for gates from
    mild to -1e4 and -inf resets: exact to fp32 rounding of each entry's magnitude (a factor
    below fp32's normal range may flush), rows past a partial chunk's end left at zero."""
    from kreg.families.kda import kernels

    BS, H, HV, T = 16, 2, 4, 2 * chunk + 9  # grouped value heads, a partial last chunk
    gen = torch.Generator().manual_seed(23)
    q = torch.randn(1, T, H, K, generator=gen)
    k = torch.randn(1, T, H, K, generator=gen)
    g = -torch.rand(1, T, HV, K, generator=gen) * 8  # up to -8 nats: spans past the block anchor
    g[0, 5, 1] = float("-inf")  # a hard reset on one head
    g[0, 7, 2, : K // 2] = HUGE
    g[0, chunk + 3, :, 3] = -200.0
    nc = -(-T // chunk)
    pa = torch.full((nc, HV, chunk, BS), 7.0)  # rows past T must come back zero
    pqk = torch.full_like(pa, 7.0)
    kernels.kda_chunk_pairs_kernel[(nc, HV)](
        q, k, g, None, None, pa, pqk, None, None, None, T=T, H=H, HV=HV, lower_bound=0.0,
        K=K, C=chunk, BS=BS, GATE_ACT=0, QK_L2=False, VARLEN=False, FP32_DOT="ieee",
        num_warps=1,
    )  # fmt: skip
    qd, kd, gd = q[0].double(), k[0].double(), g[0].double()
    checked = 0
    for c in range(nc):
        for hv in range(HV):
            h = hv // (HV // H)
            for r in range(chunk):
                t = c * chunk + r
                if t >= T:
                    assert (pa[c, hv, r] == 0).all() and (pqk[c, hv, r] == 0).all(), (c, hv, r)
                    continue
                t0 = t - r % BS  # the sub-block's first row
                for j in range(t0, t + 1):
                    decay = torch.exp(gd[j + 1 : t + 1, hv].sum(0))  # [K]; -inf -> 0
                    for got, x in ((pqk, qd), (pa, kd)):
                        if got is pa and j == t:  # A is strictly lower: its diagonal stays 0
                            assert pa[c, hv, r, j - t0] == 0
                            continue
                        terms = x[t, h] * kd[j, h] * decay
                        scale = (x[t, h] * kd[j, h]).abs().sum()
                        err = abs(got[c, hv, r, j - t0].item() - terms.sum().item())
                        assert err <= 1e-5 * scale + 1e-30, (c, hv, r, j, err, scale)
                        checked += 1
    assert checked == HV * sum(2 * (t % BS) + 1 for t in range(T))  # Aqk j <= i, A j < i
