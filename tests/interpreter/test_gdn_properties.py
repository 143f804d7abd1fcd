"""GDN kernel promises as properties over their domain, under the Triton interpreter.

GDN runs KDA's delta-rule kernels in their scalar-gate mode (g ``[B, T, HV]``: one gate per
token and value head; ``_scalar_tiles`` forms A and Aqk over the whole chunk with a decay
factor from one masked product of direct sums, no pairs kernel), so its promises are
``kda_prefill``'s, checked here the way
``test_kda_properties`` checks KDA's and with its helpers: a probe is one batch row of one kernel
call, row b changing the inputs at position p_b = b (or from it on), so one batched call of
B = T = 2 * chunk rows checks every position of two chunks. fp32, K = V = 32, H = HV = 1 unless
said otherwise. The oracles take a scalar gate as a per-channel one with equal channels.

1. causality, all of q, k, v, g, beta perturbed from p: split, solve_block 16, chunks 16 and 32
   x {block anchor (bound -5), safe, safe with -1e4 gates}: 3 x (32 + 64) = 288 probes; fused,
   chunk 32, {block, safe with -1e4 gates}: 2 x 64 = 128; each input alone (chunk 32, both
   anchors): 2 x 5 x 64 = 640.
2. containment: NaN in k, v, g, beta at p (chunk 32): 4 x 64 = 256; +inf (chunk 16):
   4 x 32 = 128; NaN in q at p: 64.
3. -inf resets and -1e8 / -1e5 gates against both float64 oracles: 4 shapes x {split, fused}
   = 8 sequences, 7 extreme placements each, o and the final state checked apart, and the
   minimal case of a defect this file found (the state-update factor's suffix taken as a total
   less a prefix of clamped gates: 2e-5 off after two late resets; now a direct sum); softplus of raw gates of 1e8, +inf, -inf with A_log and dt_bias
   [HV]: 3 x {split, fused} = 6 sequences. Small gates after huge ones, and q and k rows
   scaled by up to 1e17 under the L2 norm (the same outputs): chunks 32 and 64 x {split, fused}.
4. split == fused bit for bit: 4 option sets (states and chunk states, varlen with an empty
   sequence, the block anchor at solve_block 32, softplus with resets, L2 norm, beta sigmoid
   and the vk layout).
5. varlen == each sequence alone: 2 random shapes x {split, fused}, 4 sequences (one empty)
   each; grouped value heads (H = 1, HV = 2) against the oracles and each value head against
   its own HV = 1 run; K = V = 48 against the oracles and bit for bit the hand-padded run,
   whose padded state rows and columns stay zero; decode (gdn.recurrent) against the oracle
   with resets and huge gates, and on a state pool (slots written in place, a -1 slot and the
   others untouched).
6. GDN == KDA with the gate broadcast over K within 1e-5 relative RMS (not bit for bit: the
   scalar gate's whole-chunk tiles take other algebra than the pairs kernel's), pinned to the
   same spec on 4 cases, and through the two public entries.
7. the block anchor (bound -5) given a gate of -200 or -60 at p: 2 x 64 = 128, each output row
   against the oracle (exact or NaN).

No case takes 20 s (the largest, a chunk-32 probe batch, about 8 s): none is marked slow; the
file takes about 2.5 minutes of CPU (2026-12-06, a 2-core machine).
"""

from __future__ import annotations

import attrs
import pytest
import test_kda_properties as kp  # same folder: pytest puts it on sys.path
import torch
from test_kda_numerics import NON_FINITE_EXPECTED, assert_close

from kreg.dispatch import select
from kreg.families.gdn import gdn_prefill
from kreg.families.kda import api
from kreg.families.kda.oracles import gate_softplus, relative_rms, tile_oracle, token_serial_oracle

pytestmark = kp.pytestmark  # TRITON_INTERPRET=1 only

