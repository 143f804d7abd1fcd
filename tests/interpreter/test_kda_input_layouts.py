"""Input layouts the engines pass, under the Triton interpreter: tensors of any strides (q, k, v
sliced from one fused projection, a transposed state, strided gate parameters) and int32 or
int64 offsets give the outputs of the contiguous, int64 call bit for bit, through
``kda_prefill`` and through fla's ``chunk_kda`` signature.
"""

from __future__ import annotations

import pytest
import test_kda_numerics as numerics  # same folder: pytest puts it on sys.path
import torch

from kreg.compat.fla import chunk_kda
from kreg.families.kda import api
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

HV = 2


def _fused_projection(x):
    """q, k, v as the engines get them: views into one [B, T, H*K + H*K + HV*V] projection
    output (token stride larger than the row: not contiguous)."""
    B, T = x["q"].shape[:2]
    parts = [x[n].reshape(B, T, -1) for n in ("q", "k", "v")]
    qkv = torch.cat(parts, dim=-1)
    out, at = {}, 0
    for n, p in zip(("q", "k", "v"), parts, strict=True):
        out[n] = qkv[..., at : at + p.shape[-1]].view(x[n].shape)
        at += p.shape[-1]
    # g and beta strided too: every other element of a wider buffer
    out["g"] = torch.stack([x["g"], x["g"]], -1)[..., 0]
    out["beta"] = torch.stack([x["beta"], x["beta"]], -1)[..., 0]
    return out


@pytest.mark.parametrize("K", [32, 60], ids=["native", "padded"])
@pytest.mark.parametrize("offsets", [torch.int64, torch.int32])
def test_strided_inputs_and_offset_dtypes_equal_the_contiguous_int64_run(K, offsets):
    x = numerics.make(T=50, H=1, HV=HV, K=K, V=32, dtype=torch.float16, seed=5)
    cu = torch.tensor([0, 17, 17, 50])
    h0 = numerics.state(3, HV, K, 32)
    gen = torch.Generator().manual_seed(6)
    A_log, dt_bias = 0.3 * torch.randn(HV, generator=gen), torch.randn(HV, K, generator=gen)
    x["g"] = torch.randn(x["g"].shape, generator=gen).to(x["g"].dtype)
    gate = dict(gate_activation="softplus", A_log=A_log, dt_bias=dt_bias)
    kw = dict(output_final_state=True, **gate)
    want = api.kda_prefill(**x, initial_state=h0, cu_seqlens=cu, **kw)

    xs = _fused_projection(x)
    cu_s = torch.stack([cu, cu], -1).to(offsets)[:, 0]  # strided, int32 or int64
    strided = dict(
        initial_state=h0.transpose(-1, -2).contiguous().transpose(-1, -2),
        A_log=torch.stack([A_log, A_log], -1)[:, 0],
        dt_bias=dt_bias.t().contiguous().t(),
    )
    assert not any(t.is_contiguous() for t in (*xs.values(), cu_s, *strided.values()))
    got = api.kda_prefill(**xs, cu_seqlens=cu_s, **{**kw, **strided})
    for a, b, what in zip(got, want, ("o", "final state"), strict=True):
        numerics.assert_equal(a, b, what)

    # fla's signature: int32 offsets (what vLLM passes) and the same strided tensors
    flat = dt_bias.reshape(-1)
    fla = chunk_kda(**xs, cu_seqlens=cu_s, initial_state=strided["initial_state"],
                    output_final_state=True, use_gate_in_kernel=True, A_log=strided["A_log"],
                    dt_bias=torch.stack([flat, flat], -1)[:, 0])  # fmt: skip
    for a, b, what in zip(fla, want, ("o", "final state"), strict=True):
        numerics.assert_equal(a, b, f"chunk_kda {what}")
