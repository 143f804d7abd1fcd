"""``kreg::kda_prefill`` custom op under the Triton interpreter (CPU tensors).

The op's outputs equal ``kda_prefill``'s bit for bit; the fake implementation's shapes equal the
real ones; ``torch.library.opcheck`` passes; ``torch.compile(fullgraph=True)`` (no graph breaks)
gives the same result. Small shapes (K = V = 32, T = 40): the interpreter runs on a 2-core CPU.

The checks take a ``Prefill`` (an entry, its op's wrapper, its gate kind), the tests here KDA's;
``test_gdn_torch_op.py`` runs them on ``kreg::gdn_prefill``, made by the same factory.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kreg.families.kda import api, torch_op
from kreg.families.kda.torch_op import kda_prefill_op
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

FP16, FP32 = torch.float16, torch.float32
T = 40


class Prefill(NamedTuple):
    """A family's prefill entry, the wrapper of its custom op, and its gate kind."""

    entry: object
    wrapper: object
    gate: str

    def raw(self, *args, **kwargs):
        """The raw op, ``torch.ops.kreg.<entry>``: three tensors."""
        return getattr(torch.ops.kreg, self.entry.__name__)(*args, **kwargs)


KDA = Prefill(api.kda_prefill, kda_prefill_op, "per_channel")


def make(B=1, H=1, HV=None, K=32, V=32, dtype=FP16, seed=0, gate="per_channel"):
    HV = HV or H
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -5.0 * torch.rand(B, T, HV, *([K] if gate == "per_channel" else []), generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    return dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g.to(dtype), beta=beta.to(dtype))


def h0(n, HV, K=32, V=32, seed=1):
    return 0.5 * torch.randn(n, HV, K, V, generator=torch.Generator().manual_seed(seed))


def dt_bias(HV, gate, K=32):
    """dt_bias of the gate kind: [HV, K] (as HV * K elements) per channel, [HV] scalar."""
    return torch.full((HV * (K if gate == "per_channel" else 1),), 0.1)


CU = torch.tensor([0, 9, 9, 40])  # three sequences, one empty
# case: (dtype, gate kind) -> (the five tensors, the call's keywords)
CASES = {
    "plain": lambda dt, gate: (make(B=2, H=2, dtype=dt, gate=gate), dict(output_final_state=True)),
    "gqa_h0": lambda dt, gate: (make(B=1, H=1, HV=2, dtype=dt, gate=gate),
                                dict(initial_state=h0(1, 2), output_final_state=True)),
    "vk": lambda dt, gate: (make(B=1, H=1, dtype=dt, gate=gate),
                            dict(initial_state=h0(1, 1), output_final_state=True,
                                 state_layout="vk")),
    "varlen": lambda dt, gate: (make(B=1, H=1, HV=2, dtype=dt, gate=gate),
                                dict(cu_seqlens=CU, cu_seqlens_cpu=CU, initial_state=h0(3, 2),
                                     output_final_state=True)),
    "no_final": lambda dt, gate: (make(B=1, H=1, dtype=dt, gate=gate), dict()),
    "chunk_states": lambda dt, gate: (make(B=2, H=1, dtype=dt, gate=gate),
                                      dict(output_final_state=True, output_chunk_states=True)),
    "gate_act": lambda dt, gate: (make(B=1, H=1, dtype=dt, gate=gate),
                                  dict(gate_activation="sigmoid_bound", gate_lower_bound=-5.0,
                                       use_qk_l2norm=True,
                                       use_beta_sigmoid=True, A_log=torch.full((1,), -0.5),
                                       dt_bias=dt_bias(1, gate), output_final_state=True)),
    "softplus": lambda dt, gate: (make(B=1, H=1, HV=2, dtype=dt, gate=gate),
                                  dict(gate_activation="softplus", A_log=torch.full((2,), -0.5),
                                       dt_bias=dt_bias(2, gate), output_final_state=True)),
}  # fmt: skip


def assert_same(got, ref):
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        if b is None:
            assert a is None
        else:
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# (case, dtype): every case in fp16, some in fp32 (bf16 is wrong in the interpreter)
BITWISE = [(c, FP16) for c in CASES] + [(c, FP32) for c in ("plain", "vk", "varlen",
                                                            "chunk_states")]  # fmt: skip
BITWISE_IDS = [f"{c}-{'fp16' if dt == FP16 else 'fp32'}" for c, dt in BITWISE]


def check_op_equals_entry(op: Prefill, case, dtype):
    x, kw = CASES[case](dtype, op.gate)
    ref = op.entry(**x, **kw)
    got = op.wrapper(**x, **kw)
    assert_same(got, ref)
    # the raw op: the same tensors, absent outputs as zero-row fp32 placeholders
    o, ht, hs = op.raw(**x, **kw)
    assert torch.equal(o, ref[0])
    if kw.get("output_final_state"):
        assert torch.equal(ht, ref[1])
    else:
        assert ht.shape[0] == 0 and ht.dtype == FP32 and ht.shape[1:] == (1, 32, 32)
    if not kw.get("output_chunk_states"):
        assert hs.shape[0] == 0 and hs.dtype == FP32


