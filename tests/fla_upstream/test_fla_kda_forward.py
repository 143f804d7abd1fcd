"""fla-core's own KDA tests, forward part, with ``chunk_kda`` and ``fused_recurrent_kda`` taken
from ``kreg.compat.fla``: the parameter grids and forward assertions of ``test_chunk``,
``test_chunk_varlen`` and ``test_fused_recurrent`` in ``tests/ops/test_kda.py`` of
fla-org/flash-linear-attention @ bc3b101dcb713ddc5bd8924b66754eb68b5ccf89, with fla's naive
references (``fla.ops.kda.naive.naive_recurrent_kda``, ``fla.ops.kda.gate.naive_kda_gate`` /
``naive_kda_lowerbound_gate``) and its ``fla.utils.assert_close`` taken from the installed
fla-core. The grids, seeds, input recipes and tolerances are fla's; the code is kreg's.

Out of scope: the backward assertions of those tests (dq, dk, dv, dg, db, dA, dbias, dh0):
kreg is forward only, so the inputs here do not require grad (the shim refuses inputs that do)
and no gradient is compared. fla's ``test_chunk_varlen`` skips D = 64 / 256 when its autotune
cache runs on default configs (``FLA_CACHE_MODE``); that concerns fla's kernels, not kreg's,
so those rows run here. One H200 run (fla-core installed):

    FLA_DISABLE_BACKEND_DISPATCH=1 python -m pytest tests/fla_upstream -q
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

fla_naive = pytest.importorskip("fla.ops.kda.naive", reason="needs fla-core (its references)")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate  # noqa: E402
from fla.utils import assert_close  # noqa: E402

from kreg.compat.fla import chunk_kda, fused_recurrent_kda  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a manual interpreter run
naive_recurrent_kda = fla_naive.naive_recurrent_kda
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float

# test_chunk: B, T, H, HV, D, scale, gate_logit_normalizer, mask_p, use_qk_l2norm_in_kernel,
# use_gate_in_kernel, dtype, safe_gate, disable_recompute, chunk_size
CHUNK = [
    (1, 63, 1, 1, 64, 1, 1, 0, False, False, F16, True, False, 64),
    (2, 500, 3, 3, 60, 1, 1, 0, False, False, F16, True, True, 64),
    (2, 1000, 3, 3, 64, 0.1, 1, 0.5, False, False, F16, False, True, 64),
    (3, 1024, 4, 4, 100, 1, 0.1, 0, False, False, F16, False, False, 64),
    (4, 1024, 4, 4, 128, 0.1, 1, 0, False, False, F16, True, True, 64),
    (4, 1024, 4, 4, 128, 0.1, 1, 0, True, False, F16, True, False, 64),
    (2, 1500, 4, 4, 128, 0.1, 10, 0, False, True, F16, False, True, 64),
    (4, 2048, 8, 8, 64, 0.1, 1, 0, False, True, F16, True, True, 64),
    (2, 1024, 2, 4, 64, 0.1, 1, 0, False, False, F16, False, False, 64),
    (2, 1024, 2, 8, 64, 0.1, 1, 0, False, True, F16, False, False, 64),
    (2, 1024, 4, 8, 128, 0.1, 1, 0, True, True, F16, False, False, 64),
    (2, 160, 2, 4, 64, 0.1, 1, 0, False, True, F16, True, True, 32),
    (2, 1024, 2, 4, 64, 0.1, 1, 0, True, True, BF16, True, False, 64),
    (2, 1024, 2, 4, 64, 0.1, 1, 0, False, True, BF16, False, False, 64),
    (2, 160, 2, 4, 64, 0.1, 1, 0, False, True, BF16, True, True, 32),
    (2, 1024, 2, 8, 128, 0.1, 1, 0, True, True, BF16, False, False, 64),
]  # fmt: skip

# test_chunk_varlen: H, D, mask_p, cu_seqlens, dtype, use_gate_in_kernel, safe_gate,
# disable_recompute, chunk_size
CHUNK_VARLEN = [
    (4, 60, 0.1, [0, 15], F16, True, False, False, 64),
    (4, 64, 0.9, [0, 256, 500, 1000], F16, True, False, False, 64),
    (4, 128, 0.5, [0, 256, 500, 1000], F16, False, False, False, 64),
    (4, 100, 0, [0, 15, 100, 300, 1200, 2000], F16, True, False, False, 64),
    (4, 256, 0, [0, 100, 300, 1200, 3000, 4096], F16, False, True, True, 64),
    (4, 60, 0.1, [0, 31, 96, 160], F16, True, False, True, 32),
]  # fmt: skip

# test_fused_recurrent: B, T, H, HV, D, scale, gate_logit_normalizer, use_qk_l2norm_in_kernel,
# dtype
FUSED_RECURRENT = [
    (1, 64, 1, 1, 64, 1, 1, False, F32),
    (2, 512, 3, 3, 60, 1, 1, False, F32),
    (3, 1000, 4, 4, 100, 0.1, 1, True, F32),
    (4, 1024, 4, 4, 128, 0.1, 1, False, F32),
    (2, 512, 2, 4, 60, 1, 1, False, F32),
    (2, 1024, 2, 8, 128, 0.1, 1, True, F32),
]  # fmt: skip


def _ids(rows):
    return ["-".join(str(x).replace("torch.", "") for x in row) for row in rows]


def _dev(*xs):
    return [x.to(DEVICE) for x in xs]


def _unit(x):
    return F.normalize(x, p=2, dim=-1)


@torch.no_grad()
@pytest.mark.parametrize("row", CHUNK, ids=_ids(CHUNK))
def test_chunk(row):
    B, T, H, HV, D, scale, norm, mask_p, l2_in_kernel, gate_in_kernel, dtype, safe_gate, \
        disable_recompute, chunk_size = row  # fmt: skip
    torch.manual_seed(42)
    q = torch.rand(B, T, H, D, dtype=dtype)
    k = torch.rand(B, T, H, D, dtype=dtype)
    v = torch.rand(B, T, HV, D, dtype=dtype)
    g = torch.randn(B, T, HV, D, dtype=dtype if gate_in_kernel else F32)
    A_log = dt_bias = None
    if gate_in_kernel:
        A_log, dt_bias = torch.randn(HV, dtype=F32), torch.randn(HV * D, dtype=F32)
    else:
        g = F.logsigmoid(g) / norm
        g = g * (torch.rand_like(g) > mask_p)
    lower_bound = -5.0 if safe_gate else None
    if safe_gate and not gate_in_kernel:
        g = g.clamp(-5, 0)
    gate_ref = naive_kda_lowerbound_gate if safe_gate else naive_kda_gate
    beta = torch.randn(B, T, HV, dtype=dtype).sigmoid()
    h0 = torch.randn(B, HV, D, D, dtype=F32)
    q, k, v, g, beta, h0 = _dev(q, k, v, g, beta, h0)
    if gate_in_kernel:
        A_log, dt_bias = _dev(A_log, dt_bias)

    ref, ref_ht = naive_recurrent_kda(
        q=_unit(q), k=_unit(k), v=v, g=gate_ref(g, A_log, dt_bias) if gate_in_kernel else g,
        beta=beta, scale=scale, initial_state=h0.clone(), output_final_state=True,
    )  # fmt: skip
    tri, tri_ht = chunk_kda(
        q=q if l2_in_kernel else _unit(q), k=k if l2_in_kernel else _unit(k), v=v, g=g,
        beta=beta, A_log=A_log, dt_bias=dt_bias, scale=scale, initial_state=h0.clone(),
        output_final_state=True, use_qk_l2norm_in_kernel=l2_in_kernel,
        use_gate_in_kernel=gate_in_kernel, safe_gate=safe_gate, lower_bound=lower_bound,
        disable_recompute=disable_recompute, chunk_size=chunk_size,
    )  # fmt: skip
    assert_close("o", ref, tri, 0.005)
    assert_close("ht", ref_ht, tri_ht, 0.005)


@torch.no_grad()
@pytest.mark.parametrize("row", CHUNK_VARLEN, ids=_ids(CHUNK_VARLEN))
def test_chunk_varlen(row):
    H, D, mask_p, offsets, dtype, gate_in_kernel, safe_gate, disable_recompute, chunk_size = row
    torch.manual_seed(42)
    cu_seqlens = torch.LongTensor(offsets).to(DEVICE)
    T, N = offsets[-1], len(offsets) - 1
    q = torch.randn((1, T, H, D), dtype=dtype)
    k = _unit(torch.randn(1, T, H, D, dtype=F32)).to(dtype)
    v = torch.randn((1, T, H, D), dtype=dtype)
    g = torch.randn(1, T, H, D, dtype=dtype if gate_in_kernel else F32)
    A_log = dt_bias = None
    if gate_in_kernel:
        A_log = torch.log(torch.randn(1, 1, H, 1, dtype=F32, device=DEVICE).uniform_(1, 16))
        dt_bias = torch.randn(H * D, dtype=F32, device=DEVICE)
    else:
        g = F.logsigmoid(g)
        g = g * (torch.rand_like(g) > mask_p)
    mask = torch.rand_like(g) > mask_p
    g = g * mask + (~mask) * (-1000)
    if safe_gate:
        g = g.clamp(-5, 0)
    beta = torch.rand(1, T, H, dtype=dtype).sigmoid()
    h0 = torch.randn((N, H, D, D), dtype=F32)
    q, k, v, g, beta, h0 = _dev(q, k, v, g, beta, h0)

    tri, tri_ht = chunk_kda(
        q=_unit(q), k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias,
        initial_state=h0.clone(), output_final_state=True, cu_seqlens=cu_seqlens,
        cu_seqlens_cpu=cu_seqlens.cpu(), use_gate_in_kernel=gate_in_kernel, safe_gate=safe_gate,
        disable_recompute=disable_recompute, chunk_size=chunk_size,
    )  # fmt: skip
    ref, ref_ht = [], []
    for i in range(N):
        s = slice(offsets[i], offsets[i + 1])
        g_i = g[:, s]
        if gate_in_kernel:
            g_i = naive_kda_gate(g_i.float(), A_log.float(), dt_bias.float())
        o_i, ht_i = naive_recurrent_kda(q=_unit(q[:, s]), k=k[:, s], v=v[:, s], beta=beta[:, s],
                                        g=g_i, initial_state=h0[i], output_final_state=True)  # fmt: skip
        ref.append(o_i)
        ref_ht.append(ht_i)
    assert_close("o", torch.cat(ref, 1), tri, 0.005)
    assert_close("ht", torch.cat(ref_ht, 0), tri_ht, 0.005)


@torch.no_grad()
@pytest.mark.parametrize("row", FUSED_RECURRENT, ids=_ids(FUSED_RECURRENT))
def test_fused_recurrent(row):
    B, T, H, HV, D, scale, norm, l2_in_kernel, dtype = row
    torch.manual_seed(42)
    q = torch.rand(B, T, H, D, dtype=dtype)
    k = torch.rand(B, T, H, D, dtype=dtype)
    v = torch.rand(B, T, HV, D, dtype=dtype)
    g = F.logsigmoid(torch.randn(B, T, HV, D, dtype=F32)) / norm
    beta = torch.randn(B, T, HV, dtype=dtype).sigmoid()
    h0 = torch.randn(B, HV, D, D, dtype=F32)
    q, k, v, g, beta, h0 = _dev(q, k, v, g, beta, h0)
    g_tri = g.clone()
    if triton.next_power_of_2(D) != D:
        # as fla: g sits right before 1e30s, so a read past column D shows as a wrong value
        pad = triton.next_power_of_2(D)
        buf = torch.full((g.numel() + pad,), 1e30, dtype=F32, device=DEVICE)
        g_tri = buf[: g.numel()].view_as(g).copy_(g)

    ref, ref_ht = naive_recurrent_kda(q=_unit(q), k=_unit(k), v=v, g=g, beta=beta, scale=scale,
                                      initial_state=h0.clone(), output_final_state=True)  # fmt: skip
    tri, tri_ht = fused_recurrent_kda(
        q=q if l2_in_kernel else _unit(q), k=k if l2_in_kernel else _unit(k), v=v, g=g_tri,
        beta=beta, scale=scale, initial_state=h0.clone(), output_final_state=True,
        use_qk_l2norm_in_kernel=l2_in_kernel,
    )  # fmt: skip
    assert_close("o", ref, tri, 0.005)
    assert_close("ht", ref_ht, tri_ht, 0.005)
