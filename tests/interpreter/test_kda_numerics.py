"""KDA kernel numerics under the Triton interpreter (CPU tensors, ``TRITON_INTERPRET=1``).

Every case runs the real kernels (prep + scan, or fused) and checks them against the float64
oracles of ``kreg.families.kda.oracles`` (token-serial and chunkwise), or against another run of
the kernels bit for bit where the design promises bitwise equality (split == fused, causality,
varlen == per sequence, state layouts). Shapes are small: the interpreter runs on a 2-core CPU.
The interpreter computes bf16 ``tl.dot`` wrongly, so inputs are fp16 or fp32 here.
"""

from __future__ import annotations

import inspect

import attrs
import numpy as np
import pytest
import torch

from kreg.dispatch import select
from kreg.families.kda import api
from kreg.families.kda import specs as kspecs
from kreg.families.kda.oracles import (
    gate_sigmoid_bound,
    gate_softplus,
    l2norm,
    relative_rms,
    sigmoid,
    tile_oracle,
    token_serial_oracle,
)
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

# The interpreter runs the kernels in numpy, which warns where a lane overflows or turns NaN
# (the GPU is silent). Only the tests that mean it filter these warnings, so a new one stands
# out: non-finite inputs, -inf dt_bias on padded channels (sigmoid(-inf) = 0 through exp(inf)),
# and the safe anchor's branch it computes and discards where a block's decay passes fp32's
# exp range (huge gates, or long blocks of ordinary ones).
NON_FINITE_EXPECTED = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning:triton.runtime.interpreter",
    "ignore:invalid value encountered:RuntimeWarning:triton.runtime.interpreter",
)
FP16, FP32 = torch.float16, torch.float32
TOL = {FP16: 2e-3, FP32: 1e-5}
TARGET = "sm90"  # CPU runs select with sm90's rules
_PREFILL_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(api.kda_prefill).parameters.items()
    if p.default is not inspect.Parameter.empty
}
# the keywords a call binds (the gate kind, keyword-only, is the entry's: derived from g here)
_PREPARE_ARGS = tuple(n for n, p in inspect.signature(api._prepare).parameters.items()
                      if p.kind is not p.KEYWORD_ONLY)  # fmt: skip


def make(B=1, T=100, H=1, HV=None, K=32, V=32, dtype=FP16, lb=-5.0, seed=0, skew=1.0):
    """Random inputs; unit-norm keys, gates in [lb, 0] (``skew`` < 1 pushes them toward lb)."""
    HV = HV or H
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = lb * torch.rand(B, T, HV, K, generator=gen) ** skew
    beta = torch.rand(B, T, HV, generator=gen)
    return dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g.to(dtype), beta=beta.to(dtype))


def state(n, HV, K, V, seed=1, dtype=FP32):
    gen = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(n, HV, K, V, generator=gen)).to(dtype)


def run(
    x: dict,
    *,
    chunk=None,
    solve_block=16,
    block_v=None,
    fused=False,
    segment_chunks=0,
    looped=False,
    host_offsets=None,
    **kw,
):
    """``kda_prefill``, or (with ``chunk``) the same call with its spec pinned to that chunk;
    ``host_offsets`` replaces the call's host copy of ``cu_seqlens`` (what a graph captured on
    other offsets would have planned with).

    Pinned runs also serve K != V (see ``test_unequal_head_dims_through_the_public_entry``):
    the spec picked for the problem gets the
    problem's head_dim_v and is validated against the real problem before launching.
    """
    if chunk is None:
        if fused:
            kw.setdefault("algorithm", "kda.fused")
        return api.kda_prefill(**x, **kw)
    opts = {**_PREFILL_DEFAULTS, **x, **kw}
    problem, call = api._prepare(**{name: opts[name] for name in _PREPARE_ARGS})
    if host_offsets is not None:
        longest = int((host_offsets[1:] - host_offsets[:-1]).max())
        call = attrs.evolve(call, cu_seqlens_host=host_offsets, longest=longest)
    V = problem.head_dim_v
    square = attrs.evolve(problem, head_dim_v=problem.head_dim_k)
    sel = select(square, TARGET, algorithm="kda.fused" if fused else "kda.split")
    tile = attrs.evolve(sel.spec.tile, chunk=chunk, solve_block=solve_block, head_dim_v=V,
                        looped=looped)  # fmt: skip
    if fused:
        block_v = V
    # one pipeline stage: stages only schedule the loads, and the selected depth may not fit
    # the pinned chunk's shared memory
    scan = attrs.evolve(sel.spec.scan, chunk=chunk, head_dim_v=V, segment_chunks=segment_chunks,
                        block_v=block_v or min(sel.spec.scan.block_v, V), num_stages=1)  # fmt: skip
    spec = attrs.evolve(sel.spec, tile=tile, scan=scan)
    verdict = sel.candidate.is_valid(spec, sel.target, problem)
    assert verdict.ok, verdict.reasons
    return api.run_selection(attrs.evolve(sel, spec=spec), call, problem)


