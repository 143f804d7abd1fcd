"""``kda_prefill`` argument validation: every bad input is a ValueError naming the argument, raised
before any kernel launch; and the dispatcher's choice for the default KDA problem.

Runs in the main (non-interpreter) process. CPU tensors need ``TRITON_INTERPRET=1``, which this
process must not set, so most tests patch ``api.interpreting`` to let CPU tensors through the
device check; the launchers are patched to fail the test if validation ever lets a call reach them.
"""

from __future__ import annotations

import inspect
import math
import os

import numpy as np
import pytest
import torch

from kreg.dispatch import select
from kreg.families.kda import api, launch
from kreg.families.kda.plugin import FUSED_OPT_IN_REASON
from kreg.families.kda.specs import reads_caller_dims
from kreg.problems import LinearAttentionProblem


class Launched(Exception):
    """Raised by the patched launchers: validation let the call through."""


@pytest.fixture
def no_launch(monkeypatch):
    """CPU tensors pass the device check, and any launch raises ``Launched``."""

    def boom(*args, **kwargs):
        raise Launched

    monkeypatch.setattr(api, "interpreting", lambda: True)
    monkeypatch.setattr(launch, "run_split", boom)
    monkeypatch.setattr(launch, "run_fused", boom)
    monkeypatch.setattr(launch, "run_recurrent", boom)


def make(B=1, T=8, H=2, HV=2, K=32, V=32, dtype=torch.float16):
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    return dict(
        q=rnd(B, T, H, K),
        k=rnd(B, T, H, K),
        v=rnd(B, T, HV, V),
        g=-torch.rand(B, T, HV, K, generator=gen).to(dtype),
        beta=torch.rand(B, T, HV, generator=gen).to(dtype),
    )


def call(args: dict, **kwargs):
    args = dict(args)
    tensors = [args.pop(name) for name in ("q", "k", "v", "g", "beta")]
    return api.kda_prefill(*tensors, **{**args, **kwargs})


def expect(name: str, args: dict, fragment: str = "", **kwargs):
    with pytest.raises(ValueError) as e:
        call(args, **kwargs)
    text = str(e.value)
    assert text.startswith(f"{name}: "), text
    assert fragment in text, text
    return text


# --- the baseline reaches the launcher --------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(initial_state=torch.zeros(1, 2, 32, 32), output_final_state=True),
        dict(cu_seqlens=torch.tensor([0, 3, 3, 8])),
        dict(gate_activation="softplus", gate_lower_bound=None, algorithm="split"),
        dict(
            gate_activation="sigmoid_bound",
            gate_lower_bound=-5.0,
            A_log=torch.zeros(2),
            dt_bias=torch.zeros(64),
        ),
        dict(algorithm="kda.fused"),
    ],
    ids=["plain", "states", "varlen", "softplus", "sigmoid_bound", "fused"],
)
def test_valid_calls_reach_the_launcher(no_launch, kwargs):
    """The baseline the bad cases below perturb is itself valid (only the launch is refused)."""
    args = make()
    with pytest.raises(Launched):
        call(args, **kwargs)


def test_g_and_beta_may_be_fp32(no_launch):
    args = make()
    args["g"] = args["g"].float()
    args["beta"] = args["beta"].float()
    with pytest.raises(Launched):
        call(args)


# --- the whole domain of bad input, in one table ----------------------------------------------
#
# Each row: (id, mutation of the baseline call, argument the message starts with, fragment).
# The baseline is make(): q, k [1, 8, 2, 32], v [1, 8, 2, 32], g [1, 8, 2, 32], beta [1, 8, 2],
# fp16 on the CPU; a mutation maps the call's keyword dict to a new one. Every rejection is a
# ValueError raised before any launch (the no_launch fixture would turn a launch into Launched).

TENSORS = ("q", "k", "v", "g", "beta")


def opts(**kwargs):
    """Add or replace keyword arguments."""
    return lambda a: {**a, **kwargs}


def edit(**fns):
    """Transform some of the baseline tensors."""
    return lambda a: {**a, **{name: fn(a[name]) for name, fn in fns.items()}}


def shape(**dims):
    """A baseline of other sizes or dtype (make's keywords)."""
    return lambda a: {**a, **make(**dims)}


def grad(x):
    return x.clone().requires_grad_()


def _noncontig(x):
    y = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert y.shape == x.shape and not y.is_contiguous()
    return y


def _meta(a):
    return {**a, **{n: a[n].to("meta") for n in TENSORS}}


H0 = torch.zeros(1, 2, 32, 32)
CU = torch.tensor([0, 4, 8])
SIG = dict(gate_activation="sigmoid_bound", gate_lower_bound=-5.0)