K, V, TOL = kp.K, kp.V, kp.TOL
assert_equal = kp.assert_equal
# a gate below this in any channel of a per-channel case (-1e4 rows, -inf resets, -1e8, -1e5)
# is an extreme placement: the scalar gate of that row takes it (see ``scalar``)
EXTREME = -100.0
# the tile oracle's stand-in for a -inf reset (its cumsum differences would be -inf - -inf):
# exp of any span holding it is 0.0 in float64, as exp(-inf) is
RESET_F64 = -1e4


# --- helpers -------------------------------------------------------------------------------------


def run(x: dict, *, chunk: int, solve_block: int = 16, anchor: str = "safe", fused=False, **kw):
    """``gdn_prefill`` with its spec pinned to (chunk, solve_block, anchor) and validated against
    the problem, as ``test_kda_properties.run`` pins ``kda_prefill``'s (the scan takes all of V
    in one block, so split and fused compute the same products)."""
    opts = {**kp._PREFILL_DEFAULTS, **x, **kw}
    problem, call = api._prepare(**{n: opts[n] for n in kp._PREPARE_ARGS}, gate="scalar")
    sel = select(problem, kp.TARGET, algorithm="gdn.fused" if fused else "gdn.split",
                 allow_opt_in=True)  # fmt: skip
    assert sel.spec.tile.scalar_gate
    tile = attrs.evolve(sel.spec.tile, chunk=chunk, solve_block=solve_block, anchor=anchor)
    scan = attrs.evolve(sel.spec.scan, chunk=chunk, block_v=sel.spec.scan.head_dim_v,
                        segment_chunks=0, num_stages=1)  # fmt: skip
    spec = attrs.evolve(sel.spec, tile=tile, scan=scan)
    verdict = sel.candidate.is_valid(spec, sel.target, problem)
    assert verdict.ok, verdict.reasons
    return api.run_selection(attrs.evolve(sel, spec=spec), call, problem)


def scalar(x: dict) -> dict:
    """A per-channel case of ``test_kda_properties`` (g ``[B, T, HV, K]``) as a scalar-gate one:
    each row's gate is its channel 0, or its lowest channel where one is extreme (below
    ``EXTREME``), so every reset and huge gate the case places stays in it."""
    g = x["g"]
    low = g.amin(-1)
    return {**x, "g": torch.where(low < EXTREME, low, g[..., 0]).contiguous()}


def make(B, T, **kw):
    return scalar(kp.make(B, T, **kw))


def per_channel(x: dict, reset=None) -> dict:
    """Float64 inputs with the scalar gate broadcast over K: the oracles' (and KDA's) form.
    ``reset``: the value a -inf gate becomes (the tile oracle's ``RESET_F64``)."""
    y = {n: t.double() for n, t in x.items()}
    g = y["g"] if reset is None else y["g"].nan_to_num(neginf=reset)
    y["g"] = g[..., None].expand(*g.shape, x["q"].shape[-1])
    return y


def check_oracles(x, o, ht, chunk=64, only=None, **kw):
    """Finite, and within ``TOL`` of both float64 oracles: the token-serial recurrence and the
    chunkwise factorisation (on ``RESET_F64`` for -inf). ``only``: "o" or "final state"."""
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    kw = {n: t.double() if torch.is_tensor(t) and t.is_floating_point() else t
          for n, t in kw.items()}  # fmt: skip
    refs = (token_serial_oracle(**per_channel(x), **kw),
            tile_oracle(**per_channel(x, RESET_F64), chunk=chunk, **kw))  # fmt: skip
    for i, (what, got) in enumerate((("o", o), ("final state", ht))):
        if only in (None, what):
            assert_close(got, [r[i] for r in refs], TOL, what)


# --- 1: causality, bit for bit, at every position -----------------------------------------------


