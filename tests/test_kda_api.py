"""``kda_prefill`` argument validation: every bad input is a ValueError naming the argument, raised
before any kernel launch; and the dispatcher's choice for the default KDA problem.

Runs in the main (non-interpreter) process. CPU tensors need ``TRITON_INTERPRET=1``, which this
process must not set, so most tests patch ``api.interpreting`` to let CPU tensors through the
device check; the launchers are patched to fail the test if validation ever lets a call reach them.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from kreg.dispatch import select
from kreg.families.kda import api, launch
from kreg.families.kda.plugin import FUSED_OPT_IN_REASON
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
    return api.kda_prefill(
        args.pop("q"), args.pop("k"), args.pop("v"), args.pop("g"), args.pop("beta"), **kwargs
    )


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
        dict(gate_activation="sigmoid_bound", A_log=torch.zeros(2), dt_bias=torch.zeros(64)),
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


# --- tensors -------------------------------------------------------------------------------------


def _with(**changes):
    def edit(args):
        args = dict(args)
        for key, fn in changes.items():
            args[key] = fn(args[key])
        return args

    return edit


def _noncontig(x):
    y = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert y.shape == x.shape and not y.is_contiguous()
    return y


TENSOR_CASES = [
    # (id, edit, argument named, message fragment)
    ("q_3d", _with(q=lambda x: x[0]), "q", "4-d"),
    ("q_not_tensor", _with(q=lambda x: x.tolist()), "q", "4-d"),
    ("q_int", _with(q=lambda x: x.to(torch.int32)), "q", "not supported"),
    ("q_T0", _with(q=lambda x: x[:, :0]), "q", "must be positive"),
    ("k_shape", _with(k=lambda x: x[:, :, :1]), "k", "expected shape"),
    ("k_3d", _with(k=lambda x: x[0]), "k", "expected shape"),
    ("k_not_tensor", _with(k=lambda x: x.numpy()), "k", "torch.Tensor"),
    ("v_3d", _with(v=lambda x: x[0]), "v", "4-d"),
    ("v_T", _with(v=lambda x: x[:, :4]), "v", "expected shape"),
    ("v_batch", _with(v=lambda x: torch.cat([x, x])), "v", "expected shape"),
    ("g_shape", _with(g=lambda x: x[..., :16]), "g", "expected shape"),
    ("g_3d", _with(g=lambda x: x[0]), "g", "expected shape"),
    ("beta_4d", _with(beta=lambda x: x[..., None]), "beta", "expected shape"),
    ("beta_heads", _with(beta=lambda x: x[..., :1]), "beta", "expected shape"),
    ("k_dtype", _with(k=lambda x: x.float()), "k", "dtype"),
    ("v_dtype", _with(v=lambda x: x.to(torch.bfloat16)), "v", "dtype"),
    ("g_dtype", _with(g=lambda x: x.to(torch.bfloat16)), "g", "dtype"),
    ("beta_dtype", _with(beta=lambda x: x.double()), "beta", "dtype"),
    ("q_noncontig", _with(q=_noncontig), "q", "contiguous"),
    ("k_noncontig", _with(k=_noncontig), "k", "contiguous"),
    ("v_noncontig", _with(v=_noncontig), "v", "contiguous"),
    ("g_noncontig", _with(g=_noncontig), "g", "contiguous"),
    ("beta_noncontig", _with(beta=_noncontig), "beta", "contiguous"),
    ("k_device", _with(k=lambda x: x.to("meta")), "k", "on meta"),
]


@pytest.mark.parametrize("edit,name,fragment", [c[1:] for c in TENSOR_CASES],
                         ids=[c[0] for c in TENSOR_CASES])  # fmt: skip
def test_bad_tensors(no_launch, edit, name, fragment):
    expect(name, edit(make()), fragment)


def test_heads_and_head_dims(no_launch):
    expect("v", make(H=2, HV=3), "multiple of qk heads H=2")
    expect("q", make(K=48), "head dim 48 not supported")
    expect("v", make(V=48), "head dim 48 not supported")
    expect("q", make(K=512, V=32), "head dim 512")


def test_gqa_shapes_accepted(no_launch):
    with pytest.raises(Launched):
        call(make(H=1, HV=2))


# --- scalars and options -----------------------------------------------------------------------


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf, "1.0", True, [1.0]])
def test_bad_scale(no_launch, scale):
    expect("scale", make(), "finite number", scale=scale)


def test_bad_gate_activation(no_launch):
    expect("gate_activation", make(), "'relu'", gate_activation="relu")


def test_softplus_with_a_lower_bound(no_launch):
    expect("gate_lower_bound", make(), "None", gate_activation="softplus")
    expect("gate_lower_bound", make(), "None", gate_activation="softplus", gate_lower_bound=-5.0)


@pytest.mark.parametrize("bound", [1.0, 0.0, 0, math.nan, -math.inf, True, "-5"])
def test_bad_lower_bound(no_launch, bound):
    expect("gate_lower_bound", make(), "finite negative", gate_lower_bound=bound)


def test_gate_params_without_activation(no_launch):
    expect("A_log", make(), "sigmoid_bound", A_log=torch.zeros(2))
    expect("dt_bias", make(), "sigmoid_bound", dt_bias=torch.zeros(64))


@pytest.mark.parametrize("act", ["sigmoid_bound", "softplus"])
def test_bad_gate_params(no_launch, act):
    kw = dict(gate_activation=act)
    if act == "softplus":
        kw["gate_lower_bound"] = None
    expect("A_log", make(), "expected shape (2,)", A_log=torch.zeros(3), **kw)
    expect("A_log", make(), "expected shape (2,)", A_log=torch.zeros(2, 1), **kw)
    expect("A_log", make(), "dtype", A_log=torch.zeros(2, dtype=torch.float16), **kw)
    expect("dt_bias", make(), "expected shape (64,)", dt_bias=torch.zeros(2, 32), **kw)
    expect("dt_bias", make(), "expected shape (64,)", dt_bias=torch.zeros(32), **kw)
    expect("dt_bias", make(), "dtype", dt_bias=torch.zeros(64, dtype=torch.float64), **kw)


def test_bad_state_layout(no_launch):
    expect("state_layout", make(), "'kv' or 'vk'", state_layout="KV")


def test_bad_initial_state(no_launch):
    expect("initial_state", make(), "expected shape", initial_state=torch.zeros(2, 2, 32, 32))
    expect("initial_state", make(), "expected shape", initial_state=torch.zeros(2, 32, 32))
    expect("initial_state", make(), "dtype", initial_state=torch.zeros(1, 2, 32, 32).half())
    expect("initial_state", make(), "torch.Tensor", initial_state=[[0.0]])
    # K != V: the layout decides the shape
    args = make(K=32, V=64)
    expect("initial_state", args, "expected shape (1, 2, 64, 32)",
           initial_state=torch.zeros(1, 2, 32, 64), state_layout="vk")  # fmt: skip
    expect("initial_state", args, "expected shape (1, 2, 32, 64)",
           initial_state=torch.zeros(1, 2, 64, 32))  # fmt: skip
    # varlen: one state per sequence, not per batch row
    expect("initial_state", make(), "expected shape (2, 2, 32, 32)",
           initial_state=torch.zeros(1, 2, 32, 32), cu_seqlens=torch.tensor([0, 4, 8]))  # fmt: skip


def test_bf16_initial_state_accepted(no_launch):
    with pytest.raises(Launched):
        call(make(dtype=torch.float32), initial_state=torch.zeros(1, 2, 32, 32).bfloat16())


@pytest.mark.parametrize(
    "flag", ["output_final_state", "use_qk_l2norm", "use_beta_sigmoid", "output_chunk_states"]
)
@pytest.mark.parametrize("value", [1, "yes", None, torch.tensor(True)])
def test_non_bool_flags(no_launch, flag, value):
    expect(flag, make(), "must be a bool", **{flag: value})


# --- cu_seqlens --------------------------------------------------------------------------------

CU_CASES = [
    ("int32", dict(cu_seqlens=torch.tensor([0, 4, 8], dtype=torch.int32)), "cu_seqlens", "int64"),
    ("float", dict(cu_seqlens=torch.tensor([0.0, 4.0, 8.0])), "cu_seqlens", "int64"),
    ("list", dict(cu_seqlens=[0, 4, 8]), "cu_seqlens", "1-d tensor"),
    ("2d", dict(cu_seqlens=torch.tensor([[0, 4, 8]])), "cu_seqlens", "1-d tensor"),
    ("one_entry", dict(cu_seqlens=torch.tensor([0])), "cu_seqlens", "1-d tensor"),
    ("start", dict(cu_seqlens=torch.tensor([1, 4, 8])), "cu_seqlens", "start at 0"),
    ("decreasing", dict(cu_seqlens=torch.tensor([0, 6, 4, 8])), "cu_seqlens", "non-decreasing"),
    ("past_T", dict(cu_seqlens=torch.tensor([0, 4, 9])), "cu_seqlens", "end at T=8"),
    ("short_of_T", dict(cu_seqlens=torch.tensor([0, 4, 7])), "cu_seqlens", "end at T=8"),
    ("cpu_alone", dict(cu_seqlens_cpu=torch.tensor([0, 4, 8])), "cu_seqlens_cpu", "without"),
    ("cpu_int32", dict(cu_seqlens=torch.tensor([0, 4, 8]),
                       cu_seqlens_cpu=torch.tensor([0, 4, 8], dtype=torch.int32)),
     "cu_seqlens_cpu", "int64"),
    ("cpu_shape", dict(cu_seqlens=torch.tensor([0, 4, 8]), cu_seqlens_cpu=torch.tensor([0, 8])),
     "cu_seqlens_cpu", "differs"),
    ("cpu_not_on_cpu", dict(cu_seqlens=torch.tensor([0, 4, 8]),
                            cu_seqlens_cpu=torch.tensor([0, 4, 8], device="meta")),
     "cu_seqlens_cpu", "must be a CPU tensor"),
    # a host copy that disagrees is what gets validated (never a device sync)
    ("cpu_copy_bad", dict(cu_seqlens=torch.tensor([0, 4, 8]),
                          cu_seqlens_cpu=torch.tensor([0, 4, 9])), "cu_seqlens", "end at T=8"),
]  # fmt: skip


@pytest.mark.parametrize("kwargs,name,fragment", [c[1:] for c in CU_CASES],
                         ids=[c[0] for c in CU_CASES])  # fmt: skip
def test_bad_cu_seqlens(no_launch, kwargs, name, fragment):
    expect(name, make(), fragment, **kwargs)


def test_cu_seqlens_needs_batch_one(no_launch):
    expect("cu_seqlens", make(B=2), "B == 1", cu_seqlens=torch.tensor([0, 4, 8]))


def test_cu_seqlens_zero_length_sequences_accepted(no_launch):
    with pytest.raises(Launched):
        call(make(), cu_seqlens=torch.tensor([0, 0, 8, 8]))


# --- target, algorithm, device -----------------------------------------------------------------


def test_unknown_target(no_launch):
    expect("target", make(), "'sm80'", target="sm80")


def test_unknown_algorithm(no_launch):
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        call(make(), algorithm="nope")


def test_known_target_string_accepted(no_launch):
    with pytest.raises(Launched):
        call(make(), target="gfx950")


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"), reason="needs a non-interpreter run"
)
def test_cpu_without_interpreter(monkeypatch):
    def boom(*args, **kwargs):
        raise Launched

    monkeypatch.setattr(launch, "run_split", boom)
    expect("q", make(), "TRITON_INTERPRET=1")
    expect("q", make(dtype=torch.float32), "TRITON_INTERPRET=1")


def test_bf16_on_cpu_rejected(no_launch):
    expect("q", make(dtype=torch.bfloat16), "bf16 on CPU")


def test_unsupported_device(no_launch):
    args = {k: v.to("meta") for k, v in make().items()}
    expect("q", args, "device meta not supported")


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


def test_unbounded_gates_select_the_row_anchor_and_say_why():
    sel = select(_default_problem(gate_lower_bound=None), "sm90")
    assert sel.candidate.name == "kda.split"
    assert sel.spec.tile.anchor == "row"
    spec_stage = [e.reason for e in sel.trace if e.candidate == "kda.split" and e.stage == "spec"]
    assert "unbounded gates" in spec_stage[0] and "anchor='row'" in spec_stage[0]
