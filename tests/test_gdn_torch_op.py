"""``kreg::gdn_prefill`` custom op: registration, schema, fake (meta) shapes, wrapper validation.

The op is made by KDA's factory (``kreg.families.kda.torch_op.make_prefill_op``), so these tests
run ``tests/test_kda_torch_op.py``'s checks on it (its helpers take the op) and pin what is
GDN's own: the name, the scalar gate g ``[B, T, HV]`` the fake validates with, the entry named in
the messages. Nothing here executes a kernel (the main process does not run the Triton
interpreter); numerics and ``torch.compile`` run in ``tests/interpreter/test_gdn_torch_op.py``.
"""

from __future__ import annotations

import pytest
import torch
from test_kda_torch_op import (  # same folder: pytest puts it on sys.path
    BAD_ARGUMENTS,
    FAKE_CASES,
    GRAD_ARGS,
    KDA,
    Op,
    check_fake_fails_as_eager,
    check_make_fx_traces_one_op_node,
    check_torch_compile_fails_as_eager,
    check_varlen_chunk_states_rejected,
    check_wrapper_mirrors_the_signature,
    check_wrapper_refuses_grad,
    check_wrapper_rejects,
    fake_inputs,
    run_fake,
    shapes,
)
from torch._subclasses.fake_tensor import FakeTensor

from kreg.families import gdn
from kreg.families.gdn import api, torch_op
from kreg.families.gdn.torch_op import gdn_prefill_op
from kreg.families.kda.torch_op import _OP_SIGNATURE, make_prefill_op

FP16, FP32 = torch.float16, torch.float32
GDN = Op(api.gdn_prefill, gdn_prefill_op, "scalar")


def test_registered_and_exported():
    assert hasattr(torch.ops.kreg, "gdn_prefill") and torch_op.OP_NAME == "kreg::gdn_prefill"
    assert gdn.gdn_prefill_op is gdn_prefill_op
    assert "gdn_prefill_op" in gdn.__all__


def test_schema_is_kdas_but_the_name():
    """One schema, from the one signature (``PREFILL_SIGNATURE`` less the pool's arguments)."""
    schema = torch.ops.kreg.gdn_prefill.default._schema
    kda_schema = str(KDA.raw.default._schema)
    assert kda_schema.startswith("kreg::kda_prefill(")
    assert str(schema) == kda_schema.replace("kreg::kda_prefill(", "kreg::gdn_prefill(", 1)
    assert [a.name for a in schema.arguments] == list(_OP_SIGNATURE.parameters)
    assert not any(a.alias_info for a in schema.arguments)


def test_wrapper_mirrors_gdn_prefill_keywords():
    check_wrapper_mirrors_the_signature(GDN)


def test_made_once_per_name():
    assert make_prefill_op("gdn_prefill", "gdn", "scalar") is gdn_prefill_op
    with pytest.raises(ValueError, match="^name: kreg::gdn_prefill is registered for"):
        make_prefill_op("gdn_prefill", "gdn", "per_channel")
    with pytest.raises(ValueError, match="^gate: "):
        make_prefill_op("gdn_prefill_x", "gdn", "channel")
    assert not hasattr(torch.ops.kreg, "gdn_prefill_x")


# --- fake implementation -------------------------------------------------------------------------

