"""``kreg.compat.fla.chunk_kda`` under the Triton interpreter (CPU tensors): for each fla flag,
its outputs equal ``kda_prefill``'s called with the mapped arguments, bit for bit, and it returns
what fla returns for the same flags ((o, None) without ``output_final_state``).

Small shapes (K = V = 32, T = 40, fp16/fp32): the interpreter runs on a 2-core CPU.
"""

from __future__ import annotations

import pytest
import test_kda_numerics as numerics  # same folder: pytest puts it on sys.path
import torch

from kreg.compat.fla import chunk_kda
from kreg.families.kda import kda_prefill
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

T, K, V = 40, 32, 32


def make(B=1, H=1, HV=2, dtype=torch.float16, seed=0):
    """The numerics lane's inputs (unit-norm keys, gates in [-2, 0]) at this file's shape."""
    return numerics.make(B=B, T=T, H=H, HV=HV, K=K, V=V, dtype=dtype, lb=-2.0, seed=seed)


def gate_params(HV=2, seed=2):
    gen = torch.Generator().manual_seed(seed)
    return dict(
        A_log=0.5 * torch.randn(HV, generator=gen), dt_bias=torch.randn(HV * K, generator=gen)
    )


def h0(n, HV=2, vk=False, seed=1):
    shape = (n, HV, V, K) if vk else (n, HV, K, V)
    return 0.5 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


GP = gate_params()
CU = torch.tensor([0, 9, 9, 40])  # three sequences, one empty

# name: (inputs, chunk_kda's extra arguments, kda_prefill's mapped ones)
CASES = {
    "plain": (make(B=2), dict(), dict()),
    "plain_final_state": (make(), dict(output_final_state=True), dict(output_final_state=True)),
    "l2norm_beta_sigmoid": (
        make(dtype=torch.float32),
        dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True),
        dict(use_qk_l2norm=True, use_beta_sigmoid=True),
    ),
    "softplus_gate": (
        make(),
        dict(use_gate_in_kernel=True, output_final_state=True, **GP),
        dict(gate_activation="softplus", output_final_state=True, **GP),
    ),
    "safe_gate_sigmoid_bound": (
        make(),
        dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0, **GP),
        dict(gate_activation="sigmoid_bound", gate_lower_bound=-5.0, **GP),
    ),
    "safe_gate_promise": (
        make(),
        dict(safe_gate=True, lower_bound=-2.0),
        dict(gate_lower_bound=-2.0),
    ),
    "state_v_first_h0": (
        make(),
        dict(state_v_first=True, initial_state=h0(1, vk=True), output_final_state=True),
        dict(state_layout="vk", initial_state=h0(1, vk=True), output_final_state=True),
    ),
    "varlen": (
        make(),
        dict(cu_seqlens=CU, initial_state=h0(3), output_final_state=True),
        dict(cu_seqlens=CU, initial_state=h0(3), output_final_state=True),
    ),
    "accepted_no_effect": (
        make(),
        dict(cu_seqlens=CU, disable_recompute=True, use_graph=True, max_num_seqs=3, chunk_size=32),
        dict(cu_seqlens=CU),
    ),
}  # fmt: skip


def assert_same(got, want):
    assert len(got) == len(want) == 2
    for a, b in zip(got, want, strict=True):
        if b is None:
            assert a is None
        else:
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", CASES)
def test_equals_kda_prefill_with_mapped_arguments(name):
    x, given, mapped = CASES[name]
    with torch.no_grad():
        got = chunk_kda(**x, **given)
        want = kda_prefill(**x, **mapped)
    assert isinstance(got, tuple)
    assert_same(got, want)
    assert (got[1] is None) == (not given.get("output_final_state", False))
    assert not got[0].isnan().any()


def strided(t):
    """t's values in a view of stride 2 along the last dimension (not contiguous)."""
    return torch.stack([t, torch.zeros_like(t)], dim=-1).flatten(-2)[..., ::2]


def test_non_contiguous_inputs_equal_their_contiguous_copies():
    x = make()
    xs = {n: strided(t) for n, t in x.items()}  # stride 2
    state = h0(1, vk=True).transpose(-1, -2)  # [N, HV, K, V], not contiguous
    assert not any(t.is_contiguous() for t in (*xs.values(), state))
    got = chunk_kda(**xs, initial_state=state, output_final_state=True)
    want = kda_prefill(**x, initial_state=state.contiguous(), output_final_state=True)
    assert_same(got, want)


def test_scale_positional():
    x = make()
    assert_same(chunk_kda(*x.values(), 0.3), kda_prefill(*x.values(), scale=0.3))