def _check_causality(chunk, variant, fused=False, names=kp.INPUTS, seed=0):
    """``test_kda_properties``'s causality batch (its bases, perturbations and -1e4 rows) with
    scalar gates: outputs before p_b bitwise the unperturbed ones, later ones changed."""
    base, noise, anchor, kw = kp._causality_case(chunk, 16, variant, seed)
    base, noise = scalar(base), scalar(noise)
    p = torch.arange(2 * chunk)
    args = dict(chunk=chunk, anchor=anchor, fused=fused, **kw)
    ref = run(base, **args)[0]
    y = kp.perturb_from(base, noise, p, names)
    o = run(y, **{**args, "initial_state": kp.h0(p.numel())})[0]
    kp.assert_causal(o, ref, p, f"{variant} chunk={chunk} fused={fused} {names}")


@pytest.mark.parametrize("variant", [kp._safe(v) for v in kp.VARIANTS])
@pytest.mark.parametrize("chunk", [16, 32])
def test_causality_at_every_position_split(chunk, variant):
    """Outputs before p ignore every input (q, k, v, g, beta) at p and later, bit for bit, for
    every p of two chunks, on both anchors of the split path (solve_block 16)."""
    _check_causality(chunk, variant, seed=chunk)


@pytest.mark.parametrize("variant", [kp._safe(v) for v in ("block", "safe_huge")])
def test_causality_at_every_position_fused(variant):
    _check_causality(32, variant, fused=True, seed=100)


@pytest.mark.parametrize("name", kp.INPUTS)
@pytest.mark.parametrize("anchor", ["block", kp._safe("safe")])
def test_causality_per_input(anchor, name):
    """Each input alone, perturbed from every p: chunk 32, solve_block 16."""
    _check_causality(32, anchor, names=(name,), seed=200 + kp.INPUTS.index(name))


# --- 2: non-finite containment -----------------------------------------------------------------


@NON_FINITE_EXPECTED
@pytest.mark.parametrize("name,kind,chunk", kp.POISONS)
def test_non_finite_input_cuts_at_its_position(name, kind, chunk):
    """NaN or +inf in k, v, g or beta at p, for every p of two chunks (the gate, one per token,
    is the poisoned value itself): outputs before p bitwise unchanged, every output from p on
    NaN, and a NaN final state."""
    T = 2 * chunk
    base = make(1, T, seed=300)
    kw = dict(chunk=chunk, output_final_state=True)
    ref, _ = run(base, **kw, initial_state=kp.h0(1))
    p = torch.arange(T)
    o, ht = run(kp._poisoned(base, name, float(kind), p, seed=301), **kw,
                initial_state=kp.h0(T))  # fmt: skip
    for b, pb in enumerate(p.tolist()):
        assert_equal(o[b, :pb], ref[0, :pb], f"{name}={kind} at p={pb}: o[:p]")
        assert o[b, pb:].isnan().all(), f"{name}={kind} at p={pb}: a finite output from p on"
        assert ht[b].isnan().all(), f"{name}={kind} at p={pb}: final state not all NaN"


@NON_FINITE_EXPECTED
def test_nan_query_reaches_only_its_own_row():
    T = 64
    base = make(1, T, seed=310)
    kw = dict(chunk=32, output_final_state=True)
    ref, ref_ht = run(base, **kw, initial_state=kp.h0(1))
    p = torch.arange(T)
    o, ht = run(kp._poisoned(base, "q", float("nan"), p, seed=311), **kw, initial_state=kp.h0(T))
    for b, pb in enumerate(p.tolist()):
        assert o[b, pb].isnan().all(), f"q=nan at p={pb}: its own row not NaN"
        keep = torch.arange(T) != pb
        assert_equal(o[b, keep], ref[0, keep], f"q=nan at p={pb}: other rows")
        assert_equal(ht[b], ref_ht[0], f"q=nan at p={pb}: final state")


# --- 3: -inf resets and huge gates are valid, exact ---------------------------------------------


SHAPES3 = [(16, 16), (32, 16), (32, 32), (64, 16)]  # (chunk, solve_block)


