"""KDA on a GPU at production size (K = V = 128, bf16): accuracy against a float64 token-serial
loop, split == fused bit for bit, causality, varlen == per sequence, the production argument set,
and (where ``fla`` is importable) agreement with ``fla.ops.kda.chunk_kda``.

Skipped without a GPU (``gpu`` marker). The float64 reference is a straight transcription of the
recurrence (docs/kda/ALGORITHM.md) written here in torch, batched over (sequence, value
head) on the GPU: the NumPy oracle would take hours at T = 16384 with 64 heads. Measured figures
are printed (run with ``-s``) and recorded with ``record_property``.
"""

from __future__ import annotations

import math

import attrs
import pytest
import torch

from kreg.dispatch import select
from kreg.families.kda import api
from kreg.families.kda.plugin import SPLIT

pytestmark = pytest.mark.gpu

MAX_REL_RMS = 5e-3  # 0.5 %
LOWER_BOUND = -5.0
BF16 = torch.bfloat16


# --- reference -----------------------------------------------------------------------------------


@torch.no_grad()
def token_serial_f64(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None):
    """Float64 token-serial recurrence on the GPU. Inputs are activated (g is the log-decay).

    q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV]; states [N, HV, K, V].
    Each step: S <- diag(exp(g_t)) S; S <- S + beta_t k_t (v_t - S^T k_t)^T; o_t = S^T (scale q_t).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K**-0.5 if scale is None else scale
    heads = torch.arange(HV, device=q.device) // (HV // H)
    q, k = q.double()[:, :, heads], k.double()[:, :, heads]  # [B, T, HV, K]
    v, g, beta = v.double(), g.double(), beta.double()
    if cu_seqlens is None:
        segments = [(b, 0, T) for b in range(B)]
    else:
        cu = cu_seqlens.tolist()
        segments = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    o = torch.zeros(B, T, HV, V, dtype=torch.float64, device=q.device)
    n_states = len(segments)
    if initial_state is None:
        final = torch.zeros(n_states, HV, K, V, dtype=torch.float64, device=q.device)
    else:
        final = initial_state.double().clone()
    if cu_seqlens is None:  # batch the rows: one loop over T
        S = final
        for t in range(T):
            S = S * g[:, t].exp()[..., None]
            err = v[:, t] - torch.einsum("nhkv,nhk->nhv", S, k[:, t])
            S = S + beta[:, t, :, None, None] * k[:, t, :, :, None] * err[:, :, None, :]
            o[:, t] = torch.einsum("nhkv,nhk->nhv", S, q[:, t]) * scale
        return o, S
    for n, (b, start, end) in enumerate(segments):
        S = final[n]
        for t in range(start, end):
            S = S * g[b, t].exp()[..., None]
            err = v[b, t] - torch.einsum("hkv,hk->hv", S, k[b, t])
            S = S + beta[b, t, :, None, None] * k[b, t, :, :, None] * err[:, None, :]
            o[b, t] = torch.einsum("hkv,hk->hv", S, q[b, t]) * scale
        final[n] = S
    return o, final


def rel_rms(x, ref) -> float:
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return math.inf
    return ((x - ref).norm() / ref.norm()).item()


def report(record_property, name, value):
    record_property(name, value)
    print(f"\n  {name} = {value:.3e}" if isinstance(value, float) else f"\n  {name} = {value}")


# --- inputs --------------------------------------------------------------------------------------


def make(B, T, H, HV=None, K=128, V=128, seed=0):
    """Activated bf16 inputs: unit-norm q and k, sigmoid-bounded gates in [-5, 0], beta in (0, 1)."""
    HV = HV or H
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    q = torch.nn.functional.normalize(r(B, T, H, K), dim=-1)
    k = torch.nn.functional.normalize(r(B, T, H, K), dim=-1)
    g = LOWER_BOUND * torch.sigmoid(r(B, T, HV, K) + 1.0)
    beta = torch.sigmoid(r(B, T, HV))
    return dict(q=q.to(BF16), k=k.to(BF16), v=r(B, T, HV, V).to(BF16), g=g.to(BF16),
                beta=beta.to(BF16))  # fmt: skip


def initial_state(N, HV, K=128, V=128, seed=1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return 0.1 * torch.randn(N, HV, K, V, device="cuda", generator=gen)


_PREPARE_DEFAULTS = dict(scale=None, initial_state=None, output_final_state=False,
                         gate_lower_bound=LOWER_BOUND, cu_seqlens=None, cu_seqlens_cpu=None,
                         A_log=None, dt_bias=None, gate_activation="none", use_qk_l2norm=False,
                         use_beta_sigmoid=False, state_layout="kv", output_chunk_states=False)  # fmt: skip


def run_pinned(x, *, segment_chunks=0, **kw):
    """The dispatcher's split spec with the scan's segmentation pinned (0: one serial chain,
    the split spec that pairs bit for bit with fused)."""
    problem, call = api._prepare(**x, **{**_PREPARE_DEFAULTS, **kw})
    sel = select(problem, "sm90")
    spec = attrs.evolve(sel.spec, scan=attrs.evolve(sel.spec.scan, segment_chunks=segment_chunks))
    assert sel.candidate.is_valid(spec, sel.target, problem).ok
    return api.run_selection(attrs.evolve(sel, spec=spec), call, problem)


def run_bitwise_pair(x, **kw):
    """The split spec that pairs bit for bit with the dispatcher's fused spec
    (``specs.bitwise_pair``): the same tiles, the scan at the fused kernel's V width and warps."""
    from kreg.families.kda.specs import bitwise_pair

    problem, call = api._prepare(**x, **{**_PREPARE_DEFAULTS, **kw})
    fused = select(problem, "sm90", algorithm="kda.fused", allow_opt_in=True)
    split = select(problem, "sm90", algorithm="kda.split")
    return api.run_selection(attrs.evolve(split, spec=bitwise_pair(fused.spec)), call, problem)