REJECTIONS = [
    # q: type, rank, dtype, every dimension, head dim, layout, device, gradient
    ("q_not_tensor", edit(q=lambda x: x.tolist()), "q", "4-d torch.Tensor"),
    ("q_3d", edit(q=lambda x: x[0]), "q", "4-d"),
    ("q_int", edit(q=lambda x: x.to(torch.int32)), "q", "not supported"),
    ("q_fp64", edit(q=lambda x: x.double()), "q", "not supported"),
    ("q_B0", shape(B=0), "q", "dimension B"),
    ("q_T0", shape(T=0), "q", "dimension T"),
    ("q_H0", shape(H=0), "q", "dimension H"),
    ("q_K0", shape(K=0), "q", "dimension K"),
    ("q_K257", shape(K=257), "q", "head dim 257 not supported (at most 256"),
    ("q_K512", shape(K=512, V=32), "q", "head dim 512"),
    ("q_bf16_cpu", shape(dtype=torch.bfloat16), "q", "bf16 on CPU"),
    ("q_meta", _meta, "q", "device meta not supported"),
    ("q_grad", edit(q=grad), "q", "requires grad"),
    # k
    ("k_not_tensor", edit(k=lambda x: x.numpy()), "k", "torch.Tensor"),
    ("k_none", opts(k=None), "k", "torch.Tensor"),
    ("k_3d", edit(k=lambda x: x[0]), "k", "expected shape"),
    ("k_heads", edit(k=lambda x: x[:, :, :1]), "k", "expected shape"),
    ("k_B0", edit(k=lambda x: x[:0]), "k", "expected shape"),
    ("k_dtype", edit(k=lambda x: x.float()), "k", "dtype"),
    ("k_device", edit(k=lambda x: x.to("meta")), "k", "on meta"),
    ("k_grad", edit(k=grad), "k", "requires grad"),
    # v
    ("v_not_tensor", opts(v=3.0), "v", "4-d torch.Tensor"),
    ("v_3d", edit(v=lambda x: x[0]), "v", "4-d"),
    ("v_T", edit(v=lambda x: x[:, :4]), "v", "expected shape"),
    ("v_batch", edit(v=lambda x: torch.cat([x, x])), "v", "expected shape"),
    ("v_T0", edit(v=lambda x: x[:, :0]), "v", "dimension T"),
    ("v_HV0", shape(HV=0), "v", "dimension HV"),
    ("v_V0", shape(V=0), "v", "dimension V"),
    ("v_HV_not_multiple", shape(H=2, HV=3), "v", "multiple of qk heads H=2"),
    ("v_V300", shape(V=300), "v", "head dim 300 not supported (at most 256"),
    ("v_dtype", edit(v=lambda x: x.to(torch.bfloat16)), "v", "dtype"),
    ("v_grad", edit(v=grad), "v", "requires grad"),
    # g
    ("g_not_tensor", opts(g=None), "g", "torch.Tensor"),
    ("g_3d", edit(g=lambda x: x[0]), "g", "expected shape"),
    ("g_scalar", edit(g=lambda x: x[..., 0]), "g", "a scalar gate [B, T, HV] is GDN's"),
    ("g_K", edit(g=lambda x: x[..., :16]), "g", "expected shape"),
    ("g_dtype", edit(g=lambda x: x.to(torch.bfloat16)), "g", "dtype"),
    ("g_grad", edit(g=grad), "g", "requires grad"),
    # beta
    ("beta_not_tensor", edit(beta=lambda x: x.numpy()), "beta", "torch.Tensor"),
    ("beta_4d", edit(beta=lambda x: x[..., None]), "beta", "expected shape"),
    ("beta_heads", edit(beta=lambda x: x[..., :1]), "beta", "expected shape"),
    ("beta_dtype", edit(beta=lambda x: x.double()), "beta", "dtype"),
    ("beta_grad", edit(beta=grad), "beta", "requires grad"),
    # scale: a finite real, or a 0-d CPU tensor
    ("scale_nan", opts(scale=math.nan), "scale", "finite number"),
    ("scale_inf", opts(scale=math.inf), "scale", "finite number"),
    ("scale_ninf", opts(scale=-math.inf), "scale", "finite number"),
    ("scale_np_nan", opts(scale=np.float32("nan")), "scale", "finite number"),
    ("scale_str", opts(scale="1.0"), "scale", "finite number"),
    ("scale_bool", opts(scale=True), "scale", "finite number"),
    ("scale_np_bool", opts(scale=np.bool_(True)), "scale", "finite number"),
    ("scale_list", opts(scale=[1.0]), "scale", "finite number"),
    ("scale_complex", opts(scale=1j), "scale", "finite number"),
    ("scale_1d_tensor", opts(scale=torch.tensor([0.5])), "scale", "0-d tensor"),
    ("scale_bool_tensor", opts(scale=torch.tensor(True)), "scale", "finite number"),
    ("scale_nan_tensor", opts(scale=torch.tensor(math.nan)), "scale", "finite number"),
    # meta stands in for CUDA here: any non-CPU 0-d tensor is refused, as reading it would sync
    ("scale_device_tensor", opts(scale=torch.tensor(0.5, device="meta")), "scale", "device sync"),
    ("scale_grad_tensor", opts(scale=torch.tensor(0.5, requires_grad=True)), "scale",
     "requires grad"),
    # gate options
    ("gate_activation", opts(gate_activation="relu"), "gate_activation", "'relu'"),
    ("lower_bound_softplus", opts(gate_activation="softplus", gate_lower_bound=-5.0),
     "gate_lower_bound", "None"),
    ("lower_bound_positive", opts(gate_lower_bound=1.0), "gate_lower_bound", "finite negative"),
    ("lower_bound_zero", opts(gate_lower_bound=0), "gate_lower_bound", "finite negative"),
    ("lower_bound_nan", opts(gate_lower_bound=math.nan), "gate_lower_bound", "finite negative"),
    ("lower_bound_bool", opts(gate_lower_bound=True), "gate_lower_bound", "finite negative"),
    ("lower_bound_str", opts(gate_lower_bound="-5"), "gate_lower_bound", "finite negative"),
    # A_log [HV] (or any shape of HV elements), dt_bias [HV * K] or [HV, K]; fp32
    ("A_log_unused", opts(A_log=torch.zeros(2)), "A_log", "sigmoid_bound"),
    ("A_log_numel", opts(**SIG, A_log=torch.zeros(3)), "A_log", "expected shape (2,)"),
    ("A_log_2x2", opts(**SIG, A_log=torch.zeros(2, 2)), "A_log", "expected shape (2,)"),
    ("A_log_3x1", opts(**SIG, A_log=torch.zeros(3, 1)), "A_log", "expected shape (2,)"),
    ("A_log_dtype", opts(**SIG, A_log=torch.zeros(2).half()), "A_log", "dtype"),
    ("A_log_list", opts(**SIG, A_log=[0.0, 0.0]), "A_log", "torch.Tensor"),
    ("A_log_device", opts(**SIG, A_log=torch.zeros(2, device="meta")), "A_log", "on meta"),
    ("A_log_grad", opts(**SIG, A_log=torch.zeros(2, requires_grad=True)), "A_log",
     "requires grad"),
    ("dt_bias_unused", opts(dt_bias=torch.zeros(64)), "dt_bias", "sigmoid_bound"),
    ("dt_bias_numel", opts(**SIG, dt_bias=torch.zeros(32)), "dt_bias", "expected shape (64,)"),
    ("dt_bias_KxHV", opts(**SIG, dt_bias=torch.zeros(32, 2)), "dt_bias", "or (HV, K)"),
    ("dt_bias_3d", opts(**SIG, dt_bias=torch.zeros(1, 2, 32)), "dt_bias", "expected shape"),
    ("dt_bias_dtype", opts(**SIG, dt_bias=torch.zeros(64).double()), "dt_bias", "dtype"),
    ("dt_bias_grad", opts(**SIG, dt_bias=torch.zeros(64, requires_grad=True)), "dt_bias",
     "requires grad"),
    ("dt_bias_softplus", opts(gate_activation="softplus", gate_lower_bound=None,
                              dt_bias=torch.zeros(2, 31)), "dt_bias", "expected shape"),
    # flags: exactly bool
    ("output_final_state", opts(output_final_state=1), "output_final_state", "must be a bool"),
    ("use_qk_l2norm", opts(use_qk_l2norm="yes"), "use_qk_l2norm", "must be a bool"),
    ("use_beta_sigmoid", opts(use_beta_sigmoid=None), "use_beta_sigmoid", "must be a bool"),
    ("output_chunk_states", opts(output_chunk_states=torch.tensor(True)), "output_chunk_states",
     "must be a bool"),
    ("allow_opt_in_str", opts(allow_opt_in="no"), "allow_opt_in", "must be a bool"),
    ("allow_opt_in_int", opts(allow_opt_in=1), "allow_opt_in", "must be a bool"),
    ("state_layout", opts(state_layout="KV"), "state_layout", "must be one of ('kv', 'vk')"),
    # initial_state [B or N, HV, K, V] (vk: [.., V, K]), fp32 or bf16
    ("initial_state_batch", opts(initial_state=torch.zeros(2, 2, 32, 32)), "initial_state",
     "expected shape"),
    ("initial_state_3d", opts(initial_state=torch.zeros(2, 32, 32)), "initial_state",
     "expected shape"),
    ("initial_state_dtype", opts(initial_state=H0.half()), "initial_state", "dtype"),
    ("initial_state_list", opts(initial_state=[[0.0]]), "initial_state", "torch.Tensor"),
    ("initial_state_vk", lambda a: {**a, **make(K=32, V=64), "state_layout": "vk",
                                    "initial_state": torch.zeros(1, 2, 32, 64)},
     "initial_state", "expected shape (1, 2, 64, 32)"),
    ("initial_state_kv", lambda a: {**a, **make(K=32, V=64),
                                    "initial_state": torch.zeros(1, 2, 64, 32)},
     "initial_state", "expected shape (1, 2, 32, 64)"),
    ("initial_state_varlen", opts(initial_state=H0, cu_seqlens=CU), "initial_state",
     "expected shape (2, 2, 32, 32)"),
    ("initial_state_device", opts(initial_state=H0.to("meta")), "initial_state", "on meta"),
    ("initial_state_grad", opts(initial_state=H0.clone().requires_grad_()), "initial_state",
     "requires grad"),
    # cu_seqlens: 1-d int64/int32 [N + 1] from 0 to T, non-decreasing, with B == 1
    ("cu_float", opts(cu_seqlens=CU.double()), "cu_seqlens", "int64 or torch.int32"),
    ("cu_int16", opts(cu_seqlens=CU.to(torch.int16)), "cu_seqlens", "int64 or torch.int32"),
    ("cu_list", opts(cu_seqlens=[0, 4, 8]), "cu_seqlens", "1-d tensor"),
    ("cu_2d", opts(cu_seqlens=CU[None]), "cu_seqlens", "1-d tensor"),
    ("cu_one_entry", opts(cu_seqlens=torch.tensor([0])), "cu_seqlens", "1-d tensor"),
    ("cu_start", opts(cu_seqlens=torch.tensor([1, 4, 8])), "cu_seqlens", "start at 0"),
    ("cu_decreasing", opts(cu_seqlens=torch.tensor([0, 6, 4, 8])), "cu_seqlens",
     "non-decreasing"),
    ("cu_past_T", opts(cu_seqlens=torch.tensor([0, 4, 9])), "cu_seqlens", "end at T=8"),
    ("cu_short_of_T", opts(cu_seqlens=torch.tensor([0, 4, 7])), "cu_seqlens", "end at T=8"),
    ("cu_batch", lambda a: {**a, **make(B=2), "cu_seqlens": CU}, "cu_seqlens", "B == 1"),
    ("cu_device", opts(cu_seqlens=CU.to("meta")), "cu_seqlens", "on meta"),
    ("cu_cpu_alone", opts(cu_seqlens_cpu=CU), "cu_seqlens_cpu", "without"),
    ("cu_cpu_int16", opts(cu_seqlens=CU, cu_seqlens_cpu=CU.to(torch.int16)), "cu_seqlens_cpu",
     "int64 or torch.int32"),
    ("cu_cpu_shape", opts(cu_seqlens=CU, cu_seqlens_cpu=torch.tensor([0, 8])), "cu_seqlens_cpu",
     "differs"),
    ("cu_cpu_not_on_cpu", opts(cu_seqlens=CU, cu_seqlens_cpu=CU.to("meta")), "cu_seqlens_cpu",
     "must be a CPU tensor"),
    # the host copy is what gets validated (never a device sync), and what the kernels then read
    ("cu_cpu_copy_bad", opts(cu_seqlens=CU, cu_seqlens_cpu=torch.tensor([0, 4, 9])), "cu_seqlens",
     "end at T=8"),
    ("target", opts(target="sm80"), "target", "'sm80'"),
    # max_seqlen: an int; with cu_seqlens an upper bound of the longest sequence (<= T), checked
    # against the host offsets; without them None or T
    ("max_seqlen_float", opts(cu_seqlens=CU, max_seqlen=4.0), "max_seqlen", "positive int"),
    ("max_seqlen_bool", opts(cu_seqlens=CU, max_seqlen=True), "max_seqlen", "positive int"),
    ("max_seqlen_tensor", opts(cu_seqlens=CU, max_seqlen=torch.tensor(4)), "max_seqlen",
     "positive int"),
    ("max_seqlen_zero", opts(cu_seqlens=CU, max_seqlen=0), "max_seqlen", "positive int"),
    ("max_seqlen_past_T", opts(cu_seqlens=CU, max_seqlen=9), "max_seqlen", "exceeds T=8"),
    ("max_seqlen_short", opts(cu_seqlens=torch.tensor([0, 1, 8]), max_seqlen=6), "max_seqlen",
     "shorter than the longest sequence of cu_seqlens (7 tokens)"),
    ("max_seqlen_short_cpu_copy", opts(cu_seqlens=torch.tensor([0, 4, 8]),
                                       cu_seqlens_cpu=torch.tensor([0, 1, 8]), max_seqlen=4),
     "max_seqlen", "(7 tokens)"),
    ("max_seqlen_fixed", opts(max_seqlen=4), "max_seqlen", "pass None or 8, got 4"),
    # a sparse tensor anywhere a tensor goes: named, not a RuntimeError from its data pointer
    ("q_sparse", edit(q=lambda x: x.to_sparse()), "q", "dense (strided)"),
    ("beta_sparse", edit(beta=lambda x: x.to_sparse()), "beta", "dense (strided)"),
    ("A_log_sparse", opts(gate_activation="softplus", A_log=torch.zeros(2).to_sparse()), "A_log",
     "dense (strided)"),
    ("h0_sparse", opts(initial_state=H0.to_sparse()), "initial_state", "dense (strided)"),
    ("cu_sparse", opts(cu_seqlens=CU.to_sparse()), "cu_seqlens", "dense (strided)"),
    ("slots_sparse", opts(initial_state=torch.zeros(4, 2, 32, 32), cu_seqlens=CU,
                          initial_state_indices=torch.tensor([0, 1]).to_sparse()),
     "initial_state_indices", "dense (strided)"),
]  # fmt: skip


