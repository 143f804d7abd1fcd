"""GDN's drop-in shims under the Triton interpreter (CPU tensors): ``kreg.compat.fla``'s
``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` (fla-core 0.6.0's
signatures) and ``kreg.compat.sglang.chunk_gated_delta_rule`` (SGLang's own).

- Each fla flag's mapping: the shim's outputs equal ``gdn_prefill``'s with the mapped keywords
  bit for bit (``kda_prefill``'s for a per-key ``gk``).
- Numerics: the float64 token-serial oracle, a scalar gate given to it as a per-channel gate
  with equal channels, within 1e-5 relative RMS at fp32 (prefill and decode, varlen, the
  in-kernel softplus gate with ``A_log`` / ``dt_bias`` ``[HV]``, device-only offsets, pools).
- Pools in place: vLLM's ``ssm_state_indices`` / ``inplace_final_state`` (graph padding, a -1
  slot), SGLang's ``initial_state_indices`` with its ``(o, None, h)`` return.
- Every refusal is a ``ValueError`` naming its argument, raised before any launch; an unknown
  keyword is a ``TypeError``.

Small shapes (K = V = 32, T <= 64, H = 1, HV = 2): the interpreter runs on a 2-core CPU.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import test_kda_device_offsets as offsets_tests  # same folder: pytest puts it on sys.path
import torch
from bitwise import assert_bitwise_equal  # tests/ is on sys.path (rootdir conftest)

from kreg.compat import fla, sglang
from kreg.families.gdn import gdn_prefill
from kreg.families.kda import api, kda_prefill
from kreg.families.kda.oracles import (
    gate_softplus,
    l2norm,
    relative_rms,
    sigmoid,
    token_serial_oracle,
)
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

FP16, FP32 = torch.float16, torch.float32
T, H, HV, K = 40, 1, 2, 32
TOL = 1e-5  # relative RMS against the float64 oracle, fp32 inputs
CU = torch.tensor([0, 9, 9, 40])  # three sequences, one empty


def make(B=1, T=T, dtype=FP16, seed=0):
    """q, k (unit norm), v, g in [-2, 0] ``[B, T, HV]``, beta in [0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(B, T, H, K, generator=gen)
    x = dict(
        q=torch.randn(B, T, H, K, generator=gen), k=k / k.norm(dim=-1, keepdim=True),
        v=torch.randn(B, T, HV, K, generator=gen), g=-2 * torch.rand(B, T, HV, generator=gen),
        beta=torch.rand(B, T, HV, generator=gen),
    )  # fmt: skip
    return {n: t.to(dtype) for n, t in x.items()}


def gate_params(seed=2):
    """Qwen3-Next's A_log and dt_bias: one per value head."""
    gen = torch.Generator().manual_seed(seed)
    return dict(A_log=0.5 * torch.randn(HV, generator=gen), dt_bias=torch.randn(HV, generator=gen))


def states(n, seed=1):
    """n fp32 states [n, HV, K, V] (K = V: either layout)."""
    return 0.5 * torch.randn(n, HV, K, K, generator=torch.Generator().manual_seed(seed))


GP = gate_params()
# device-only offsets on the CPU: host reads of a watched tensor raise (the KDA tests' fixture)
device_offsets = offsets_tests.device_offsets


def oracle(x, *, gate=None, l2=False, beta_sigmoid=False, initial_state=None, cu_seqlens=None,
           state_layout="kv"):  # fmt: skip
    """(o, final states) in float64: the activations applied as the kernels apply them, the
    scalar gate broadcast over K (a per-channel gate with equal channels)."""
    y = {n: t.double().numpy() for n, t in x.items()}
    if l2:
        y["q"], y["k"] = l2norm(y["q"]), l2norm(y["k"])
    g = y["g"][..., None]  # [B, T, HV, 1]
    if gate is not None:
        g = gate_softplus(g, gate["A_log"], gate["dt_bias"])
    y["g"] = np.broadcast_to(g, (*g.shape[:-1], K))
    if beta_sigmoid:
        y["beta"] = sigmoid(y["beta"])
    h0 = None if initial_state is None else initial_state.double().numpy()
    cu = None if cu_seqlens is None else cu_seqlens.numpy()
    return token_serial_oracle(**y, initial_state=h0, cu_seqlens=cu, state_layout=state_layout)


def assert_oracle(got, want):
    for a, b in zip(got, want, strict=True):
        err = relative_rms(a.double().numpy(), b)
        assert err < TOL, err


# --- signatures ------------------------------------------------------------------------------

E = inspect.Parameter.empty
# fla-core 0.6.0, fla/ops/gated_delta_rule/chunk.py and fused_recurrent.py: (name, default)
FLA_CHUNK = [
    ("q", E), ("k", E), ("v", E), ("g", E), ("beta", E), ("scale", None),
    ("initial_state", None), ("output_final_state", False), ("use_qk_l2norm_in_kernel", False),
    ("use_beta_sigmoid_in_kernel", False), ("allow_neg_eigval", False), ("state_v_first", False),
    ("cu_seqlens", None), ("cu_seqlens_cpu", None), ("chunk_indices", None),
    ("cp_context", None), ("kwargs", E),
]  # fmt: skip
FLA_RECURRENT = [
    ("q", E), ("k", E), ("v", E), ("g", None), ("gk", None), ("gv", None), ("beta", None),
    ("scale", None), ("initial_state", None), ("output_final_state", False),
    ("use_qk_l2norm_in_kernel", False), ("use_gate_in_kernel", False), ("A_log", None),
    ("dt_bias", None), ("use_beta_sigmoid_in_kernel", False), ("allow_neg_eigval", False),
    ("state_v_first", False), ("cu_seqlens", None), ("kwargs", E),
]  # fmt: skip
# SGLang python/sglang/kernels/ops/attention/fla/chunk.py @ 0a0df252ac62 (no **kwargs)
SGLANG_CHUNK = [
    ("q", E), ("k", E), ("v", E), ("g", E), ("beta", E), ("scale", None),
    ("initial_state", None), ("initial_state_indices", None), ("cu_seqlens", None),
    ("head_first", False), ("use_qk_l2norm_in_kernel", False), ("inplace_update", True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("function", "params"),
    [(fla.chunk_gated_delta_rule, FLA_CHUNK), (fla.fused_recurrent_gated_delta_rule, FLA_RECURRENT),
     (sglang.chunk_gated_delta_rule, SGLANG_CHUNK)],
    ids=["fla.chunk", "fla.fused_recurrent", "sglang.chunk"],
)  # fmt: skip
def test_signatures_are_the_peers(function, params):
    assert [(p.name, p.default) for p in inspect.signature(function).parameters.values()] == params


# --- chunk_gated_delta_rule: the mapping, bit for bit -----------------------------------------

# name: (inputs, chunk_gated_delta_rule's extra arguments, gdn_prefill's mapped ones)
CHUNK_CASES = {
    "plain_batch2": (make(B=2), dict(), dict()),
    "final_state": (make(), dict(output_final_state=True), dict(output_final_state=True)),
    "l2norm_beta_sigmoid": (
        make(dtype=FP32),
        dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True),
        dict(use_qk_l2norm=True, use_beta_sigmoid=True),
    ),
    "softplus_gate": (
        make(),
        dict(use_gate_in_kernel=True, output_final_state=True, **GP),
        dict(gate_activation="softplus", output_final_state=True, **GP),
    ),
    "gate_params_ignored": (make(), dict(**GP), dict()),  # as fla, without use_gate_in_kernel
    "state_v_first_h0": (
        make(),
        dict(state_v_first=True, initial_state=states(1), output_final_state=True, scale=0.3),
        dict(state_layout="vk", initial_state=states(1), output_final_state=True, scale=0.3),
    ),
    "varlen_host": (
        make(),
        dict(cu_seqlens=CU, cu_seqlens_cpu=CU, initial_state=states(3), output_final_state=True),
        dict(cu_seqlens=CU, cu_seqlens_cpu=CU, initial_state=states(3), output_final_state=True),
    ),
    "accepted_no_effect": (
        make(),
        dict(cu_seqlens=CU, chunk_size=16, chunk_indices=torch.zeros(2, 2, dtype=torch.long),
             head_first=False, max_seqlen=31),
        dict(cu_seqlens=CU, max_seqlen=31),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", CHUNK_CASES)
def test_chunk_equals_gdn_prefill_with_mapped_arguments(name):
    x, given, mapped = CHUNK_CASES[name]
    got = fla.chunk_gated_delta_rule(**x, **given)
    want = gdn_prefill(**x, **mapped)
    assert isinstance(got, tuple) and len(got) == 2
    assert (got[1] is None) == (not given.get("output_final_state", False))
    assert_bitwise_equal(got, want)
    assert not got[0].isnan().any()


def test_chunk_transpose_state_layout_is_served_with_fla_warning():
    x = make()
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        got = fla.chunk_gated_delta_rule(**x, initial_state=states(1), transpose_state_layout=True)
    assert_bitwise_equal(got, gdn_prefill(**x, initial_state=states(1), state_layout="vk"))


# --- fused_recurrent_gated_delta_rule: the mapping, bit for bit -------------------------------


def test_recurrent_positional_arguments_are_flas():
    """fla's order: q, k, v, g, gk, gv, beta, scale, initial_state, output_final_state,
    use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel."""
    x = make(T=3, dtype=FP32, seed=3)
    h0 = states(1)
    got = fla.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], None, None,
                                               x["beta"], 0.25, h0, True, True, True,
                                               GP["A_log"], GP["dt_bias"], True)  # fmt: skip
    want = gdn_prefill(**x, scale=0.25, initial_state=h0, output_final_state=True,
                       use_qk_l2norm=True, gate_activation="softplus", **GP,
                       use_beta_sigmoid=True)  # fmt: skip
    assert_bitwise_equal(got, want)


def test_recurrent_absent_gate_beta_and_per_key_gate():
    """g None: no decay (a zero log-decay); beta None: ones, as fla; gk alone: KDA's per-key
    gate, served by kda_prefill; A_log / dt_bias ignored without use_gate_in_kernel."""
    x = make(T=3, dtype=FP32, seed=4)
    zeros, ones = torch.zeros_like(x["g"]), torch.ones_like(x["beta"])
    rest = {n: x[n] for n in ("q", "k", "v")}
    got = fla.fused_recurrent_gated_delta_rule(**rest, beta=x["beta"], **GP)
    assert_bitwise_equal(got, gdn_prefill(**rest, g=zeros, beta=x["beta"]))
    got = fla.fused_recurrent_gated_delta_rule(**rest, g=x["g"], use_beta_sigmoid_in_kernel=True)
    assert_bitwise_equal(got, gdn_prefill(**rest, g=x["g"], beta=ones, use_beta_sigmoid=True))
    gk = -torch.rand(1, 3, HV, K, generator=torch.Generator().manual_seed(5))
    got = fla.fused_recurrent_gated_delta_rule(**rest, gk=gk, beta=x["beta"])
    assert_bitwise_equal(got, kda_prefill(**rest, g=gk, beta=x["beta"]))


# --- the float64 oracle, fp32 ------------------------------------------------------------------


def test_chunk_matches_the_oracle_varlen_with_everything_in_kernel():
    """Prefill (a 40-token sequence among short ones: the chunked kernels), the softplus gate
    from the raw g with A_log / dt_bias [HV], L2 norms, beta's sigmoid, V-first states."""
    x = make(T=64, dtype=FP32, seed=6)
    x["g"] = torch.randn(1, 64, HV, generator=torch.Generator().manual_seed(7))  # raw gate
    cu = torch.tensor([0, 3, 43, 64])
    h0 = states(3)
    got = fla.chunk_gated_delta_rule(
        **x, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
        use_beta_sigmoid_in_kernel=True, state_v_first=True, cu_seqlens=cu,
        use_gate_in_kernel=True, **GP,
    )  # fmt: skip
    assert_oracle(got, oracle(x, gate=GP, l2=True, beta_sigmoid=True, initial_state=h0,
                              cu_seqlens=cu, state_layout="vk"))  # fmt: skip


@pytest.mark.parametrize("function", ["chunk", "recurrent"])
def test_matches_the_oracle_fixed_length(function):
    """B = 2, T = 64 (chunk) or 4 (decode-shaped, the recurrence): log-decay g as given."""
    x = make(B=2, T=64 if function == "chunk" else 4, dtype=FP32, seed=8)
    h0 = states(2, seed=9)
    shim = (
        fla.chunk_gated_delta_rule if function == "chunk" else fla.fused_recurrent_gated_delta_rule
    )
    got = shim(**x, initial_state=h0, output_final_state=True)
    assert_oracle(got, oracle(x, initial_state=h0))


def test_chunk_varlen_on_device_only_offsets(device_offsets, monkeypatch):
    """cu_seqlens on the device alone (as vLLM and SGLang pass them): never read on the host (a
    host read raises), planned from the mean length, and still the oracle's outputs; int32."""
    x = make(T=64, dtype=FP32, seed=10)
    cu = torch.tensor([0, 50, 50, 57, 64], dtype=torch.int32)
    h0 = states(4, seed=11)
    want = oracle(x, initial_state=h0, cu_seqlens=cu)
    got = fla.chunk_gated_delta_rule(**x, initial_state=h0, output_final_state=True,
                                     cu_seqlens=device_offsets(cu))  # fmt: skip
    assert_oracle(got, want)


# --- pools in place ----------------------------------------------------------------------------


def test_recurrent_vllm_pool_in_place_with_graph_padding(device_offsets, monkeypatch):
    """vLLM's graph-captured decode: the pool [P, HV, K, V], int32 offsets and slots on the
    device alone (never read on the host), the slots padded with -1 past the real sequences
    (cu_seqlens cut to them) and a -1 slot among them, inplace_final_state=True: the pool comes
    back (the same tensor), its slots hold the oracle's final states, a -1 sequence starts from
    zeros and writes nothing, every other slot is untouched."""
    x = make(T=3, dtype=FP32, seed=12)
    cu = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    slots = torch.tensor([4, -1, 0, -1, -1], dtype=torch.int32)  # 2 graph-padding slots
    pool = states(6, seed=13)
    before = pool.clone()
    h0 = torch.stack([before[4], torch.zeros_like(before[0]), before[0]])
    want_o, want_h = oracle(x, l2=True, initial_state=h0, cu_seqlens=cu)
    # the slots' values unread on the host too, as device slots under graph capture
    monkeypatch.setattr(api, "_pool_slots", offsets_tests._device_pool_slots)
    o, ret = fla.fused_recurrent_gated_delta_rule(
        **x, initial_state=pool, inplace_final_state=True, cu_seqlens=device_offsets(cu.clone()),
        ssm_state_indices=slots, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    assert ret is pool
    assert_oracle((o, pool[[4, 0]]), (want_o, want_h[[0, 2]]))
    untouched = [1, 2, 3, 5]
    assert torch.equal(pool[untouched], before[untouched])
    # and bit for bit gdn_prefill's pool call on the real slots
    ref = before.clone()
    ro, _ = gdn_prefill(**x, initial_state=ref, initial_state_indices=slots[:3], cu_seqlens=cu,
                        use_qk_l2norm=True)  # fmt: skip
    assert_bitwise_equal((o, pool), (ro, ref))


def test_sglang_chunk_pool_in_place_and_h():
    """SGLang's extend: V-first pool with initial_state_indices (a -1 slot), updated in place;
    (o, None, h) with h the state every 64 tokens of each sequence, [1, NT, HV, V, K] in q's
    dtype, bit for bit gdn_prefill's chunk states; o and the slots against the oracle."""
    x = make(T=96, dtype=FP32, seed=14)
    cu = torch.tensor([0, 70, 75, 96], dtype=torch.int32)
    slots = torch.tensor([2, -1, 0], dtype=torch.int32)
    pool = states(4, seed=15)
    before = pool.clone()
    o, none, h = sglang.chunk_gated_delta_rule(
        **x, initial_state=pool, initial_state_indices=slots, cu_seqlens=cu, head_first=False,
        use_qk_l2norm_in_kernel=True, inplace_update=True,
    )  # fmt: skip
    assert none is None
    assert h.shape == (1, 2 + 1 + 1, HV, K, K) and h.dtype == FP32
    ref = before.clone()
    ro, _, rh = gdn_prefill(**x, initial_state=ref, initial_state_indices=slots, cu_seqlens=cu,
                            use_qk_l2norm=True, state_layout="vk", output_chunk_states=True,
                            chunk_states_dtype=FP32)  # fmt: skip
    assert_bitwise_equal((o, pool, h[0]), (ro, ref, rh))
    h0 = torch.stack([before[2], torch.zeros_like(before[0]), before[0]])
    want_o, want_h = oracle(x, l2=True, initial_state=h0, cu_seqlens=cu, state_layout="vk")
    assert_oracle((o, pool[[2, 0]]), (want_o, want_h[[0, 2]]))
    assert torch.equal(pool[[1, 3]], before[[1, 3]])
    # the second 64-token chunk of sequence 0 starts from the state after its first 64 tokens
    _, h64 = oracle({n: t[:, :64] for n, t in x.items()}, l2=True, initial_state=h0[:1],
                    state_layout="vk")  # fmt: skip
    assert_oracle((h[0, 1:2],), (h64,))


# --- refusals ----------------------------------------------------------------------------------


@pytest.fixture
def recorded(monkeypatch):
    """No launch: the shims' run_prefill replaced by a recorder (a refusal records nothing)."""
    calls = []
    monkeypatch.setattr(fla, "_run", lambda *a, **kw: calls.append(kw) or ("o", "ht"))
    monkeypatch.setattr(sglang, "_run", lambda *a, **kw: calls.append(kw) or ("o", "ht", "h"))
    return calls


GK = torch.zeros(1, T, HV, K)
SLOT = dict(initial_state=states(4), ssm_state_indices=torch.tensor([0]))
# case id: (the argument the ValueError names, the call's arguments)
CHUNK_REFUSED = {
    "allow_neg_eigval": (
        "allow_neg_eigval",
        dict(allow_neg_eigval=True, use_beta_sigmoid_in_kernel=True),
    ),
    "cp_context": ("cp_context", dict(cp_context=object())),
    "chunk_size": ("chunk_size", dict(chunk_size=128)),
    "head_first": ("head_first", dict(head_first=True)),
    "A_log_missing": ("A_log", dict(use_gate_in_kernel=True)),
    "both_layout_names": (
        "transpose_state_layout",
        dict(state_v_first=True, transpose_state_layout=True),
    ),
    "use_gate_in_kernel_int": ("use_gate_in_kernel", dict(use_gate_in_kernel=1, **GP)),
    "state_v_first_str": ("state_v_first", dict(state_v_first="vk")),
    "chunk_indices_list": ("chunk_indices", dict(chunk_indices=[0, 1])),
    "l2norm_int": ("use_qk_l2norm_in_kernel", dict(use_qk_l2norm_in_kernel=1)),
    "beta_sigmoid_str": ("use_beta_sigmoid_in_kernel", dict(use_beta_sigmoid_in_kernel="yes")),
}
RECURRENT_REFUSED = {
    "allow_neg_eigval": (
        "allow_neg_eigval",
        dict(allow_neg_eigval=True, use_beta_sigmoid_in_kernel=True),
    ),
    "gv": ("gv", dict(gv=torch.zeros(1, T, HV, K))),
    "gk_with_g": ("gk", dict(gk=GK)),
    "gk_in_kernel": ("gk", dict(g=None, gk=GK, use_gate_in_kernel=True, **GP)),
    "g_missing_in_kernel": ("g", dict(g=None, use_gate_in_kernel=True, **GP)),
    "A_log_missing": ("A_log", dict(use_gate_in_kernel=True)),
    "per_column_beta": ("beta", dict(beta=torch.rand(1, T, HV, K))),
    "slots_2d": (
        "ssm_state_indices",
        dict(initial_state=states(4), ssm_state_indices=torch.zeros(1, 2)),
    ),
    "slots_twice": ("ssm_state_indices", dict(**SLOT, initial_state_indices=torch.tensor([0]))),
    "inplace_without_slots": ("inplace_final_state", dict(inplace_final_state=True)),
    "not_inplace_with_slots": ("inplace_final_state", dict(**SLOT, inplace_final_state=False)),
    "inplace_str": ("inplace_final_state", dict(inplace_final_state="yes")),
}
SGLANG_REFUSED = {
    "head_first": ("head_first", dict(head_first=True)),
    "not_inplace": ("inplace_update", dict(inplace_update=False)),
    "no_pool": ("initial_state", dict(initial_state=None)),
    "no_slots": ("initial_state_indices", dict(initial_state_indices=None)),
    "l2norm_none": ("use_qk_l2norm_in_kernel", dict(use_qk_l2norm_in_kernel=None)),
}  # fmt: skip
SGLANG_POOL = dict(initial_state=states(4), initial_state_indices=torch.tensor([1, 0, 3]),
                   cu_seqlens=CU)  # fmt: skip
REFUSALS = [
    pytest.param(function, name, {**base, **kw}, id=f"{label}-{case}")
    for function, label, table, base in [
        (fla.chunk_gated_delta_rule, "chunk", CHUNK_REFUSED, {}),
        (fla.fused_recurrent_gated_delta_rule, "recurrent", RECURRENT_REFUSED, {}),
        (sglang.chunk_gated_delta_rule, "sglang", SGLANG_REFUSED, SGLANG_POOL),
    ]
    for case, (name, kw) in table.items()
]


@pytest.mark.parametrize(("function", "name", "kw"), REFUSALS)
def test_refusals_name_their_argument_before_any_launch(recorded, function, name, kw):
    with pytest.raises(ValueError, match=rf"^{name}: "):
        function(**{**make(), **kw})
    assert not recorded


def test_unknown_keywords_are_a_type_error(recorded):
    with pytest.raises(TypeError, match="A_logs"):
        fla.chunk_gated_delta_rule(**make(), use_gate_in_kernel=True, A_logs=GP["A_log"])
    with pytest.raises(TypeError, match="return_intermediate_states"):  # chunk_kda's, not GDN's
        fla.chunk_gated_delta_rule(**make(), return_intermediate_states=True)
    with pytest.raises(TypeError, match="num_accepted_tokens"):  # vLLM's speculative decoding
        fla.fused_recurrent_gated_delta_rule(**make(), num_accepted_tokens=torch.ones(1))
    with pytest.raises(TypeError, match="output_final_state"):  # not in SGLang's signature
        sglang.chunk_gated_delta_rule(**make(), output_final_state=True)
    assert not recorded


def test_inputs_requiring_grad_are_refused():
    x = make(dtype=FP32)
    x["v"].requires_grad_(True)
    with pytest.raises(ValueError, match=r"^v: requires grad"):
        fla.chunk_gated_delta_rule(**x)