@NON_FINITE_EXPECTED
@pytest.mark.parametrize("output", ["o", "final state"])
@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
@pytest.mark.parametrize("chunk,solve_block", SHAPES3)
def test_hard_resets_and_huge_gates_match_both_oracles(chunk, solve_block, fused, output):
    """g = -inf (whole-token resets at a chunk's last and first rows, at a sub-block start and
    inside one) and single gates of -1e8 and -1e5: safe anchor, finite, within 1e-5 of both
    oracles."""
    x = scalar(kp._extreme_gates(chunk, seed=320 + chunk + solve_block))
    g = x["g"][0, :, 0]
    assert (g == float("-inf")).sum() == 4 and (g == -1e8).sum() == 2 and (g == -1e5).sum() == 1
    s0 = kp.h0(1)
    o, ht = run(x, chunk=chunk, solve_block=solve_block, fused=fused, initial_state=s0,
                output_final_state=True)  # fmt: skip
    check_oracles(x, o, ht, chunk=chunk, only=output, initial_state=s0)


@NON_FINITE_EXPECTED
def test_the_final_state_after_two_late_resets():
    """The minimal case of the late-reset defect (module docstring), through the public entry: T = 16, gates -3.3,
    resets at tokens 11 and 14. The final state is beta_14, beta_15's two updates alone."""
    T = 16
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, T, 1, K, generator=gen)
    x = dict(q=q, k=k / k.norm(dim=-1, keepdim=True), v=v, g=torch.full((1, T, 1), -3.3),
             beta=torch.full((1, T, 1), 0.5))  # fmt: skip
    x["g"][0, [11, 14]] = float("-inf")
    o, ht = gdn_prefill(**x, output_final_state=True)
    check_oracles(x, o, ht)


@NON_FINITE_EXPECTED
@pytest.mark.parametrize("huge", [1e8, float("inf"), float("-inf")])
@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_softplus_of_a_huge_raw_gate_matches_the_oracles(fused, huge):
    """gate_activation='softplus' with A_log and dt_bias [HV], raw gates of 1e8 (a decay of
    about -1e8 nats), +inf (a reset) or -inf (a decay of -0.0) at a few tokens: finite, the
    oracles' output."""
    T = 64
    x = make(1, T, seed=330)
    gen = torch.Generator().manual_seed(331)
    raw = torch.randn(x["g"].shape, generator=gen)
    raw[0, [7, 31, 40]] = huge
    A_log, dt_bias = 0.5 * torch.randn(1, generator=gen), torch.randn(1, generator=gen)
    s0 = kp.h0(1)
    o, ht = run({**x, "g": raw}, chunk=32, fused=fused, initial_state=s0,
                output_final_state=True, gate_activation="softplus", A_log=A_log,
                dt_bias=dt_bias)  # fmt: skip
    g = torch.from_numpy(gate_softplus(raw[..., None], A_log, dt_bias))[..., 0]  # K = 1
    assert g.min() < -1e7 if huge > 0 else g.max() <= 0
    check_oracles({**x, "g": g}, o, ht, chunk=32, initial_state=s0)