def run_bitwise_pair(x: dict, **kw):
    """The split path on the spec that pairs bit for bit with the dispatcher's fused spec
    (``specs.bitwise_pair``: the same tiles, the scan at the fused kernel's V width and warps).
    The dispatcher's own split choice may tile differently (another chunk or warp count), and
    then agrees with fused within rounding only."""
    from kreg.families.kda.specs import bitwise_pair

    opts = {**_PREFILL_DEFAULTS, **x, **kw}
    problem, call = api._prepare(**{name: opts[name] for name in _PREPARE_ARGS})
    fused = select(problem, TARGET, algorithm="kda.fused", allow_opt_in=True)
    split = select(problem, TARGET, algorithm="kda.split")
    return api.run_selection(attrs.evolve(split, spec=bitwise_pair(fused.spec)), call, problem)


def oracles(x: dict, chunk=64, **kw):
    """(token-serial, chunkwise) float64 results for the same (already activated) inputs."""
    return token_serial_oracle(**x, **kw), tile_oracle(**x, chunk=chunk, **kw)


def assert_close(got, refs, tol, what=""):
    for ref in refs:
        err = relative_rms(got, ref)
        assert err <= tol, f"{what}: relative RMS {err:.3g} > {tol:g}"


def check_vs_oracles(x, o, ht, chunk=64, tol=None, **kw):
    tol = tol or TOL[x["q"].dtype]
    (so, sh), (to, th) = oracles(x, chunk=chunk, **kw)
    assert_close(o, (so, to), tol, "o")
    assert_close(ht, (sh, th), tol, "final state")


def assert_equal(a, b, what=""):
    assert a.shape == b.shape, what
    if not torch.equal(a, b):
        diff = (a.double() - b.double()).abs().max().item()
        raise AssertionError(f"{what}: not bitwise equal (max abs diff {diff:g})")


# --- against both oracles ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "chunk,K,V,dtype,B,H",
    [
        (16, 32, 32, FP16, 1, 2),
        (32, 64, 32, FP16, 2, 1),
        (64, 32, 64, FP16, 1, 1),
        (16, 64, 64, FP32, 1, 1),
        (32, 32, 32, FP32, 2, 1),
        (64, 32, 32, FP32, 1, 2),
        (64, 64, 64, FP16, 1, 2),
    ],
)
def test_kernels_match_both_oracles(chunk, K, V, dtype, B, H):
    """T = 100 is not a multiple of any chunk; with and without an initial state."""
    x = make(B=B, T=100, H=H, K=K, V=V, dtype=dtype, seed=chunk + K)
    o, ht = run(x, chunk=chunk, output_final_state=True)
    check_vs_oracles(x, o, ht, chunk=chunk)
    h0 = state(B, H, K, V)
    o, ht = run(x, chunk=chunk, initial_state=h0, output_final_state=True)
    check_vs_oracles(x, o, ht, chunk=chunk, initial_state=h0)


def test_dispatcher_default_matches_oracles():
    x = make(T=77, K=64, V=64, H=2)
    o, ht = api.kda_prefill(**x, output_final_state=True)
    check_vs_oracles(x, o, ht)
    o2, ht2 = api.kda_prefill(**x)
    assert ht2 is None
    assert_equal(o, o2, "o without the final state")


@pytest.mark.parametrize("lb", [-0.1, -1.0, -5.0])
@pytest.mark.parametrize("chunk", [16, 64])
def test_gates_down_to_the_lower_bound(lb, chunk):
    """solve_block 16 at the reference bound -5: the anchored span reaches 80 nats."""
    x = make(T=96, K=32, V=32, lb=lb, skew=0.25, seed=3)
    o, ht = run(x, chunk=chunk, solve_block=16, output_final_state=True, gate_lower_bound=lb)
    check_vs_oracles(x, o, ht, chunk=chunk)
    # every gate at the bound itself
    x["g"] = torch.full_like(x["g"], lb)
    o, ht = run(x, chunk=chunk, solve_block=16, output_final_state=True, gate_lower_bound=lb)
    check_vs_oracles(x, o, ht, chunk=chunk)