# --- accuracy ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "B,T,H,HV",
    [(1, 16384, 4, 4), (4, 4096, 16, 16), (2, 8192, 8, 32)],
    ids=["B1-T16384-H4", "B4-T4096-H16", "B2-T8192-H8-HV32"],
)
def test_accuracy_vs_float64_loop(B, T, H, HV, record_property):
    x = make(B, T, H, HV, seed=B * T + H)
    h0 = initial_state(B, HV)
    o, ht = api.kda_prefill(**x, initial_state=h0, output_final_state=True)
    ro, rh = token_serial_f64(**x, initial_state=h0)
    eo, eh = rel_rms(o, ro), rel_rms(ht, rh)
    report(record_property, f"o_rel_rms[{B}x{T}x{H}x{HV}]", eo)
    report(record_property, f"state_rel_rms[{B}x{T}x{H}x{HV}]", eh)
    assert eo <= MAX_REL_RMS and eh <= MAX_REL_RMS, (eo, eh)


@pytest.mark.parametrize("bound", [None, -5.0], ids=["safe", "block"])
@pytest.mark.parametrize("K,V", [(128, 128), (96, 80)], ids=["d128", "masked-k96-v80"])
def test_split_equals_fused_bitwise(bound, K, V):
    """The dispatcher's fused spec and its bitwise pair among split specs (the scan at the fused
    kernel's V width and warps): equal bit for bit, at the kernels' head dims and with masked
    tiles; the dispatcher's own split spec (V split into blocks) agrees within rounding."""
    from kreg.families.kda.specs import bitwise_pair

    x = make(2, 8192, 16, K=K, V=V, seed=3)
    h0 = initial_state(2, 16, K, V)
    kw = dict(initial_state=h0, output_final_state=True, output_chunk_states=True,
              gate_lower_bound=bound)  # fmt: skip
    problem, call = api._prepare(**x, **{**_PREPARE_DEFAULTS, **kw})
    fsel = select(problem, "sm90", algorithm="kda.fused", allow_opt_in=True)
    fused = api.run_selection(fsel, call, problem)
    ssel = select(problem, "sm90", algorithm="kda.split")
    pair = attrs.evolve(ssel, spec=bitwise_pair(fsel.spec))
    split = api.run_selection(pair, call, problem)
    for what, a, b in zip(("o", "final state", "chunk states"), split, fused, strict=True):
        assert torch.equal(a, b), f"{what}: max abs diff {(a.float() - b.float()).abs().max()}"
    own = api.run_selection(ssel, call, problem)
    assert rel_rms(own[0], fused[0]) <= MAX_REL_RMS  # both within the float64 budget