@pytest.mark.parametrize("mutate,name,fragment", [r[1:] for r in REJECTIONS],
                         ids=[r[0] for r in REJECTIONS])  # fmt: skip
def test_rejections(no_launch, mutate, name, fragment):
    expect(name, mutate(make()), fragment)


def test_rejection_ids_are_unique():
    ids = [r[0] for r in REJECTIONS]
    assert len(ids) == len(set(ids))


# --- accepted forms --------------------------------------------------------------------------


def prepared(args: dict, **kwargs):
    """The (problem, Call) ``kda_prefill`` would launch with (no launch)."""
    full = {**dict.fromkeys(inspect.signature(api._prepare).parameters), **_PREPARE_DEFAULTS}
    return api._prepare(**{**full, **args, **kwargs})


def test_segments_are_planned_for_the_longest_sequence(no_launch):
    """NSEG (segments per sequence, and so the workspace) counts the longest sequence of the
    host offsets, not the packed length: one 300-token sequence among short ones gets 3
    segments of 8 chunks of 16, not the 5 its 600 packed tokens would give every sequence."""
    from kreg.families.kda.runtime_args import segment_count

    cu = torch.tensor([0, 300, 400, 500, 600])
    _, c = prepared(make(T=600), cu_seqlens=cu)
    assert launch._scan_scalars(c, 16, 8)["NSEG"] == segment_count(300, 16, 8) == 3
    assert segment_count(600, 16, 8) == 5
    _, fixed = prepared(make(B=2, T=300))
    assert launch._scan_scalars(fixed, 16, 8)["NSEG"] == 3