def test_solve_block_32_where_the_numeric_rule_allows():
    x = make(T=100, K=32, V=32, lb=-2.5, skew=0.25, seed=4)  # 32 * 2.5 = 80 nats
    o, ht = run(x, chunk=64, solve_block=32, output_final_state=True, gate_lower_bound=-2.5)
    check_vs_oracles(x, o, ht)


def test_numeric_rule_rejects_solve_block_32_at_minus_5():
    """The block anchor pinned to solve_block 32 under a bound of -5 spans 160 nats: refused
    (specialising such a problem takes the safe anchor instead, tests/test_kda_specs.py)."""
    x = make(T=64)
    with pytest.raises(AssertionError, match="160 nats"):
        run(x, chunk=64, solve_block=32, gate_lower_bound=-5.0)


# --- split and fused, bit for bit ----------------------------------------------------------------

_OPTION_SETS = {
    "plain": dict(),
    "states": dict(initial_state=True, output_final_state=True, output_chunk_states=True),
    "vk_activations": dict(initial_state=True, output_final_state=True, state_layout="vk",
                           gate_activation="sigmoid_bound", gate_lower_bound=-5.0,
                           use_qk_l2norm=True, use_beta_sigmoid=True),
    "varlen": dict(cu_seqlens=[0, 30, 30, 71, 100], output_final_state=True,
                   output_chunk_states=True, initial_state=True),
}  # fmt: skip


def _options(name, K, V, HV):
    kw = dict(_OPTION_SETS[name])
    n = 1
    if "cu_seqlens" in kw:
        kw["cu_seqlens"] = torch.tensor(kw["cu_seqlens"])
        n = kw["cu_seqlens"].numel() - 1
    if kw.pop("initial_state", False):
        h0 = state(n, HV, K, V)
        kw["initial_state"] = h0.transpose(-1, -2).contiguous() if "state_layout" in kw else h0
    if kw.get("gate_activation") == "sigmoid_bound":
        gen = torch.Generator().manual_seed(7)
        kw["A_log"] = torch.randn(HV, generator=gen) * 0.5
        kw["dt_bias"] = torch.randn(HV * K, generator=gen) * 0.5
    return kw


_OUTPUTS = ("o", "final state", "chunk states")


@pytest.mark.parametrize("name", list(_OPTION_SETS))
@pytest.mark.parametrize("chunk", [16, 64])
def test_split_equals_fused_bitwise(name, chunk):
    x = make(T=100, H=1, HV=2, K=32, V=32, seed=5)
    kw = _options(name, 32, 32, 2)
    split = run(x, chunk=chunk, block_v=32, **kw)
    fused = run(x, chunk=chunk, fused=True, **kw)
    assert len(split) == len(fused)
    for what, a, b in zip(_OUTPUTS, split, fused, strict=False):
        if a is None:
            assert b is None
        else:
            assert_equal(a, b, what)


def test_split_with_narrow_v_blocks_matches_fused():
    """block_v < V splits the scan's products by columns. Exact in the algebra (V columns are
    independent) and bitwise on a GPU, but not under the interpreter: NumPy's matmul of a
    column slice does not round like the same columns of the whole product."""
    x = make(T=100, H=1, HV=2, K=32, V=32, seed=5)
    kw = _options("varlen", 32, 32, 2)
    split = run(x, chunk=64, block_v=16, **kw)
    fused = run(x, chunk=64, fused=True, **kw)
    for what, a, b in zip(_OUTPUTS, split, fused, strict=True):
        assert_close(a, (b,), 1e-5, what)


def test_split_equals_fused_through_the_public_entry():
    """The fused call through the public entry equals the split path on its bitwise pair."""
    x = make(T=100, K=32, V=32, H=2, seed=6)
    h0 = state(1, 2, 32, 32)
    a = run_bitwise_pair(x, initial_state=h0, output_final_state=True)
    b = api.kda_prefill(**x, initial_state=h0, output_final_state=True, algorithm="kda.fused")
    for what, u, w in zip(("o", "final state"), a, b, strict=True):
        assert_equal(u, w, what)


# --- causality, bit for bit --------------------------------------------------------------------