@pytest.mark.parametrize("case, dtype", BITWISE, ids=BITWISE_IDS)
def test_op_equals_kda_prefill_bitwise(case, dtype):
    check_op_equals_entry(KDA, case, dtype)


def check_fake_shapes_equal_real(op: Prefill, case):
    x, kw = CASES[case](FP16, op.gate)
    real = op.raw(**x, **kw)
    with FakeTensorMode() as mode:
        fake = op.raw(
            **{n: mode.from_tensor(t) for n, t in x.items()},
            **{n: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
               for n, t in kw.items()},
        )  # fmt: skip
    for r, f in zip(real, fake, strict=True):
        assert (r.shape, r.dtype, r.device) == (f.shape, f.dtype, f.device)
    # and the problem the fake selects on is the one the entry builds
    full = {**_defaults(), **kw}
    prepared, _ = api._prepare(
        *(x[n] for n in ("q", "k", "v", "g", "beta")), full["scale"], full["initial_state"],
        full["output_final_state"], full["gate_lower_bound"], full["cu_seqlens"],
        full["cu_seqlens_cpu"], full["A_log"], full["dt_bias"], full["gate_activation"],
        full["use_qk_l2norm"], full["use_beta_sigmoid"], full["state_layout"],
        full["output_chunk_states"], gate=op.gate,
    )  # fmt: skip
    mine = torch_op._problem_from_shapes(
        x["q"], x["v"], full["initial_state"], full["output_final_state"],
        full["gate_lower_bound"], full["cu_seqlens"], full["gate_activation"],
        full["use_qk_l2norm"], full["use_beta_sigmoid"], full["state_layout"],
        full["output_chunk_states"], gate=op.gate,
    )  # fmt: skip
    assert mine == prepared and mine.gate == op.gate


@pytest.mark.parametrize("case", list(CASES))
def test_fake_shapes_equal_real(case):
    check_fake_shapes_equal_real(KDA, case)


def _defaults():
    return {
        n: p.default
        for n, p in inspect.signature(api.kda_prefill).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


OPCHECK = ["plain", "varlen", "chunk_states"]


def check_opcheck(op: Prefill, case):
    x, kw = CASES[case](FP32, op.gate)
    default = getattr(torch.ops.kreg, op.entry.__name__).default
    torch.library.opcheck(default, tuple(x.values()), kw)


@pytest.mark.parametrize("case", OPCHECK)
def test_opcheck(case):
    check_opcheck(KDA, case)


COMPILE = [("gqa_h0", "aot_eager"), ("varlen", "aot_eager"), ("chunk_states", "aot_eager"),
           ("gqa_h0", "eager")]  # fmt: skip


def check_torch_compile_fullgraph(op: Prefill, case, backend):
    x, kw = CASES[case](FP16, op.gate)
    torch._dynamo.reset()

    def fn(q, k, v, g, beta, extra):
        out = op.wrapper(q, k, v, g, beta, **extra)
        return (out[0].float() * 2, *out[1:])

    ref = fn(*x.values(), kw)
    got = torch.compile(fn, fullgraph=True, backend=backend)(*x.values(), kw)
    assert_same(got, ref)
    assert torch.equal(ref[0], op.entry(**x, **kw)[0].float() * 2)


@pytest.mark.parametrize("case, backend", COMPILE)
def test_torch_compile_fullgraph(case, backend):
    check_torch_compile_fullgraph(KDA, case, backend)


def check_real_impl_errors_name_the_argument(op: Prefill):
    x, _ = CASES["plain"](FP16, op.gate)
    with pytest.raises(ValueError, match="^k: expected shape"):
        op.wrapper(**{**x, "k": x["k"][:, :, :1].contiguous()})
    with pytest.raises(ValueError, match="^gate_activation: "):
        op.wrapper(**x, gate_activation="relu")
    with pytest.raises(ValueError, match="^scale: "):
        op.wrapper(**x, scale=float("nan"))
    with pytest.raises(ValueError, match="^cu_seqlens: "):
        op.wrapper(**x, cu_seqlens=CU)  # B = 2
    with pytest.raises(ValueError, match="^state_layout: "):
        op.wrapper(**x, state_layout="xy")
    # the offsets' values: read by the real implementation only (B = 1 here)
    x, _ = CASES["no_final"](FP16, op.gate)
    with pytest.raises(ValueError, match="^cu_seqlens: "):
        op.wrapper(**x, cu_seqlens=torch.tensor([0, 30, 20, 40]))


def test_real_impl_errors_name_the_argument():
    check_real_impl_errors_name_the_argument(KDA)
