"""Head dims the kernels lack (any K, V <= 256) under the Triton interpreter: ``kda_prefill``
zero-pads them to the next kernel head dim (``api._pad_inputs``, whose note says why that is
exact). Checked here: the real-dim results match the float64 oracles at fla's own test dims
(12, 16, 60, 100) with T not a multiple of the chunk; they equal, bit for bit, a run on inputs
padded by hand; and that hand-padded run's padded state rows, columns and outputs are exactly 0.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_kda_numerics as numerics  # same folder: pytest puts it on sys.path
import torch

from kreg.dispatch import select
from kreg.families.kda import api
from kreg.families.kda.oracles import gate_sigmoid_bound, gate_softplus
from kreg.families.kda.specs import padded_head_dim
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

FP16, FP32 = torch.float16, torch.float32
HV = 2


def _gate_params(K, seed=3, a_shift=0.0):
    gen = torch.Generator().manual_seed(seed)
    return 0.5 * torch.randn(HV, generator=gen) + a_shift, torch.randn(HV * K, generator=gen)


@pytest.mark.parametrize("T", [63, 500])
@pytest.mark.parametrize("K,V", [(12, 12), (16, 16), (60, 60), (100, 100), (12, 100), (100, 60)])
def test_fla_test_dims_match_the_oracles(K, V, T):
    """fla's KDA test dims, T not a multiple of any chunk; initial and final states."""
    x = numerics.make(T=T, H=1, HV=HV, K=K, V=V, dtype=FP32, seed=K + V + T)
    h0 = numerics.state(1, HV, K, V)
    o, ht = api.kda_prefill(**x, initial_state=h0, output_final_state=True)
    assert o.shape == x["v"].shape and o.is_contiguous()
    assert ht.shape == (1, HV, K, V) and ht.is_contiguous()
    numerics.check_vs_oracles(x, o, ht, initial_state=h0)


def test_odd_dims_varlen_vk_chunk_states_match_the_oracles():
    K, V = 60, 12
    x = numerics.make(T=75, H=1, HV=HV, K=K, V=V, dtype=FP16, seed=4)
    cu = torch.tensor([0, 30, 30, 75])
    h0 = numerics.state(3, HV, V, K)  # vk: [N, HV, V, K]
    kw = dict(initial_state=h0, cu_seqlens=cu, state_layout="vk")
    o, ht, hs = api.kda_prefill(**x, output_final_state=True, output_chunk_states=True, **kw)
    numerics.check_vs_oracles(x, o, ht, **kw)
    problem, _ = api._prepare(**_prepare_args(x, output_chunk_states=True, **kw))
    C = problem.chunk_states_size  # the spacing (64 by default), whatever the kernels' chunk
    _, _, ref = numerics.tile_oracle(**x, chunk=C, return_chunk_states=True, **kw)
    assert hs.shape == ref.shape == (-(-30 // C) + -(-45 // C), HV, V, K)
    numerics.assert_close(hs, (ref,), numerics.TOL[FP16], "chunk states")


# --- bit for bit against inputs padded by hand ---------------------------------------------------


def _by_hand(x, K, V, h0, layout, dt_bias):
    """The inputs padded as the note in api.py says: zeros, and dt_bias -inf on padded K."""
    Kp, Vp = padded_head_dim(K), padded_head_dim(V)

    def pad(t, tail, fill=0.0):
        out = torch.full((*t.shape[: t.dim() - len(tail)], *tail), fill, dtype=t.dtype)
        out[tuple(slice(0, n) for n in t.shape)] = t
        return out

    y = {n: pad(x[n], (Kp,)) for n in ("q", "k", "g")}
    y["v"], y["beta"] = pad(x["v"], (Vp,)), x["beta"]
    tail = (Kp, Vp) if layout == "kv" else (Vp, Kp)
    extra = dict(initial_state=pad(h0, tail))
    if dt_bias is not None:
        extra["dt_bias"] = pad(dt_bias.view(HV, K), (Kp,), float("-inf")).view(HV * Kp)
    return y, extra


# (K, V, layout, gate options): the large A_log makes a padded column's softplus(0) decay
# leave the block anchor's span within a few rows, so a padding that got the dt_bias wrong would
# send rows down the safe anchor's other path and differ in the last bits
CASES = {
    "k12_v100_kv": (12, 100, "kv", dict()),
    "k100_v12_vk_l2": (100, 12, "vk", dict(use_qk_l2norm=True, use_beta_sigmoid=True)),
    "k60_v16_softplus": (60, 16, "kv", dict(gate_activation="softplus")),
    "k16_v60_sigmoid_bound": (16, 60, "vk", dict(gate_activation="sigmoid_bound",
                                                 gate_lower_bound=-5.0)),
}  # fmt: skip


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=numerics.NON_FINITE_EXPECTED) if CASES[n][3] else n for n in CASES],
)
def test_padded_run_equals_the_hand_padded_run_bitwise(name):
    K, V, layout, opts = CASES[name]
    x = numerics.make(T=70, H=1, HV=HV, K=K, V=V, dtype=FP32, seed=9)
    h0 = numerics.state(1, HV, K, V)
    if layout == "vk":
        h0 = h0.transpose(-1, -2).contiguous()
    gate = {}
    if opts.get("gate_activation"):
        # small real gates (softplus(-6) ~ 0.0025), large padded ones if dt_bias were not -inf
        x["g"] = torch.randn(x["g"].shape, generator=torch.Generator().manual_seed(2)) - 6.0
        A_log, dt_bias = _gate_params(K, a_shift=3.0)
        gate = dict(A_log=A_log, dt_bias=dt_bias)
    kw = dict(output_final_state=True, output_chunk_states=True, state_layout=layout, **opts)
    o, ht, hs = api.kda_prefill(**x, initial_state=h0, **kw, **gate)
    y, extra = _by_hand(x, K, V, h0, layout, gate.get("dt_bias"))
    kw["scale"] = K**-0.5  # the real K's default
    po, pht, phs = api.kda_prefill(**y, **kw, **{**gate, **extra})

    # the same spec serves both (the padded dims decide it)
    p_real, _ = api._prepare(**_prepare_args(x, initial_state=h0, **kw, **gate))
    p_pad, _ = api._prepare(**_prepare_args(y, **kw, **{**gate, **extra}))
    assert (p_real.head_dim_k, p_real.head_dim_v) == (K, V)  # the problem keeps the real dims
    assert select(p_real, "sm90").spec == select(p_pad, "sm90").spec

    rows, cols = (K, V) if layout == "kv" else (V, K)
    numerics.assert_equal(o, po[..., :V].contiguous(), "o")
    numerics.assert_equal(ht, pht[..., :rows, :cols].contiguous(), "final state")
    numerics.assert_equal(hs, phs[..., :rows, :cols].contiguous(), "chunk states")
    # the padded run's padding stays exactly zero: nothing is lost by slicing it off
    assert not po[..., V:].any()
    for s in (pht, phs):
        assert not s[..., rows:, :].any() and not s[..., :, cols:].any()
    if gate:  # and the padded columns decayed by exactly 1: the gate there is -0.0
        act = gate_softplus if opts["gate_activation"] == "softplus" else gate_sigmoid_bound
        kw_act = {} if act is gate_softplus else dict(lower_bound=-5.0)
        padded_gate = act(y["g"], gate["A_log"], extra["dt_bias"], **kw_act)[..., K:]
        assert np.all(padded_gate == 0.0)