_PREPARE_DEFAULTS = dict(
    output_final_state=False, gate_lower_bound=-5.0, gate_activation="none",
    use_qk_l2norm=False, use_beta_sigmoid=False, state_layout="kv", output_chunk_states=False,
    chunk_states_size=64, chunk_states_dtype=torch.float32,
)  # fmt: skip


def test_bf16_initial_state_accepted(no_launch):
    with pytest.raises(Launched):
        call(make(dtype=torch.float32), initial_state=torch.zeros(1, 2, 32, 32).bfloat16())


def test_gqa_shapes_accepted(no_launch):
    with pytest.raises(Launched):
        call(make(H=1, HV=2))


@pytest.mark.parametrize(
    "scale", [2, 0.25, np.float32(0.25), np.float64(0.25), np.int64(2), torch.tensor(0.25),
              torch.tensor(2), torch.tensor(0.25, dtype=torch.float64)],
    ids=["int", "float", "np_float32", "np_float64", "np_int64", "tensor", "int_tensor",
         "fp64_tensor"],
)  # fmt: skip
def test_scale_forms_accepted(no_launch, scale):
    _, c = prepared(make(), scale=scale)
    assert type(c.scale) is float and c.scale == float(scale)
    with pytest.raises(Launched):
        call(make(), scale=scale)


