"""Head dims the kernels lack (any K, V <= 256) under the Triton interpreter: the chunked paths
read the caller's tensors through column masks into tiles of the next kernel head dim (masked
tiles), the recurrent step runs on zero-padded copies (``api._pad_inputs``; the note there says
why both are exact). Checked here: the real-dim results match the float64 oracles at fla's own
test dims (12, 16, 60, 100) with T not a multiple of the chunk; split and fused runs equal, bit
for bit, a run on inputs padded by hand; and that hand-padded run's padded state rows, columns
and outputs are exactly 0.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_kda_numerics as numerics  # same folder: pytest puts it on sys.path
import torch

from kreg.dispatch import select
from kreg.families.kda import api
from kreg.families.kda.oracles import gate_sigmoid_bound, gate_softplus
from kreg.families.kda.specs import padded_head_dim, padded_spec, reads_caller_dims
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


# (K, V, layout, gate options). A padded channel's gate reaches no output (its k and q are 0),
# so the gate options check that the activation is served at odd K (the slices of the pairs
# kernel end inside a slice at K = 60 and 100), and the hand-padded run below that its padded
# gate is -0.0 (dt_bias -inf there, as the masked kernels read it)
CASES = {
    "k12_v100_kv": (12, 100, "kv", dict()),
    "k100_v12_vk_l2": (100, 12, "vk", dict(use_qk_l2norm=True, use_beta_sigmoid=True)),
    "k60_v16_softplus": (60, 16, "kv", dict(gate_activation="softplus")),
    "k16_v60_sigmoid_bound": (16, 60, "vk", dict(gate_activation="sigmoid_bound",
                                                 gate_lower_bound=-5.0)),
    # K and V padded to one size: the fused kernel's too (it holds all of V, as wide as K)
    "k100_v72_softplus": (100, 72, "kv", dict(gate_activation="softplus")),
}  # fmt: skip


def _runs():
    for name, (K, V, _, opts) in CASES.items():
        marks = [numerics.NON_FINITE_EXPECTED] if opts else []
        algorithms = ["kda.split"]
        if padded_head_dim(K) == padded_head_dim(V):
            algorithms.append("kda.fused")
        for algorithm in algorithms:
            yield pytest.param(name, algorithm, marks=marks, id=f"{name}-{algorithm}")


@pytest.mark.parametrize("name,algorithm", list(_runs()))
def test_masked_run_equals_the_hand_padded_run_bitwise(name, algorithm):
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
    kw = dict(output_final_state=True, output_chunk_states=True, state_layout=layout,
              algorithm=algorithm, allow_opt_in=True, **opts)  # fmt: skip
    o, ht, hs = api.kda_prefill(**x, initial_state=h0, **kw, **gate)
    y, extra = _by_hand(x, K, V, h0, layout, gate.get("dt_bias"))
    kw["scale"] = K**-0.5  # the real K's default
    po, pht, phs = api.kda_prefill(**y, **kw, **{**gate, **extra})

    # the same spec serves both (the padded dims decide it), the real dims' with masked tiles
    p_real, _ = api._prepare(**_prepare_args(x, initial_state=h0, **kw, **gate))
    p_pad, _ = api._prepare(**_prepare_args(y, **kw, **{**gate, **extra}))
    assert (p_real.head_dim_k, p_real.head_dim_v) == (K, V)  # the problem keeps the real dims
    real = select(p_real, "sm90", algorithm=algorithm, allow_opt_in=True).spec
    assert reads_caller_dims(real) and (real.tile.input_dim_k, real.tile.input_dim_v) == (K, V)
    assert padded_spec(real) == select(p_pad, "sm90", algorithm=algorithm, allow_opt_in=True).spec

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


def test_a_v_block_past_the_callers_v_is_not_launched(monkeypatch):
    """V = 40 at 64 in blocks of 16: three scan programs per (sequence, head), not four, and
    the segment maps and starts likewise (``launch.v_blocks``); the outputs, the final state
    and the chunk states still equal the hand-padded run's (every block launched) bit for bit,
    through the sequence-parallel scan (three 16-chunk segments)."""
    import attrs

    from kreg.families.kda import launch

    K, V = 20, 40
    x = numerics.make(T=600, H=1, HV=HV, K=K, V=V, dtype=FP32, seed=12)
    h0 = numerics.state(1, HV, K, V)
    kw = dict(initial_state=h0, output_final_state=True, output_chunk_states=True)
    problem, call = api._prepare(**_prepare_args(x, **kw))
    sel = select(problem, "sm90", algorithm="kda.split")
    spec = attrs.evolve(sel.spec, scan=attrs.evolve(sel.spec.scan, block_v=16, segment_chunks=16))
    assert spec.tile.chunk == 16 and launch.v_blocks(spec.scan) == 3
    grids = {}
    real_launch = launch._launch

    def spy(lc, grid, *args, **kw):
        grids.setdefault(lc.name, []).append(grid)
        return real_launch(lc, grid, *args, **kw)

    monkeypatch.setattr(launch, "_launch", spy)
    got = api.run_selection(attrs.evolve(sel, spec=spec), call, problem)
    assert [g[0] for g in grids["kda_chunk_scan_kernel"]] == [3]
    assert [g[0] for g in grids["kda_segment_combine_kernel"]] == [3]
    assert [g[0] for g in grids["kda_segment_map_kernel"]] == [32 // 16 + 3]

    y, extra = _by_hand(x, K, V, h0, "kv", None)
    p_pad, c_pad = api._prepare(**_prepare_args(y, **{**kw, **extra}, scale=K**-0.5))
    want = api.run_selection(attrs.evolve(sel, spec=padded_spec(spec)), c_pad, p_pad)
    assert grids["kda_chunk_scan_kernel"][-1][0] == 4
    numerics.assert_equal(got[0], want[0][..., :V].contiguous(), "o")
    for what, a, b in zip(("final state", "chunk states"), got[1:], want[1:], strict=True):
        numerics.assert_equal(a, b[..., :K, :V].contiguous(), what)


@numerics.NON_FINITE_EXPECTED
@pytest.mark.parametrize("name", ["k", "v", "g"])
def test_masked_tiles_contain_a_non_finite_input(name):
    """K = 20, V = 24 (masked tiles at 32), softplus gates: NaN in one real channel at every
    position p of three chunks (batch row p): outputs before p bit for bit the clean run's,
    every output from p on NaN, the final state NaN."""
    K, V, T = 20, 24, 48
    base = numerics.make(T=T, H=1, HV=1, K=K, V=V, dtype=FP32, seed=21)
    gen = torch.Generator().manual_seed(22)
    gate = dict(A_log=torch.randn(1, generator=gen), dt_bias=torch.randn(K, generator=gen),
                gate_activation="softplus")  # fmt: skip
    kw = dict(output_final_state=True, **gate)
    ref, _ = api.kda_prefill(**base, **kw)
    y = {n: t.expand(T, *t.shape[1:]).contiguous() for n, t in base.items()}
    rows = torch.arange(T)
    ch = torch.randint(0, y[name].shape[-1], (T,), generator=gen)
    y[name][rows, rows, 0, ch] = float("nan")
    o, ht = api.kda_prefill(**y, **kw)
    problem, _ = api._prepare(**_prepare_args(y, **kw))
    assert reads_caller_dims(select(problem, "sm90").spec)
    for p in range(T):
        numerics.assert_equal(o[p, :p], ref[0, :p], f"{name}=NaN at p={p}: o[:p]")
        assert o[p, p:].isnan().all(), f"{name}=NaN at p={p}: a finite output from p on"
        assert ht[p].isnan().all(), f"{name}=NaN at p={p}: the final state not all NaN"