@pytest.mark.parametrize("seg", [16, 64])
def test_segmented_scan_accuracy(seg, record_property):
    """The sequence-parallel scan (segments of ``seg`` chunks) at small batch x heads."""
    x = make(1, 16384, 4, seed=12)
    h0 = initial_state(1, 4)
    o, ht, hs = run_pinned(x, segment_chunks=seg, initial_state=h0, output_final_state=True,
                           output_chunk_states=True)  # fmt: skip
    so, sht, shs = run_pinned(x, initial_state=h0, output_final_state=True,
                              output_chunk_states=True)  # fmt: skip
    ro, rh = token_serial_f64(**x, initial_state=h0)
    eo, eh = rel_rms(o, ro), rel_rms(ht, rh)
    report(record_property, f"segmented{seg}_o_rel_rms", eo)
    report(record_property, f"segmented{seg}_state_rel_rms", eh)
    assert eo <= MAX_REL_RMS and eh <= MAX_REL_RMS, (eo, eh)
    assert rel_rms(hs, shs) <= MAX_REL_RMS


def test_segmented_scan_at_head_dim_256(record_property):
    """K = 256 runs the segment combine in row blocks of the [K, K] map (specs.COMBINE_BLOCK_K):
    against the serial scan and the float64 oracle, with an initial state and two sequences."""
    x = make(2, 3000, 2, K=256, V=256, seed=15)
    h0 = initial_state(2, 2, K=256, V=256)
    o, ht = run_pinned(x, segment_chunks=16, initial_state=h0, output_final_state=True)[:2]
    so, sht = run_pinned(x, initial_state=h0, output_final_state=True)[:2]
    ro, rh = token_serial_f64(**x, initial_state=h0)
    eo, eh = rel_rms(o, ro), rel_rms(ht, rh)
    report(record_property, "segmented_d256_o_rel_rms", eo)
    assert eo <= MAX_REL_RMS and eh <= MAX_REL_RMS, (eo, eh)
    assert rel_rms(o, so) <= MAX_REL_RMS and rel_rms(ht, sht) <= MAX_REL_RMS


def test_segmented_varlen_one_long_among_short(record_property):
    """Segments planned for the longest of the host offsets (5000 tokens among short ones and
    an empty one); and the same launch on offsets with a longer sequence than planned (a graph
    replayed on new offsets), whose last planned segment runs the rest: both agree with the
    serial scan and the float64 oracle."""
    lens = [5000, 37, 0, 611, 1, 1400]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    x = make(1, int(cu[-1]), 4, seed=14)
    h0 = initial_state(len(lens), 4)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu.cuda(), cu_seqlens_cpu=cu)
    problem, call = api._prepare(**x, **{**_PREPARE_DEFAULTS, **kw})
    sel = select(problem, "sm90")
    spec = attrs.evolve(sel.spec, scan=attrs.evolve(sel.spec.scan, segment_chunks=16))
    assert sel.candidate.is_valid(spec, sel.target, problem).ok
    serial = api.run_selection(attrs.evolve(sel, spec=attrs.evolve(
        spec, scan=attrs.evolve(spec.scan, segment_chunks=0))), call, problem)  # fmt: skip
    short = 1024  # plans 1024 / (16 chunks) tokens for the longest
    ro, rh = token_serial_f64(**x, initial_state=h0, cu_seqlens=cu)
    for name, c in (("planned", call), ("replayed", attrs.evolve(call, longest=short))):
        o, ht = api.run_selection(attrs.evolve(sel, spec=spec), c, problem)[:2]
        eo, eh = rel_rms(o, ro), rel_rms(ht, rh)
        report(record_property, f"{name}_o_rel_rms", eo)
        assert eo <= MAX_REL_RMS and eh <= MAX_REL_RMS, (name, eo, eh)
        assert rel_rms(o, serial[0]) <= MAX_REL_RMS and rel_rms(ht, serial[1]) <= MAX_REL_RMS


@pytest.mark.parametrize("t", [1000, 2047, 2048], ids=["inside-chunk", "chunk-end", "chunk-start"])
def test_causality_bitwise(t):
    x = make(1, 4096, 8, seed=4)
    o = api.kda_prefill(**x)[0]
    y = make(1, 4096, 8, seed=6)
    late = {}
    for name, val in x.items():
        z = val.clone()
        z[:, t + 1 :] = y[name][:, t + 1 :]
        late[name] = z
    o2 = api.kda_prefill(**late)[0]
    assert not torch.equal(o[:, t + 1 :], o2[:, t + 1 :])
    assert torch.equal(o[:, : t + 1], o2[:, : t + 1])