@pytest.mark.parametrize("act", ["sigmoid_bound", "softplus"])
def test_engine_gate_param_shapes_accepted(no_launch, act):
    """vLLM-style A_log [1, 1, HV, 1] and dt_bias [HV, K] are viewed in the kernels' layout."""
    bound = None if act == "softplus" else -5.0
    A_log = torch.arange(2.0).reshape(1, 1, 2, 1)
    dt_bias = torch.arange(64.0).reshape(2, 32)
    _, c = prepared(make(), gate_activation=act, gate_lower_bound=bound, A_log=A_log,
                    dt_bias=dt_bias)  # fmt: skip
    assert c.A_log.shape == (2,) and c.A_log.tolist() == [0.0, 1.0]
    assert c.dt_bias.shape == (64,) and c.dt_bias.tolist() == list(range(64))
    _, c = prepared(make(), gate_activation=act, gate_lower_bound=bound)
    assert c.A_log.shape == (2,) and c.dt_bias.shape == (64,)  # neutral defaults


def test_gradient_is_refused_not_dropped(no_launch):
    """A call autograd would record raises, instead of returning outputs whose backward silently
    gives x no gradient through kda_prefill."""
    args = make(dtype=torch.float32)
    x = args["q"].clone().requires_grad_()
    with pytest.raises(
        ValueError, match="^q: requires grad; kreg.s delta-rule kernels .* have no backward yet"
    ):
        (call({**args, "q": x * 1})[0] + x).sum().backward()
    assert x.grad is None
    with torch.no_grad(), pytest.raises(Launched):  # validation passes: it would run
        call({**args, "q": x * 1})
    with torch.inference_mode(), pytest.raises(Launched):
        call({**args, "q": x})


# --- strides -----------------------------------------------------------------------------------