@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
@pytest.mark.parametrize("chunk", [32, 64])
def test_small_gates_after_huge_ones_are_exact(chunk, fused):
    """The first half of every chunk at -1e4 per token (each flushed to 2^-127), the second at
    -1e-3 to -1e-2: a chunk's prefix sum of gates reaches about -88 * C / 2 nats, whose fp32
    spacing is coarser than the small gates: exp(G_i - G_j) from two prefix sums puts o 4.6e-5
    off at chunk 32 (measured: a mutation of the kernels' decay factor). Each exponent must be
    a direct sum of its own gates: within 1e-5 of both oracles."""
    T = 2 * chunk
    x = make(1, T, seed=500 + chunk)
    row = torch.arange(T) % chunk
    small = -1e-3 - 9e-3 * torch.rand(1, T, 1, generator=torch.Generator().manual_seed(501))
    x["g"] = torch.where((row < chunk // 2)[None, :, None], -1e4, small)
    s0 = kp.h0(1)
    o, ht = run(x, chunk=chunk, fused=fused, initial_state=s0, output_final_state=True)
    check_oracles(x, o, ht, chunk=chunk, initial_state=s0)


@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
@pytest.mark.parametrize("chunk", [32, 64])
def test_l2_normed_rows_of_any_scale_give_the_same_outputs(chunk, fused):
    """With the L2 norm in the kernel, q and k rows scaled by 10^s, s uniform in [0, 17] per row
    (norms up to ~1e18, squares near fp32's largest), give the unscaled call's outputs within
    1e-5: the kernels multiply the rows as given and scale after the products, which must not
    overflow where the norms are finite (|k_i . k_j| <= |k_i| |k_j|), nor lose precision."""
    T = 2 * chunk
    x = make(1, T, seed=520 + chunk)
    gen = torch.Generator().manual_seed(521)
    scaled = dict(x)
    for name in ("q", "k"):
        s = 10.0 ** (17.0 * torch.rand(*x[name].shape[:-1], 1, generator=gen))
        scaled[name] = (x[name] * s).contiguous()
    assert scaled["k"].abs().amax() > 1e16
    kw = dict(chunk=chunk, fused=fused, initial_state=kp.h0(1), output_final_state=True,
              use_qk_l2norm=True)  # fmt: skip
    o, ht = run(x, **kw)
    so, sht = run(scaled, **kw)
    assert torch.isfinite(so).all() and torch.isfinite(sht).all()
    assert relative_rms(so, o) <= TOL, relative_rms(so, o)
    assert relative_rms(sht, ht) <= TOL, relative_rms(sht, ht)


# --- 4: split == fused, bit for bit --------------------------------------------------------------


def _gate_params(HV, seed):
    gen = torch.Generator().manual_seed(seed)
    return 0.5 * torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)


def _pair_case(name):
    """(inputs, pinned spec, options) of a split == fused case: T = 100, H = 1, HV = 2."""
    x = scalar(kp._inputs(1, 100, 1, 2, seed=40))
    h0, pin = kp._states(1, 2, seed=41), dict(chunk=16)
    kw = dict(initial_state=h0, output_final_state=True)
    if name == "states":
        kw |= dict(output_chunk_states=True)
    elif name == "varlen":
        kw |= dict(cu_seqlens=torch.tensor([0, 30, 30, 71, 100]), output_chunk_states=True,
                   initial_state=kp._states(4, 2, seed=42))  # fmt: skip
        pin = dict(chunk=32)
    elif name == "block":
        x["g"] = x["g"] * 0.5  # [-2.5, 0]: solve_block 32's bound
        kw |= dict(gate_lower_bound=-2.5)
        pin = dict(chunk=64, solve_block=32, anchor="block")
    else:  # softplus with resets (raw +inf) and huge decays, L2 norm, beta logits, vk
        raw = torch.randn(x["g"].shape, generator=torch.Generator().manual_seed(43))
        raw[0, [5, 64], 0], raw[0, [20, 90], 1] = float("inf"), 1e8
        A_log, dt_bias = _gate_params(2, seed=44)
        x |= dict(g=raw, beta=4 * x["beta"] - 2, k=3 * x["k"])
        kw |= dict(gate_activation="softplus", A_log=A_log, dt_bias=dt_bias, use_qk_l2norm=True,
                   use_beta_sigmoid=True, state_layout="vk",
                   initial_state=h0.transpose(-1, -2).contiguous())  # fmt: skip
        pin = dict(chunk=64)
    return x, pin, kw


@pytest.mark.parametrize(
    "name", ["states", "varlen", "block", pytest.param("softplus", marks=NON_FINITE_EXPECTED)]
)
def test_split_equals_fused_bitwise(name):
    x, pin, kw = _pair_case(name)
    split = run(x, **pin, **kw)
    fused = run(x, **pin, **kw, fused=True)
    names = ("o", "final state", "chunk states")[: 3 if kw.get("output_chunk_states") else 2]
    for what, a, b in zip(names, split, fused, strict=True):
        assert torch.isfinite(a).all(), what
        assert_equal(a, b, f"{name}: {what}")


# --- 5: varlen, grouped value heads, padded head dims, decode -------------------------------------


@NON_FINITE_EXPECTED
@pytest.mark.parametrize("seed", [2, 3])
def test_varlen_equals_each_sequence_alone(seed):
    """Packed sequences of random lengths (one empty) equal each sequence run alone, bit for bit,
    on the split and the fused path; the empty one keeps its initial state."""
    kp.check_varlen_alone(run, seed, scalar)


@NON_FINITE_EXPECTED
@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_grouped_value_heads(fused):
    """H = 1, HV = 2 (both value heads read qk head 0), a reset in one head only: both oracles,
    and each value head bit for bit its own HV = 1 run."""
    T, chunk = 70, 32
    x = scalar(kp._inputs(2, T, 1, 2, seed=50))
    x["g"][0, 20, 1] = float("-inf")
    x["g"][1, 45, 0] = -1e5
    s0 = kp._states(2, 2, seed=51)
    kw = dict(chunk=chunk, fused=fused, output_final_state=True)
    o, ht = run(x, **kw, initial_state=s0)
    check_oracles(x, o, ht, chunk=chunk, initial_state=s0)
    for hv in range(2):
        head = dict(x, v=x["v"][:, :, hv : hv + 1], g=x["g"][:, :, hv : hv + 1],
                    beta=x["beta"][:, :, hv : hv + 1])  # fmt: skip
        head = {n: t.contiguous() for n, t in head.items()}
        oh, hh = run(head, **kw, initial_state=s0[:, hv : hv + 1].contiguous())
        assert_equal(o[:, :, hv : hv + 1], oh, f"value head {hv}: o")
        assert_equal(ht[:, hv : hv + 1], hh, f"value head {hv}: final state")


@NON_FINITE_EXPECTED
@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_padded_head_dims_match_the_oracles_and_the_hand_padded_run(fused):
    """K = V = 48 runs zero-padded to 64: within 1e-5 of both oracles (with a reset), bit for bit
    the run on inputs padded by hand, whose padded outputs, state rows and columns stay exactly
    zero (the scalar gate decays the padded state rows as every other: they must start and stay
    zero, not pick up a reset's NaN or a stray product)."""
    Kr, Kp, T, chunk = 48, 64, 80, 32
    gen = torch.Generator().manual_seed(60)
    q, k = torch.randn(2, 1, T, 1, Kr, generator=gen)
    x = dict(q=q, k=k / k.norm(dim=-1, keepdim=True), v=torch.randn(1, T, 1, Kr, generator=gen),
             g=-5 * torch.rand(1, T, 1, generator=gen), beta=torch.rand(1, T, 1, generator=gen))  # fmt: skip
    x["g"][0, 33] = float("-inf")
    s0 = 0.5 * torch.randn(1, 1, Kr, Kr, generator=gen)
    kw = dict(chunk=chunk, fused=fused, output_final_state=True)
    o, ht = run(x, **kw, initial_state=s0)
    check_oracles(x, o, ht, chunk=chunk, initial_state=s0)

    def pad(t, dims=1):  # zeros past the real head dims (the last ``dims`` of t)
        out = t.new_zeros(*t.shape[:-dims], *(Kp,) * dims)
        out[tuple(slice(0, n) for n in t.shape)] = t
        return out

    y = {**x, **{n: pad(x[n]) for n in ("q", "k", "v")}}
    po, pht = run(y, **kw, initial_state=pad(s0, 2), scale=Kr**-0.5)
    assert_equal(o, po[..., :Kr].contiguous(), "o")
    assert_equal(ht, pht[..., :Kr, :Kr].contiguous(), "final state")
    assert not po[..., Kr:].any(), "padded output columns"
    assert not pht[..., Kr:, :].any() and not pht[..., :, Kr:].any(), "padded state rows, cols"


def _decode(x, **kw):
    return gdn_prefill(**x, algorithm="gdn.recurrent", **kw)


@NON_FINITE_EXPECTED
def test_decode_matches_the_oracle_with_resets_and_huge_gates():
    """gdn.recurrent, B = 2, T = 5, H = 1, HV = 2: a -inf reset, -1e30 and -1e5 gates."""
    x = scalar(kp._inputs(2, 5, 1, 2, seed=70))
    x["g"][0, 1, 0] = float("-inf")
    x["g"][0, 3] = float("-inf")
    x["g"][1, 2, 1] = -1e30
    x["g"][1, 4, 0] = -1e5
    s0 = kp._states(2, 2, seed=71)
    o, ht = _decode(x, initial_state=s0, output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    so, sh = token_serial_oracle(**per_channel(x), initial_state=s0.double())
    assert_close(o, (so,), TOL, "o")
    assert_close(ht, (sh,), TOL, "final state")


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_decode_on_a_state_pool_updates_its_slots_in_place(layout):
    """Four packed sequences (one empty) on slots [5, -1, 0, 2] of a pool of 7: the -1 sequence
    starts from zeros and writes nothing; the slots written hold the oracle's final states; an
    empty sequence writes its slot back unchanged; every other slot bit for bit untouched."""
    x = scalar(kp._inputs(1, 5, 1, 2, seed=72))
    x["g"][0, 3, 1] = float("-inf")
    cu = torch.tensor([0, 1, 3, 3, 5])
    pool = kp._states(7, 2, seed=73)
    if layout == "vk":
        pool = pool.transpose(-1, -2).contiguous()
    before = pool.clone()
    o, ret = _decode(x, initial_state=pool, initial_state_indices=torch.tensor([5, -1, 0, 2]),
                     cu_seqlens=cu, state_layout=layout)  # fmt: skip
    assert ret is pool, "the pool is returned, updated in place"
    starts = torch.stack([before[5], torch.zeros_like(before[0]), before[0], before[2]])
    so, sh = token_serial_oracle(**per_channel(x), initial_state=starts.double(), cu_seqlens=cu,
                                 state_layout=layout)  # fmt: skip
    assert_close(o, (so,), TOL, "o")
    for n, slot in ((0, 5), (3, 2)):
        assert_close(pool[slot], (sh[n],), TOL, f"slot {slot}")
    for slot in (0, 1, 3, 4, 6):  # 0: the empty sequence's; the -1 sequence wrote nowhere
        assert_equal(pool[slot], before[slot], f"slot {slot}")


# --- 6: GDN against KDA with the gate broadcast over K ------------------------------------------

KDA_CASES = {  # name: (pinned spec, or None: the public entries' own choice; options)
    "safe_c32": (dict(chunk=32), {}),
    "block_c16": (dict(chunk=16, anchor="block"), dict(gate_lower_bound=-5.0)),
    "fused_varlen_resets": (dict(chunk=32, fused=True), dict(cu_seqlens=[0, 41, 41, 100])),
    "safe_c64_softplus": (dict(chunk=64), dict(gate_activation="softplus")),
    "public": (None, dict(gate_activation="softplus")),
}


@NON_FINITE_EXPECTED
@pytest.mark.parametrize("name", list(KDA_CASES))
def test_gdn_matches_kda_with_the_gate_broadcast(name):
    """``kda_prefill`` given ``g[..., None].expand(..., K)`` (and dt_bias expanded to [HV, K])
    computes GDN's function: T = 100, H = 1, HV = 2, initial and final states; resets (-inf, or
    a raw +inf under softplus) and -1e4 gates in the cases that take them."""
    pin, opts = KDA_CASES[name]
    x = scalar(kp._inputs(1, 100, 1, 2, seed=80))
    n = 1
    kw = dict(output_final_state=True, **opts)
    if "cu_seqlens" in kw:
        kw["cu_seqlens"] = torch.tensor(kw["cu_seqlens"])
        n = kw["cu_seqlens"].numel() - 1
    kw["initial_state"] = kp._states(n, 2, seed=81)
    kda = {}
    if kw.get("gate_activation") == "softplus":
        x["g"] = torch.randn(x["g"].shape, generator=torch.Generator().manual_seed(82))
        x["g"][0, [9, 50], 1] = float("inf")
        kw["A_log"], kw["dt_bias"] = _gate_params(2, seed=83)
        kda["dt_bias"] = kw["dt_bias"][:, None].expand(2, K)
    elif "gate_lower_bound" not in kw:
        x["g"][0, [17, 60], 0] = float("-inf")
        x["g"][0, [33, 34], 1] = kp.HUGE
    xk = {**x, "g": x["g"][..., None].expand(*x["g"].shape, K)}
    if pin is None:
        o, ht = gdn_prefill(**x, **kw)
        ko, kht = api.kda_prefill(**xk, **{**kw, **kda})
    else:
        o, ht = run(x, **pin, **kw)
        ko, kht = kp.run(xk, **{"solve_block": 16, "anchor": "safe", **pin}, **{**kw, **kda})
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert relative_rms(o, ko) <= TOL, relative_rms(o, ko)
    assert relative_rms(ht, kht) <= TOL, relative_rms(ht, kht)


# --- 7: a broken bound on the block anchor is NaN, never silently wrong -------------------------


@pytest.mark.parametrize("violation", [-200.0, -60.0])
def test_block_anchor_past_its_bound_is_exact_or_nan(violation):
    """anchor='block', promised bound -5, the gate at p set to ``violation`` (every p of two
    chunks): rows before p bitwise unchanged; every row is within 1e-5 of the float64 oracle
    (relative to the sequence's RMS row norm) or all NaN, and the final state likewise. -200
    leaves the anchor's span at p itself, so rows from p on are NaN; -60 leaves it or not by
    the gates before it in its sub-block, and both happen."""
    chunk, lb = 32, kp.BLOCK_BOUND[16]
    T = 2 * chunk
    base = make(1, T, lb=lb, seed=400)
    kw = dict(chunk=chunk, anchor="block", gate_lower_bound=lb, output_final_state=True)
    ref, _ = run(base, **kw, initial_state=kp.h0(1))
    p = torch.arange(T)
    y = kp._poisoned(base, "g", violation, p, seed=401)
    o, ht = run(y, **kw, initial_state=kp.h0(T))
    ro, rh = token_serial_oracle(**per_channel(y), initial_state=kp.h0(T).double())
    ro, rh = torch.from_numpy(ro), torch.from_numpy(rh)
    n_nan = n_late_finite = 0
    for b, pb in enumerate(p.tolist()):
        assert_equal(o[b, :pb], ref[0, :pb], f"g={violation} at p={pb}: o[:p]")
        scale = ro[b].norm(dim=(-2, -1)).pow(2).mean().sqrt()  # RMS row norm
        nan = o[b].isnan().flatten(1).all(1)
        assert not nan[:pb].any(), f"g={violation} at p={pb}: a row before p is NaN"
        assert torch.isfinite(o[b, ~nan]).all(), f"g={violation} at p={pb}: a row partly NaN"
        err = (o[b, ~nan].double() - ro[b, ~nan]).flatten(1).norm(dim=1) / scale
        assert (err <= TOL).all(), f"g={violation} at p={pb}: a finite row off by {err.max():.3g}"
        n_nan += int(nan.sum())
        n_late_finite += int((~nan[pb:]).sum())
        if violation == -200.0:
            assert nan[pb:].all(), f"g=-200 at p={pb}: a finite row from p on"
        if not ht[b].isnan().all():
            assert relative_rms(ht[b], rh[b]) <= TOL, f"g={violation} at p={pb}: final state"
    assert n_nan > 0  # the violation was caught
    if violation == -60.0:
        assert n_late_finite > 0  # and, where the span still fits, served exactly