def _prepare_args(x, **kw):
    opts = {**numerics._PREFILL_DEFAULTS, **x, **kw}
    return {name: opts[name] for name in numerics._PREPARE_ARGS if name in opts}


@pytest.mark.parametrize("K,V,layout,opts", [
    (12, 100, "kv", dict()),
    (100, 12, "vk", dict(use_qk_l2norm=True, use_beta_sigmoid=True)),
    (60, 16, "kv", dict(gate_activation="softplus")),
], ids=["k12_v100", "k100_v12_vk_l2", "k60_v16_softplus"])  # fmt: skip
def test_the_recurrence_serves_padded_dims_and_decode_takes_it(K, V, layout, opts):
    """kda.recurrent runs a head dim it lacks zero-padded, as the chunked form does (it once
    matched only the kernels' own K, so decode at K = 100 ran the chunked form and fp32 at
    K = 129..255 had no candidate at all)."""
    x = numerics.make(B=3, T=2, H=1, HV=HV, K=K, V=V, dtype=FP32, seed=K * V)
    gate = {}
    if opts.get("gate_activation"):
        A_log, dt_bias = _gate_params(K)
        gate = dict(A_log=A_log, dt_bias=dt_bias)
    h0 = numerics.state(3, HV, K, V)
    if layout == "vk":
        h0 = h0.transpose(-1, -2).contiguous()
    kw = dict(initial_state=h0, state_layout=layout, **opts, **gate)
    problem, _ = api._prepare(**_prepare_args(x, output_final_state=True, **kw))
    assert select(problem, "sm90").candidate.name == "kda.recurrent"  # two tokens: decode
    o, ht = api.kda_prefill(**x, output_final_state=True, algorithm="kda.recurrent", **kw)
    assert o.shape == x["v"].shape and ht.shape == h0.shape
    if not opts:  # the oracles take activated inputs: with options, the chunked form decides
        numerics.check_vs_oracles(x, o, ht, initial_state=h0, state_layout=layout)
    so, sht = api.kda_prefill(**x, output_final_state=True, algorithm="kda.split", **kw)
    numerics.assert_close(o, (so,), numerics.TOL[FP32], "o against the chunked form")
    numerics.assert_close(ht, (sht,), numerics.TOL[FP32], "final state against the chunked form")