@pytest.mark.parametrize("K", [32, 12], ids=["native", "padded"])
def test_any_strides_reach_the_kernels_as_one_contiguous_copy(no_launch, K):
    """Non-contiguous inputs are served: the Call the kernels get holds contiguous tensors of
    the same values (one copy; the padding's copy where K is padded), contiguous ones as they
    are (no copy)."""
    args = make(K=K)
    gate = dict(A_log=torch.zeros(2, 2)[:, 0], dt_bias=torch.randn(K, 2).t())
    h0 = torch.randn(1, 2, 32, K).transpose(-1, -2)
    strided = {n: _noncontig(t) for n, t in args.items()}
    strided["beta"] = torch.stack([args["beta"], args["beta"]], -1)[..., 0]
    assert not any(x.is_contiguous() for x in (*strided.values(), *gate.values(), h0))
    _, c = prepared(strided, initial_state=h0, output_final_state=True, **gate, **SIG)
    got = (c.q, c.k, c.v, c.g, c.beta, c.A_log, c.dt_bias, c.initial_state)
    assert all(t.is_contiguous() for t in got)
    got = (*got[:6], c.dt_bias.view(2, -1), got[7])  # [HV * K] compared as [HV, K]
    want = (*(args[n] for n in TENSORS), gate["A_log"], gate["dt_bias"], h0)
    for t, w in zip(got, want, strict=True):
        if K == 32 or t.shape == w.shape:
            assert torch.equal(t, w)
        else:  # padded: the real values lead, then zeros (-inf for dt_bias)
            assert torch.equal(t[tuple(slice(0, n) for n in w.shape)], w)
    if K == 32:
        _, c = prepared(args, initial_state=h0.contiguous(), output_final_state=True, **SIG)
        assert all(getattr(c, n) is args[n] for n in TENSORS)  # contiguous: not copied
    with pytest.raises(Launched):
        call(strided, initial_state=h0, output_final_state=True, **gate, **SIG)


# --- cu_seqlens --------------------------------------------------------------------------------


def test_cu_seqlens_zero_length_sequences_accepted(no_launch):
    with pytest.raises(Launched):
        call(make(), cu_seqlens=torch.tensor([0, 0, 8, 8]))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("with_cpu_copy", [False, True])
def test_int32_and_int64_offsets(no_launch, dtype, with_cpu_copy):
    cu = torch.tensor([0, 3, 8], dtype=dtype)
    kw = dict(cu_seqlens=cu, cu_seqlens_cpu=cu.clone() if with_cpu_copy else None)
    problem, c = prepared(make(), **kw)
    assert problem.varlen and problem.num_seqs == 2
    for t in (c.cu_seqlens, c.cu_seqlens_host):
        assert t.dtype == torch.int64 and t.tolist() == [0, 3, 8]
    with pytest.raises(Launched):
        call(make(), **{k: v for k, v in kw.items() if v is not None})


@pytest.mark.parametrize(
    "kw,longest",
    [(dict(cu_seqlens=torch.tensor([0, 1, 8])), 7),
     (dict(cu_seqlens=torch.tensor([0, 1, 8], dtype=torch.int32)), 7),
     # with cu_seqlens_cpu the values of cu_seqlens are not read: the host copy decides
     (dict(cu_seqlens=torch.tensor([0, 4, 8]), cu_seqlens_cpu=torch.tensor([0, 6, 8])), 6),
     (dict(cu_seqlens=torch.tensor([0, 1, 8]), max_seqlen=7), 7),
     (dict(cu_seqlens=torch.tensor([0, 1, 8]), max_seqlen=np.int64(8)), 8),  # an upper bound
     (dict(cu_seqlens=torch.tensor([0, 0, 8, 8])), 8),
     (dict(max_seqlen=8), None), (dict(), None)],
    ids=["cpu", "int32", "cpu_copy", "exact", "bound", "empty_seqs", "fixed_T", "fixed"],
)  # fmt: skip
def test_the_problem_carries_the_longest_sequence(no_launch, kw, longest):
    """With cu_seqlens the problem carries the longest sequence (what the scan's chain length
    and the tuning bucket follow), from the host copy or the explicit bound; fixed-length
    problems carry None (every row is T long)."""
    problem, _ = prepared(make(), **kw)
    assert problem.max_seqlen == longest
    assert problem.longest_seq == (longest or 8)
    with pytest.raises(Launched):
        call(make(), **kw)


def test_kernels_read_the_validated_host_copy(no_launch):
    """With cu_seqlens_cpu the device tensor's values are never read: out-of-range or merely
    different device offsets cannot reach a kernel (they once read out of bounds, or silently
    won over the validated copy)."""
    host = torch.tensor([0, 3, 8], dtype=torch.int32)
    for device_values in ([0, 50, 1000], [0, 5, 8], [7, 1, -4]):
        problem, c = prepared(make(), cu_seqlens=torch.tensor(device_values),
                              cu_seqlens_cpu=host)  # fmt: skip
        assert c.cu_seqlens.tolist() == [0, 3, 8] and c.cu_seqlens.dtype == torch.int64
        assert c.cu_seqlens_host.tolist() == [0, 3, 8]


# --- target, algorithm, device -----------------------------------------------------------------


def test_unknown_algorithm(no_launch):
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        call(make(), algorithm="nope")


def test_known_target_string_accepted(no_launch):
    with pytest.raises(Launched):
        call(make(), target="gfx950")


def test_select_wants_a_bool_allow_opt_in():
    for value in ("no", 0, None):
        with pytest.raises(ValueError, match="^allow_opt_in: must be a bool"):
            select(_default_problem(), "sm90", allow_opt_in=value)