@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
@pytest.mark.parametrize("t", [20, 31, 32, 47])
def test_causality_bitwise(t, fused):
    """Outputs at positions <= t ignore every input at positions > t, bit for bit.

    chunk 32, solve_block 16: t = 20 is inside a sub-block, 31 ends a chunk, 32 starts one and
    47 ends a sub-block inside a chunk.
    """
    x = make(T=64, K=32, V=32, H=1, HV=2, seed=8)
    o = run(x, chunk=32, fused=fused)[0]
    gen = torch.Generator().manual_seed(9)
    y = {}
    for name, val in x.items():
        noise = torch.rand(val.shape, generator=gen).to(val.dtype)
        if name == "g":
            noise = -5 * noise  # still a valid gate
        elif name != "beta":
            noise = 3 * noise - 1
        late = val.clone()
        late[:, t + 1 :] = noise[:, t + 1 :]
        y[name] = late
    o2 = run(y, chunk=32, fused=fused)[0]
    assert not torch.equal(o[:, t + 1 :], o2[:, t + 1 :])  # the perturbation does something
    assert_equal(o[:, : t + 1], o2[:, : t + 1], f"o[:, :{t + 1}]")


# --- state carried across calls ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [FP16, FP32])
def test_chunked_prefill(dtype):
    """Two calls with the state carried across equal one call (within tolerance)."""
    x = make(T=100, K=32, V=32, H=2, dtype=dtype, seed=10)
    h0 = state(1, 2, 32, 32)
    o, ht = run(x, chunk=32, initial_state=h0, output_final_state=True)
    first = {n: t[:, :40].contiguous() for n, t in x.items()}
    second = {n: t[:, 40:].contiguous() for n, t in x.items()}
    o1, h1 = run(first, chunk=32, initial_state=h0, output_final_state=True)
    o2, h2 = run(second, chunk=32, initial_state=h1, output_final_state=True)
    tol = TOL[dtype]
    assert_close(torch.cat([o1, o2], dim=1), (o,), tol, "o")
    assert_close(h2, (ht,), tol, "final state")
    check_vs_oracles(x, torch.cat([o1, o2], dim=1), h2, chunk=32, initial_state=h0)


def test_gqa_value_heads_share_qk_heads():
    x = make(T=70, H=1, HV=2, K=32, V=64, seed=11)
    h0 = state(1, 2, 32, 64)
    o, ht = run(x, chunk=16, initial_state=h0, output_final_state=True)
    check_vs_oracles(x, o, ht, chunk=16, initial_state=h0)
    y = make(T=40, B=2, H=2, HV=4, K=64, V=32, dtype=FP32, seed=12)
    o, ht = run(y, chunk=32, output_final_state=True)
    check_vs_oracles(y, o, ht, chunk=32)