CU = torch.tensor([0, 7, 7, 40])
META_CU = torch.empty(4, dtype=torch.int64, device="meta")
# id: (fake_inputs keywords, the call's keywords); the outputs' shapes do not depend on the gate
FAKE_CALLS = {
    "plain": (dict(B=2, H=2), dict(output_final_state=True)),
    "fp32": (dict(B=2, H=2, dtype=FP32), dict(output_final_state=True)),
    "bf16": (dict(B=2, H=2, dtype=torch.bfloat16), dict(output_final_state=True)),
    "gqa_unequal_dims": (dict(B=1, H=2, HV=4, K=32, V=64), dict(output_final_state=True)),
    "vk": (dict(B=2, H=1, HV=2, K=32, V=64), dict(output_final_state=True, state_layout="vk")),
    "varlen": (dict(B=1, H=2, HV=4),
               dict(output_final_state=True, cu_seqlens=CU, cu_seqlens_cpu=CU)),
    "varlen_meta": (dict(B=1, H=2, device="meta"),
                    dict(output_final_state=True, cu_seqlens=META_CU)),
    "no_final": (dict(B=3, H=2), dict()),
    "chunk_states": (dict(B=2, T=65, H=2), dict(output_final_state=True, output_chunk_states=True)),
    "chunk_states_16_bf16": (dict(B=2, T=200, H=2),
                             dict(output_chunk_states=True, chunk_states_size=16,
                                  chunk_states_dtype=torch.bfloat16)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FAKE_CALLS))
def test_fake_shapes_as_kdas(case):
    """A GDN call's fake outputs: fake tensors, of the shapes and dtypes KDA's op gives the same
    call with a per-channel gate (which ``tests/test_kda_torch_op.py`` pins)."""
    inputs, kw = FAKE_CALLS[case]
    raw, wrapped = run_fake(fake_inputs(**inputs, gate="scalar"), op=GDN, **kw)
    kda_raw, kda_wrapped = run_fake(fake_inputs(**inputs), **kw)
    assert all(isinstance(t, FakeTensor) for t in raw)
    assert shapes(raw) == shapes(kda_raw)
    assert shapes(wrapped) == shapes(kda_wrapped)
    assert raw[0].device == torch.device(inputs.get("device", "cpu"))


def test_fake_plain_scalar_gate():
    x = fake_inputs(B=2, T=40, H=2, HV=4, V=64, gate="scalar")
    assert x["g"].shape == (2, 40, 4)
    raw, wrapped = run_fake(x, op=GDN, output_final_state=True, output_chunk_states=True)
    assert shapes(raw) == [((2, 40, 4, 64), FP16), ((2, 4, 32, 64), FP32), ((2, 4, 32, 64), FP32)]
    assert shapes(wrapped) == shapes(raw)


def test_fake_gate_parameters_per_value_head():
    """GDN's softplus gate: A_log and dt_bias of HV elements (dt_bias [HV, K] is KDA's)."""
    x = fake_inputs(B=1, T=40, H=1, HV=2, gate="scalar")
    kw = dict(gate_activation="softplus", A_log=torch.zeros(1, 1, 2, 1), dt_bias=torch.zeros(2),
              output_final_state=True)  # fmt: skip
    raw, _ = run_fake(x, op=GDN, **kw)
    assert shapes(raw)[:2] == [((1, 40, 2, 32), FP16), ((1, 2, 32, 32), FP32)]
    with pytest.raises(ValueError, match="^dt_bias: "):
        run_fake(x, op=GDN, **{**kw, "dt_bias": torch.zeros(2, 32)})


def test_make_fx_traces_one_op_node():
    check_make_fx_traces_one_op_node(GDN)


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("edit,name", [c[1:] for c in FAKE_CASES], ids=[c[0] for c in FAKE_CASES])
def test_fake_fails_with_the_eager_message(edit, name):
    """``g_other_gate``: a per-channel g [B, T, HV, K] is refused by the fake as by gdn_prefill."""
    check_fake_fails_as_eager(GDN, edit, name)


def test_torch_compile_fails_with_the_eager_message():
    check_torch_compile_fails_as_eager(GDN)


def test_varlen_chunk_states_rejected():
    check_varlen_chunk_states_rejected(GDN)


@pytest.mark.parametrize("kw, name", BAD_ARGUMENTS)
def test_wrapper_rejects_bad_arguments_by_name(kw, name):
    check_wrapper_rejects(GDN, kw, name)


@pytest.mark.parametrize("name", GRAD_ARGS)
def test_wrapper_refuses_inputs_that_require_grad(name):
    check_wrapper_refuses_grad(GDN, name)