@pytest.mark.parametrize(
    "field,value",
    [("qk_l2norm", "no"), ("beta_sigmoid", 1), ("initial_state", None), ("varlen", "yes"),
     ("output_final_state", np.bool_(True)), ("output_chunk_states", 0), ("num_seqs", True),
     ("batch", 0), ("heads_qk", True), ("dtype", "fp8")],
)  # fmt: skip
def test_problem_fields_are_validated(field, value):
    """What kda_prefill builds is checked again where the dispatcher keys on it."""
    kw = {"varlen": True} if field == "num_seqs" else {}
    with pytest.raises(ValueError, match=f"^{field} must be"):
        _default_problem(**kw, **{field: value})


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"), reason="needs a non-interpreter run"
)
def test_cpu_without_interpreter(monkeypatch):
    def boom(*args, **kwargs):
        raise Launched

    monkeypatch.setattr(launch, "run_split", boom)
    monkeypatch.setattr(launch, "run_recurrent", boom)
    expect("q", make(), "TRITON_INTERPRET=1")
    expect("q", make(dtype=torch.float32), "TRITON_INTERPRET=1")


# --- the dispatcher's choice, as `kreg explain` shows it ----------------------------------------


def _default_problem(**kw):
    base = dict(batch=1, seq_len=2048, heads_qk=32, heads_v=32, head_dim_k=128, head_dim_v=128)
    return LinearAttentionProblem(**{**base, **kw})


def _served_by_both(target):
    """The default problem; head dim 64 on gfx950, where fused has no head-dim-128 spec."""
    if target == "sm90":
        return _default_problem()
    return _default_problem(head_dim_k=64, head_dim_v=64)


@pytest.mark.parametrize("target", ["sm90", "gfx950"])
def test_default_problem_selects_split(target):
    sel = select(_served_by_both(target), target)
    assert sel.candidate.name == "kda.split"
    fused = [e for e in sel.trace if e.candidate == "kda.fused"]
    assert [(e.stage, e.ok) for e in fused] == [
        ("problem", True),
        ("target", True),
        ("spec", True),
        ("ranked", False),
    ]
    split_ranked = [e for e in sel.trace if e.candidate == "kda.split" and e.stage == "ranked"]
    assert len(split_ranked) == 1 and split_ranked[0].ok
    assert split_ranked[0].reason.startswith("selected (priority 10)")
    # pinning makes the fused candidate serve (head dim 64: fused has no spec at 128 on gfx950)
    small = _default_problem(head_dim_k=64, head_dim_v=64)
    assert select(small, target, algorithm="fused").candidate.name == "kda.fused"
    assert select(small, target, algorithm="kda.fused").candidate.name == "kda.fused"


@pytest.mark.parametrize("target", ["sm90", "gfx950"])
def test_trace_says_fused_is_opt_in(target):
    sel = select(_served_by_both(target), target)
    fused = [e for e in sel.trace if e.candidate == "kda.fused" and e.stage == "ranked"]
    assert fused[0].reason == f"opt-in: {FUSED_OPT_IN_REASON}"
    # allowed, it still ranks below split (priority 5 < 10): only pinning runs it
    allowed = select(_served_by_both(target), target, allow_opt_in=True)
    assert allowed.candidate.name == "kda.split"
    fused = [e for e in allowed.trace if e.candidate == "kda.fused" and e.stage == "ranked"]
    assert fused[0].reason.startswith("outranked by kda.split")


def test_split_and_fused_pair_up_for_the_default_problem():
    """The fused spec the dispatcher picks shares its tile spec with the split pick (bitwise pair)."""
    split = select(_default_problem(), "sm90").spec
    fused = select(_default_problem(), "sm90", algorithm="fused").spec
    assert split.tile == fused.tile
    assert fused.scan.block_v == 128


def test_the_default_problem_is_unbounded_and_takes_the_safe_anchor():
    assert _default_problem().gate_lower_bound is None
    assert inspect.signature(api.kda_prefill).parameters["gate_lower_bound"].default is None
    sel = select(_default_problem(), "sm90")
    assert sel.candidate.name == "kda.split" and sel.spec.tile.anchor == "safe"
    bounded = select(_default_problem(gate_lower_bound=-5.0), "sm90")
    assert bounded.spec.tile.anchor == "block"


# --- a selection runs through its candidate ----------------------------------------------------


def test_every_kda_candidate_runs_its_own_launcher(no_launch):
    """Each candidate's ``run`` reaches its own launcher (patched to raise here)."""
    from kreg.families.kda.plugin import FAMILY

    for candidate in FAMILY.candidates:
        with pytest.raises(Launched):
            candidate.run(None, None)
    names = {c.name: c.run.__name__ for c in FAMILY.candidates}
    assert names == {"kda.split": "run_split", "kda.recurrent": "run_recurrent",
                     "kda.fused": "run_fused"}  # fmt: skip


@pytest.mark.parametrize("pad,algorithm", [(False, "auto"), (True, "kda.split"),
                                           (True, "kda.recurrent")])  # fmt: skip