# --- varlen ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_varlen_equals_each_sequence_alone(fused):
    """A zero-length sequence passes its initial state through; others match running alone."""
    cu = [0, 37, 37, 100, 116]
    x = make(T=116, H=1, HV=2, K=32, V=32, seed=13)
    h0 = state(4, 2, 32, 32)
    cu_t = torch.tensor(cu)
    o, ht, hs = run(x, chunk=32, fused=fused, cu_seqlens=cu_t, initial_state=h0,
                    output_final_state=True, output_chunk_states=True,
                    chunk_states_size=32)  # fmt: skip
    check_vs_oracles(x, o, ht, chunk=32, initial_state=h0, cu_seqlens=cu)
    _, _, ref_hs = tile_oracle(**x, initial_state=h0, cu_seqlens=cu, chunk=32,
                               return_chunk_states=True)  # fmt: skip
    assert hs.shape == ref_hs.shape == (2 + 0 + 2 + 1, 2, 32, 32)
    assert_close(hs, (ref_hs,), TOL[FP16], "chunk states")
    assert_equal(ht[1], h0[1], "zero-length sequence's state")
    for n in range(len(cu) - 1):
        a, b = cu[n], cu[n + 1]
        if a == b:
            continue
        part = {name: t[:, a:b].contiguous() for name, t in x.items()}
        o_n, h_n, hs_n = run(part, chunk=32, fused=fused, initial_state=h0[n : n + 1],
                             output_final_state=True, output_chunk_states=True,
                             chunk_states_size=32)  # fmt: skip
        assert_equal(o[:, a:b], o_n, f"o of sequence {n}")
        assert_equal(ht[n : n + 1], h_n, f"final state of sequence {n}")
        first = sum(-(-(cu[i + 1] - cu[i]) // 32) for i in range(n))
        assert_equal(hs[first : first + hs_n.shape[0]], hs_n, f"chunk states of sequence {n}")


def test_varlen_without_initial_state_and_host_offsets():
    cu = torch.tensor([0, 0, 50, 50, 64])
    x = make(T=64, K=32, V=32, seed=14)
    o, ht = api.kda_prefill(**x, cu_seqlens=cu, cu_seqlens_cpu=cu.clone(), output_final_state=True)
    check_vs_oracles(x, o, ht, cu_seqlens=cu)
    assert torch.count_nonzero(ht[0]) == 0 and torch.count_nonzero(ht[2]) == 0


# --- states: layouts, dtypes, chunk states -------------------------------------------------------


@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_state_layout_vk_is_the_transposed_kv(fused):
    x = make(T=50, K=32, V=64, H=2, seed=15)
    h0 = state(1, 2, 32, 64)
    o, ht, hs = run(x, chunk=16, fused=fused, initial_state=h0, output_final_state=True,
                    output_chunk_states=True)  # fmt: skip
    ov, htv, hsv = run(x, chunk=16, fused=fused, initial_state=h0.transpose(-1, -2).contiguous(),
                       output_final_state=True, output_chunk_states=True, state_layout="vk")  # fmt: skip
    assert htv.shape == (1, 2, 64, 32)
    assert_equal(o, ov, "o")
    assert_equal(ht.transpose(-1, -2), htv, "final state")
    assert_equal(hs.transpose(-1, -2), hsv, "chunk states")


def test_bf16_initial_state():
    x = make(T=60, K=32, V=32, dtype=FP32, seed=16)
    h0 = state(1, 1, 32, 32, dtype=torch.bfloat16)
    o, ht = run(x, chunk=32, initial_state=h0, output_final_state=True)
    assert ht.dtype == torch.float32
    check_vs_oracles(x, o, ht, chunk=32, initial_state=h0.float())
    o32, ht32 = run(x, chunk=32, initial_state=h0.float(), output_final_state=True)
    assert_equal(o, o32, "bf16 vs its fp32 upcast: o")
    assert_equal(ht, ht32, "bf16 vs its fp32 upcast: final state")


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_chunk_states_match_the_tile_oracle(layout):
    B, T, HV, K, V, C = 2, 70, 2, 32, 64, 32
    x = make(B=B, T=T, H=1, HV=HV, K=K, V=V, dtype=FP32, seed=17)
    h0 = state(B, HV, K, V)
    if layout == "vk":
        h0 = h0.transpose(-1, -2).contiguous()
    o, ht, hs = run(x, chunk=C, initial_state=h0, output_final_state=True,
                    output_chunk_states=True, chunk_states_size=C, state_layout=layout)  # fmt: skip
    _, _, ref = tile_oracle(**x, initial_state=h0, chunk=C, state_layout=layout,
                            return_chunk_states=True)  # fmt: skip
    nt = -(-T // C)
    assert ref.shape[:3] == (B, HV, nt)
    ref = np.swapaxes(ref, 1, 2).reshape(B * nt, HV, *ref.shape[3:])
    assert hs.shape == ref.shape
    assert_close(hs, (ref,), TOL[FP32], "chunk states")
    assert_equal(hs[0], h0[0].float(), "the first chunk starts from the initial state")
    check_vs_oracles(x, o, ht, chunk=C, initial_state=h0, state_layout=layout)


# --- activations inside the kernel -------------------------------------------------------------


def _gate_params(HV, K, seed=18):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(HV, generator=gen) * 0.5, torch.randn(HV * K, generator=gen)


def _activated(x, *, g=None, l2=False, beta_sig=False):
    """The inputs with the activations applied in float64 by the oracle helpers."""
    y = {n: t.double() for n, t in x.items()}
    if g is not None:
        y["g"] = torch.from_numpy(g)
    if l2:
        y["q"] = torch.from_numpy(l2norm(x["q"]))
        y["k"] = torch.from_numpy(l2norm(x["k"]))
    if beta_sig:
        y["beta"] = torch.from_numpy(sigmoid(x["beta"]))
    return y


@pytest.mark.parametrize("dtype", [FP16, FP32])
def test_sigmoid_bound_gate(dtype):
    x = make(T=80, K=32, V=32, H=1, HV=2, dtype=dtype, seed=19)
    x["g"] = torch.randn(x["g"].shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    A_log, dt_bias = _gate_params(2, 32)
    for lb in (-5.0, -1.0):
        o, ht = run(x, chunk=32, gate_activation="sigmoid_bound", A_log=A_log, dt_bias=dt_bias,
                    gate_lower_bound=lb, output_final_state=True)  # fmt: skip
        g = gate_sigmoid_bound(x["g"], A_log, dt_bias, lower_bound=lb)
        check_vs_oracles(_activated(x, g=g), o, ht, chunk=32, tol=TOL[dtype])
    # without A_log and dt_bias: factor 1, no bias
    o, ht = run(x, chunk=32, gate_activation="sigmoid_bound", gate_lower_bound=-5.0,
                output_final_state=True)  # fmt: skip
    g = gate_sigmoid_bound(x["g"], lower_bound=-5.0)
    check_vs_oracles(_activated(x, g=g), o, ht, chunk=32, tol=TOL[dtype])


@pytest.mark.parametrize("dtype", [FP16, FP32])
def test_qk_l2norm_and_beta_sigmoid(dtype):
    x = make(T=70, K=64, V=32, H=2, dtype=dtype, seed=20)
    gen = torch.Generator().manual_seed(2)
    x["k"] = (3 * torch.randn(x["k"].shape, generator=gen)).to(dtype)  # not unit norm
    x["beta"] = (4 * torch.randn(x["beta"].shape, generator=gen)).to(dtype)  # logits
    o, ht = run(x, chunk=16, use_qk_l2norm=True, use_beta_sigmoid=True, output_final_state=True)
    check_vs_oracles(_activated(x, l2=True, beta_sig=True), o, ht, chunk=16, tol=TOL[dtype])


def test_qk_l2norm_epsilon_on_tiny_rows():
    """Rows of norm 1e-3 (squared norm 1e-6, the epsilon's size): the kernel's x / sqrt(sum x^2 +
    1e-6) must match the oracle's to fp32 tolerance; another epsilon moves them by 2x or more."""
    x = make(T=40, K=32, V=32, H=1, dtype=FP32, seed=26)
    gen = torch.Generator().manual_seed(3)
    for name in ("q", "k"):
        r = torch.randn(x[name].shape, generator=gen)
        x[name] = 1e-3 * r / r.norm(dim=-1, keepdim=True)
    o, ht = run(x, chunk=16, use_qk_l2norm=True, output_final_state=True)
    check_vs_oracles(_activated(x, l2=True), o, ht, chunk=16, tol=TOL[FP32])


def test_production_argument_set():
    """sigmoid_bound gate with A_log/dt_bias, qk L2 norm, beta sigmoid, fp32 initial state,
    final state, varlen, through the public entry (dispatcher's spec)."""
    cu = torch.tensor([0, 45, 100])
    x = make(T=100, K=64, V=64, H=1, HV=2, seed=21)
    x["g"] = torch.randn(x["g"].shape, generator=torch.Generator().manual_seed(3)).half()
    x["beta"] = torch.randn(x["beta"].shape, generator=torch.Generator().manual_seed(4)).half()
    A_log, dt_bias = _gate_params(2, 64)
    h0 = state(2, 2, 64, 64)
    kw = dict(gate_activation="sigmoid_bound", gate_lower_bound=-5.0, A_log=A_log,
              dt_bias=dt_bias, use_qk_l2norm=True,
              use_beta_sigmoid=True, initial_state=h0, output_final_state=True, cu_seqlens=cu)  # fmt: skip
    o, ht = api.kda_prefill(**x, **kw)
    g = gate_sigmoid_bound(x["g"], A_log, dt_bias, lower_bound=-5.0)
    ref = _activated(x, g=g, l2=True, beta_sig=True)
    check_vs_oracles(ref, o, ht, tol=TOL[FP16], initial_state=h0, cu_seqlens=cu)
    # the dispatcher's split spec may tile otherwise (chunk, warps, V blocks): oracle-close
    # above; against fused, the bitwise pair (the same tiles, fused's V width) is close to
    # rounding under the interpreter (see test_split_with_narrow_v_blocks_matches_fused)
    o2, ht2 = api.kda_prefill(**x, **kw, algorithm="kda.fused")
    o, ht = run_bitwise_pair(x, **kw)
    assert_close(o2, (o,), 1e-5, "fused o")
    assert_close(ht2, (ht,), 1e-5, "fused final state")


@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_unbounded_softplus_gates_take_the_safe_anchor(fused):
    """Unbounded (softplus) gates: the dispatcher specialises to anchor='safe', and the result
    matches both oracles, with decays far past what a sub-block anchor survives (single steps
    below -10 nats: no sub-block anchor survives them)."""
    x = make(T=70, K=32, V=32, H=1, HV=2, dtype=FP32, seed=24)
    x["g"] = 3 * torch.randn(x["g"].shape, generator=torch.Generator().manual_seed(6))
    A_log, dt_bias = _gate_params(2, 32)
    g = gate_softplus(x["g"], A_log, dt_bias)
    assert g.min() < -10.0  # 16 such steps span 160+ nats: a sub-block anchor overflows
    kw = dict(gate_activation="softplus", gate_lower_bound=None, A_log=A_log, dt_bias=dt_bias,
              output_final_state=True)  # fmt: skip
    if fused:
        kw["algorithm"] = "kda.fused"
    opts = {**_PREFILL_DEFAULTS, **x, **kw}
    problem, _ = api._prepare(**{name: opts[name] for name in _PREPARE_ARGS})
    sel = select(problem, TARGET, algorithm=kw.get("algorithm", "auto"))
    assert sel.spec.tile.anchor == "safe"
    o, ht = api.kda_prefill(**x, **kw)
    check_vs_oracles(_activated(x, g=g), o, ht, chunk=sel.spec.tile.chunk, tol=TOL[FP32])


@NON_FINITE_EXPECTED
def test_hard_resets_on_the_safe_anchor_split_equals_fused():
    """g = -1000 resets (whole tokens and half the channels of another): finite, oracle-exact,
    and split == fused bit for bit on the unbounded path too."""
    x = make(T=90, K=32, V=32, H=1, HV=2, dtype=FP32, seed=25)
    g = -0.5 * torch.rand(x["g"].shape, generator=torch.Generator().manual_seed(7))
    g[:, 17] = -1000.0
    g[:, 50, :, ::2] = -1000.0
    x["g"] = g
    o, ht = api.kda_prefill(**x, gate_lower_bound=None, output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    check_vs_oracles(x, o, ht, chunk=16, tol=1e-4)
    o2, ht2 = api.kda_prefill(**x, gate_lower_bound=None, output_final_state=True,
                              algorithm="kda.fused")  # fmt: skip
    o, ht = run_bitwise_pair(x, gate_lower_bound=None, output_final_state=True)
    assert_equal(o2, o, "fused o")
    assert_equal(ht2, ht, "fused final state")


def test_unequal_head_dims_through_the_public_entry():
    x = make(T=40, K=32, V=64)
    o, ht = api.kda_prefill(**x, output_final_state=True)
    check_vs_oracles(x, o, ht)


@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_softplus_activation_math_on_bounded_data(fused):
    """The kernels' softplus activation itself, on data whose gates stay above -5: the spec a
    bounded problem gets, launched on the softplus call (the dispatcher would refuse it)."""
    x = make(T=70, K=32, V=32, H=1, HV=2, dtype=FP32, seed=22)
    x["g"] = torch.randn(x["g"].shape, generator=torch.Generator().manual_seed(5))
    A_log, dt_bias = _gate_params(2, 32)
    A_log = A_log - 1.0  # keep -exp(A_log) * softplus(.) well above -5
    g = gate_softplus(x["g"], A_log, dt_bias)
    assert g.min() > -5.0
    opts = {**_PREFILL_DEFAULTS, **x, "gate_activation": "softplus", "gate_lower_bound": None,
            "A_log": A_log, "dt_bias": dt_bias, "output_final_state": True}  # fmt: skip
    problem, call = api._prepare(**{name: opts[name] for name in _PREPARE_ARGS})
    bounded = attrs.evolve(problem, gate_activation="none", gate_lower_bound=-5.0)
    sel = select(bounded, TARGET, algorithm="kda.fused" if fused else "kda.split")
    assert sel.spec.tile.anchor == "block"
    # the spec says what launches (builders.*_launch): give it the softplus activation
    spec = attrs.evolve(sel.spec, tile=attrs.evolve(sel.spec.tile, gate_activation="softplus"))
    o, ht = api.run_selection(attrs.evolve(sel, spec=spec), call, problem)
    check_vs_oracles(_activated(x, g=g), o, ht, chunk=sel.spec.tile.chunk, tol=TOL[FP32])


# --- sequence-parallel scan (segments) and the looped prep probe ----------------------------------


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
@pytest.mark.parametrize("seg", [1, 3])
def test_segmented_scan_matches_oracles_and_serial_scan(seg, varlen):
    """Segments of ``seg`` chunks (chunk 16): start states from segment maps and a combine."""
    x = make(B=1 if varlen else 2, T=100, H=1, HV=2, K=32, V=32, seed=23)
    cu = torch.tensor([0, 45, 45, 100]) if varlen else None
    n = 3 if varlen else 2
    h0 = state(n, 2, 32, 32)
    kw = dict(initial_state=h0, output_final_state=True, output_chunk_states=True, cu_seqlens=cu)
    o, ht, hs = run(x, chunk=16, segment_chunks=seg, **kw)
    check_vs_oracles(x, o, ht, chunk=16, initial_state=h0, cu_seqlens=cu)
    so, sht, shs = run(x, chunk=16, **kw)
    for what, a, b in zip(_OUTPUTS, (o, ht, hs), (so, sht, shs), strict=True):
        assert_close(a, (b,), TOL[FP16], f"segmented vs serial {what}")
    if varlen:
        assert_equal(ht[1], h0[1], "zero-length sequence's state")


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_row_blocked_segment_combine_equals_the_whole_map(monkeypatch, varlen):
    """The combine in row blocks of the [K, K] map (how K = 256 runs it), here K = 32 in blocks
    of 16, against the whole-map combine: the same start states, so the same outputs."""
    x = make(B=1 if varlen else 2, T=100, H=1, HV=2, K=32, V=32, seed=29)
    cu = torch.tensor([0, 45, 45, 100]) if varlen else None
    h0 = state(3 if varlen else 2, 2, 32, 32)
    kw = dict(initial_state=h0, output_final_state=True, output_chunk_states=True, cu_seqlens=cu)
    # (conftest: fresh buffers start NaN, so an unwritten start state cannot pass)
    whole = run(x, chunk=16, segment_chunks=1, **kw)
    monkeypatch.setattr(kspecs, "COMBINE_WHOLE_MAX_K", 16)
    monkeypatch.setattr(kspecs, "COMBINE_BLOCK_K", 16)
    blocked = run(x, chunk=16, segment_chunks=1, **kw)
    for what, a, b in zip(_OUTPUTS, blocked, whole, strict=True):
        assert_equal(a, b, f"row-blocked vs whole-map combine: {what}")


@pytest.mark.parametrize("planned", [1, 2])
def test_a_sequence_longer_than_the_segments_planned_runs_on_in_the_last(planned):
    """NSEG is planned from the host offsets' longest sequence; a captured graph replayed on
    offsets with a longer one (90 tokens: 6 chunks of 16, 3 segments of 2) runs the chunks past
    the planned segments in the last one. One planned segment is the serial scan bit for bit;
    two agree with it and with the oracles."""
    x = make(B=1, T=100, H=1, HV=2, K=32, V=32, seed=28)
    cu = torch.tensor([0, 90, 100])
    h0 = state(2, 2, 32, 32, seed=3)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu)
    host = torch.tensor([0, 32 * planned, 32 * planned], dtype=torch.int64)
    got = run(x, chunk=16, segment_chunks=2, host_offsets=host, **kw)
    serial = run(x, chunk=16, **kw)
    for what, a, b in zip(_OUTPUTS[:2], got[:2], serial[:2], strict=True):
        if planned == 1:
            assert_equal(a, b, f"one planned segment vs serial {what}")
        else:
            assert_close(a, (b,), TOL[FP16], f"two planned segments vs serial {what}")
    check_vs_oracles(x, got[0], got[1], chunk=16, initial_state=h0, cu_seqlens=cu)


def test_segmented_scan_vk_layout_and_no_initial_state():
    x = make(T=90, H=2, K=32, V=64, dtype=FP32, seed=24)
    o, ht = run(x, chunk=16, segment_chunks=2, output_final_state=True, state_layout="vk")
    check_vs_oracles(x, o, ht, chunk=16, state_layout="vk")


@pytest.mark.parametrize("t", [31, 40])
def test_segmented_scan_causality_bitwise(t):
    """Segment 1 (chunks 2-3 with seg=2, chunk 16) starts at token 32."""
    x = make(T=96, K=32, V=32, seed=25)
    o = run(x, chunk=16, segment_chunks=2)[0]
    y = make(T=96, K=32, V=32, seed=26)
    late = {}
    for name, val in x.items():
        z = val.clone()
        z[:, t + 1 :] = y[name][:, t + 1 :]
        late[name] = z
    o2 = run(late, chunk=16, segment_chunks=2)[0]
    assert not torch.equal(o[:, t + 1 :], o2[:, t + 1 :])
    assert_equal(o[:, : t + 1], o2[:, : t + 1], f"o[:, :{t + 1}]")


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_looped_prep_equals_the_grid_prep_bitwise(varlen):
    x = make(B=1 if varlen else 2, T=70, H=1, HV=2, K=32, V=32, seed=27)
    kw = dict(output_final_state=True)
    if varlen:
        kw["cu_seqlens"] = torch.tensor([0, 33, 70])
    a = run(x, chunk=16, **kw)
    b = run(x, chunk=16, looped=True, **kw)
    for what, u, w in zip(_OUTPUTS, a, b, strict=False):
        assert_equal(u, w, what)