def test_varlen_equals_each_sequence_alone(record_property):
    lens = [1300, 547, 0, 2048, 963, 271, 3063]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    T, HV = int(cu[-1]), 8
    x = make(1, T, 8, seed=7)
    h0 = initial_state(len(lens), HV)
    kw = dict(initial_state=h0, output_final_state=True, output_chunk_states=True)
    opts = dict(scale=None, gate_lower_bound=LOWER_BOUND, cu_seqlens_cpu=None, A_log=None,
                dt_bias=None, gate_activation="none", use_qk_l2norm=False,
                use_beta_sigmoid=False, state_layout="kv")  # fmt: skip
    problem, call = api._prepare(**x, **opts, **kw, cu_seqlens=cu.cuda())
    sel = select(problem, "sm90")
    o, ht, hs = api.run_selection(sel, call, problem)
    ro, rh = token_serial_f64(**x, initial_state=h0, cu_seqlens=cu)
    eo, eh = rel_rms(o, ro), rel_rms(ht, rh)
    report(record_property, "varlen_o_rel_rms", eo)
    report(record_property, "varlen_state_rel_rms", eh)
    assert eo <= MAX_REL_RMS and eh <= MAX_REL_RMS, (eo, eh)
    assert torch.equal(ht[2], h0[2])  # the empty sequence passes its state through
    first = 0
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        if a == b:
            continue
        part = {name: t[:, a:b].contiguous() for name, t in x.items()}
        kw_n = dict(kw, initial_state=h0[n : n + 1].contiguous())
        p_n, c_n = api._prepare(**part, **opts, **kw_n, cu_seqlens=None)
        # the varlen call's spec, pinned (specialised to a call without offsets)
        sel_n = attrs.evolve(sel, spec=SPLIT.specialize(sel.spec, p_n))
        o_n, h_n, hs_n = api.run_selection(sel_n, c_n, p_n)
        assert torch.equal(o[:, a:b], o_n), f"o of sequence {n}"
        assert torch.equal(ht[n], h_n[0]), f"final state of sequence {n}"
        n_chunks = -(-(b - a) // problem.chunk_states_size)  # the spacing, not the kernels' chunk
        assert torch.equal(hs[first : first + n_chunks], hs_n), f"chunk states of sequence {n}"
        first += n_chunks
    # device offsets alone: the host cannot count the rows, so the buffer comes back whole at
    # its bound (api.kda_prefill's docstring), the written rows first
    assert hs.shape[0] == -(-T // problem.chunk_states_size) + len(lens) - 1 >= first


# --- the production argument set, and the peer -----------------------------------------------


def _production_inputs(B, T, H, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    raw = dict(q=r(B, T, H, 128).to(BF16), k=r(B, T, H, 128).to(BF16),
               v=r(B, T, H, 128).to(BF16), g=r(B, T, H, 128).to(BF16),
               beta=r(B, T, H).to(BF16))  # fmt: skip
    params = dict(A_log=0.5 * r(H), dt_bias=0.5 * r(H * 128), h0=0.1 * r(B, H, 128, 128))
    return raw, params


def _activate(raw, params):
    """The activations in float64, as docs/kda/ALGORITHM.md states them."""
    q, k = raw["q"].double(), raw["k"].double()
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    H, K = raw["g"].shape[2:]
    x = raw["g"].double() + params["dt_bias"].double().view(H, K)
    g = LOWER_BOUND * torch.sigmoid(params["A_log"].double().exp()[:, None] * x)
    beta = torch.sigmoid(raw["beta"].double())
    return dict(q=q, k=k, v=raw["v"], g=g, beta=beta)


def _kreg_production(raw, params, **kw):
    return api.kda_prefill(**raw, gate_activation="sigmoid_bound", A_log=params["A_log"],
                           dt_bias=params["dt_bias"], gate_lower_bound=LOWER_BOUND,
                           use_qk_l2norm=True, use_beta_sigmoid=True, initial_state=params["h0"],
                           output_final_state=True, **kw)  # fmt: skip


def _fla_production(raw, params):
    chunk_kda = pytest.importorskip("fla.ops.kda").chunk_kda
    with torch.inference_mode():
        return chunk_kda(raw["q"], raw["k"], raw["v"], raw["g"], raw["beta"],
                         scale=raw["q"].shape[-1] ** -0.5, initial_state=params["h0"],
                         output_final_state=True, use_qk_l2norm_in_kernel=True,
                         use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                         safe_gate=True, lower_bound=LOWER_BOUND, A_log=params["A_log"],
                         dt_bias=params["dt_bias"])  # fmt: skip


PRODUCTION_SHAPES = [(1, 16384, 4), (2, 8192, 32)]


@pytest.mark.parametrize("B,T,H", PRODUCTION_SHAPES, ids=["B1-T16384-H4", "B2-T8192-H32"])
def test_production_argument_set(B, T, H, record_property):
    raw, params = _production_inputs(B, T, H, seed=8 + B)
    o, ht = _kreg_production(raw, params)
    of, htf = _kreg_production(raw, params, algorithm="kda.fused")
    prod = dict(gate_activation="sigmoid_bound", A_log=params["A_log"], dt_bias=params["dt_bias"],
                gate_lower_bound=LOWER_BOUND, use_qk_l2norm=True, use_beta_sigmoid=True,
                initial_state=params["h0"], output_final_state=True)  # fmt: skip
    so, sht = run_bitwise_pair(raw, **prod)
    assert torch.equal(so, of) and torch.equal(sht, htf), "split != fused"
    ro, rh = token_serial_f64(**_activate(raw, params), initial_state=params["h0"])
    eo, eh = rel_rms(o, ro), rel_rms(ht, rh)
    report(record_property, f"prod_o_rel_rms[{B}x{T}x{H}]", eo)
    report(record_property, f"prod_state_rel_rms[{B}x{T}x{H}]", eh)
    assert eo <= MAX_REL_RMS and eh <= MAX_REL_RMS, (eo, eh)

    pytest.importorskip("fla.ops.kda")
    fo, fh = _fla_production(raw, params)
    fo_err, fh_err = rel_rms(fo, ro), rel_rms(fh, rh)
    report(record_property, f"fla_o_rel_rms[{B}x{T}x{H}]", fo_err)
    report(record_property, f"fla_state_rel_rms[{B}x{T}x{H}]", fh_err)
    report(record_property, f"kreg_vs_fla_o[{B}x{T}x{H}]", rel_rms(o, fo))
    report(record_property, f"kreg_vs_fla_state[{B}x{T}x{H}]", rel_rms(ht, fh))
    # agreement: both sit within the 0.5 % budget of the truth, so within 1 % of each other
    assert rel_rms(o, fo) <= 2 * MAX_REL_RMS and rel_rms(ht, fh) <= 2 * MAX_REL_RMS
    # no worse than the peer (5 % slack on its error)
    assert eo <= 1.05 * fo_err, (eo, fo_err)
    assert eh <= 1.05 * fh_err, (eh, fh_err)


# --- options not in the production set ------------------------------------------------------


def test_unbounded_gates_with_hard_resets(record_property):
    """No lower bound: softplus-scale decays with g = -1000 resets, on the safe anchor the
    dispatcher picks from the gate bound; finite, within the budget, split == fused."""
    B, T, H = 1, 8192, 8
    x = make(B, T, H, seed=21)
    gen = torch.Generator(device="cuda").manual_seed(22)
    g = -torch.nn.functional.softplus(3 * torch.randn(B, T, H, 128, device="cuda", generator=gen))
    g[:, 1000] = -1000.0  # a whole-token reset
    g[:, 5000, :, ::2] = -1000.0  # half the channels of another
    x["g"] = g.to(BF16)
    assert x["g"].float().min() == -1000.0
    h0 = initial_state(B, H)
    problem, _ = api._prepare(**x, **{**_PREPARE_DEFAULTS, "gate_lower_bound": None})
    assert select(problem, "sm90").spec.tile.anchor == "safe"
    kw = dict(gate_lower_bound=None, initial_state=h0, output_final_state=True)
    o, ht = api.kda_prefill(**x, **kw)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    ro, rh = token_serial_f64(**x, initial_state=h0)
    eo, eh = rel_rms(o, ro), rel_rms(ht, rh)
    report(record_property, "unbounded_o_rel_rms", eo)
    report(record_property, "unbounded_state_rel_rms", eh)
    assert eo <= MAX_REL_RMS and eh <= MAX_REL_RMS, (eo, eh)
    so, sht = run_bitwise_pair(x, **kw)
    fo, fht = api.kda_prefill(**x, **kw, algorithm="kda.fused")
    assert torch.equal(so, fo) and torch.equal(sht, fht), "split != fused"


def test_vk_layout_bf16_initial_state_and_chunk_states():
    """State layout [V, K] with a bf16 initial state: the transposes of the [K, V] run's
    states, bit for bit, and the chunk states follow the same layout."""
    B, T, H = 2, 4096, 8
    x = make(B, T, H, seed=23)
    h0 = initial_state(B, H).to(BF16)
    kw = dict(output_final_state=True, output_chunk_states=True)
    o, ht, hs = api.kda_prefill(**x, initial_state=h0, **kw)
    o_vk, ht_vk, hs_vk = api.kda_prefill(
        **x, initial_state=h0.transpose(-1, -2).contiguous(), state_layout="vk", **kw
    )
    assert torch.equal(o, o_vk)
    assert torch.equal(ht, ht_vk.transpose(-1, -2))
    assert torch.equal(hs, hs_vk.transpose(-1, -2))
    ro, rh = token_serial_f64(**x, initial_state=h0.float())
    assert rel_rms(o, ro) <= MAX_REL_RMS and rel_rms(ht, rh) <= MAX_REL_RMS


def test_custom_op_under_torch_compile_inductor():
    """The custom op inside a compiled function (inductor, fullgraph): no graph break, and the
    same bits as the eager call."""
    from kreg.families.kda import kda_prefill_op

    x = make(1, 4096, 8, seed=24)
    h0 = initial_state(1, 8)

    def f(q, k, v, g, beta, h0):
        o, ht = kda_prefill_op(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        return o * 2, ht + 1

    compiled = torch.compile(f, fullgraph=True)
    o_c, ht_c = compiled(**x, h0=h0)
    o_e, ht_e = api.kda_prefill(**x, initial_state=h0, output_final_state=True)
    assert torch.equal(o_c, o_e * 2) and torch.equal(ht_c, ht_e + 1)


# --- head dims the kernels lack, and chunk states at the caller's spacing -------------------------


@pytest.mark.parametrize("K,V", [(100, 100), (60, 12), (16, 256)])
def test_padded_head_dims_vs_float64_and_hand_padding(K, V, record_property):
    """fla's test dims, read through masked tiles: within the float64 budget, and bit for bit
    the run on inputs padded by hand."""
    from kreg.families.kda.specs import padded_head_dim

    B, T, H = 2, 1500, 4
    x = make(B, T, H, K=K, V=V, seed=K + V)
    h0 = initial_state(B, H, K, V)
    o, ht = api.kda_prefill(**x, initial_state=h0, output_final_state=True)
    ro, rh = token_serial_f64(**x, initial_state=h0)
    eo, eh = rel_rms(o, ro), rel_rms(ht, rh)
    report(record_property, f"padded_o_rel_rms[K{K}V{V}]", eo)
    assert eo <= MAX_REL_RMS and eh <= MAX_REL_RMS, (eo, eh)
    Kp, Vp = padded_head_dim(K), padded_head_dim(V)
    pad = {n: torch.nn.functional.pad(t, (0, (Vp - V) if n == "v" else (Kp - K)))
           for n, t in x.items() if n != "beta"}  # fmt: skip
    po, pht = api.kda_prefill(**pad, beta=x["beta"], scale=K**-0.5, output_final_state=True,
                              initial_state=torch.nn.functional.pad(h0, (0, Vp - V, 0, Kp - K)))  # fmt: skip
    assert torch.equal(o, po[..., :V]) and torch.equal(ht, pht[..., :K, :V])
    assert not pht[..., K:, :].any() and not pht[..., :, V:].any()


def test_chunk_states_spacing_and_dtype():
    """States every 64 / 128 tokens are the full-rate states (at the spec's chunk) subsampled,
    bit for bit, fixed-length and varlen; bf16 ones are the fp32 ones rounded (to nearest)."""
    lens = [1300, 0, 2048, 963]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    for x, extra, lengths in ((make(2, 4000, 8, seed=40), {}, [4000, 4000]),
                              (make(1, int(cu[-1]), 8, seed=41), dict(cu_seqlens=cu), lens)):  # fmt: skip
        problem, _ = api._prepare(
            **x,
            **{**_PREPARE_DEFAULTS, **extra, "output_chunk_states": True, "gate_lower_bound": None},
        )
        chunk = select(problem, "sm90").spec.tile.chunk
        kw = dict(output_chunk_states=True, **extra)
        full = api.kda_prefill(**x, **kw, chunk_states_size=chunk)[2]
        for size in (64, 128):
            hs = api.kda_prefill(**x, **kw, chunk_states_size=size)[2]
            rows, at = [], 0
            for n in lengths:
                nc = -(-n // chunk)
                rows.append(full[at : at + nc : size // chunk])
                at += nc
            assert torch.equal(hs, torch.cat(rows)), size
        bf = api.kda_prefill(**x, **kw, chunk_states_dtype=BF16)[2]
        assert torch.equal(bf, api.kda_prefill(**x, **kw)[2].to(BF16))