def test_run_selection_goes_through_the_candidate_not_its_name(pad, algorithm, monkeypatch):
    """A candidate renamed and given another ``run`` is run as it is (no switch on names), on
    the caller's tensors (masked tiles) or their zero-padded copies, and its outputs come back
    at the caller's head dims."""
    import attrs

    monkeypatch.setattr(api, "interpreting", lambda: True)  # CPU tensors pass the device check
    args = make(K=24, V=24) if pad else make()
    problem, prepared = api._prepare(**args, output_final_state=True)
    sel = select(problem, "sm90", algorithm=algorithm)
    seen = []

    def run(call, spec):
        seen.append((call, spec))
        V, K = call.v.shape[-1], call.k.shape[-1]
        return call.v.clone(), torch.zeros(1, call.v.shape[2], K, V), None

    renamed = attrs.evolve(sel.candidate, name="elsewhere.other", run=run)
    o, ht = api.run_selection(attrs.evolve(sel, candidate=renamed), prepared, problem)
    [(call, spec)] = seen
    assert spec == sel.spec
    assert reads_caller_dims(spec) == (pad and algorithm == "kda.split")
    if reads_caller_dims(spec) or not pad:
        assert call is prepared  # the caller's tensors as prepared
    else:  # a spec without masked tiles runs on zero-padded copies
        assert (call.k.shape[-1], call.v.shape[-1]) == (32, 32)
        assert torch.equal(call.v[..., :24], prepared.v) and not call.v[..., 24:].any()
    assert o.shape == args["v"].shape and ht.shape[-2:] == (problem.head_dim_k, problem.head_dim_v)


# --- pooled prefill: the chunked form's gather and scatter (plain torch, no device sync) ---------


def test_gather_slots_reads_slots_zeros_for_negative_nan_past_the_pool():
    pool = torch.arange(3 * 2 * 2 * 2, dtype=torch.float32).view(3, 2, 2, 2)
    got = launch.gather_slots(pool, torch.tensor([2, -1, 3, 0]))
    assert torch.equal(got[0], pool[2]) and torch.equal(got[3], pool[0])
    assert torch.equal(got[1], torch.zeros_like(pool[0])) and got[2].isnan().all()
    empty = launch.gather_slots(pool[:0], torch.tensor([-1, 0]))
    assert (empty[0] == 0).all() and empty[1].isnan().all()


def test_scatter_slots_writes_only_valid_slots_whatever_the_clamped_duplicates():
    """A negative slot clamps onto slot 0 and a slot past the pool onto the last one; both are
    owned by valid sequences here, so a clamped row must store the owner's state, not the old
    value (index_copy_ of differing duplicates would let either win)."""
    P = 5
    pool = torch.randn(P, 2, 4, 4)
    before = pool.clone()
    slots = torch.tensor([0, -1, P, 4, -7])
    final = torch.randn(len(slots), 2, 4, 4)
    launch.scatter_slots(pool, slots, final)
    assert torch.equal(pool[0], final[0]) and torch.equal(pool[4], final[3])
    for slot in (1, 2, 3):
        assert torch.equal(pool[slot], before[slot])
    lone = before.clone()  # a clamped row onto a slot nobody owns keeps that slot's value
    launch.scatter_slots(lone, torch.tensor([-1, 2]), final[:2])
    assert torch.equal(lone[0], before[0]) and torch.equal(lone[2], final[1])


def test_a_strided_pool_is_refused_before_launch(no_launch):
    """A pool is written in place: a strided one would be read through a contiguous copy and
    the writes lost, so it is refused by name (removing the check lets the call launch)."""
    pool = torch.zeros(4, 2, 32, 32).transpose(-1, -2)  # [P, HV, K, V] by shape, strided
    with pytest.raises(ValueError, match="^initial_state: a state pool must be contiguous"):
        call(make(B=2), initial_state=pool, initial_state_indices=torch.tensor([0, 1]))
    with pytest.raises(Launched):  # the same pool, contiguous, reaches the launch
        call(make(B=2), initial_state=pool.contiguous(), initial_state_indices=torch.tensor([0, 1]))


@pytest.mark.parametrize("shape,fill", [((2, 3, 4, 128), 0.0), ((3, 2, 128, 64), 0.0),
                                        ((4, 128), float("-inf"))])  # fmt: skip
def test_padded_copy_is_the_input_in_the_corner_and_fill_elsewhere(shape, fill):
    """The padding copy fills only the padding; every byte of the result is the input's or the
    fill (a mutation that skips a padded dim's fill leaves uninitialised memory: caught)."""
    small = tuple(max(1, n - 37) if n >= 64 else n for n in shape)
    x = torch.randn(*small[::-1]).T if len(small) == 2 else torch.randn(*small)  # strided too
    for _ in range(3):  # fresh allocations may reuse memory holding anything
        torch.full(shape, float("nan")).sum()
        out = api._padded_copy(x, shape, fill)
        ref = torch.full(shape, fill)
        ref[tuple(slice(0, n) for n in x.shape)] = x
        assert out.shape == shape and out.is_contiguous()
        assert torch.equal(out, ref)
