"""Context parallel prefill's compiled kernels on one GPU, at production size (K = V = 128, bf16).

The ranks are simulated in one process, one after another: a rank needs only the maps of the
ranks before it, so the exchange is replaced by the maps the earlier simulated ranks sent
(later slots zero; the chain never reads them). This checks the kernels and their compiled
variants (the combine kernel on the augmented [K, K + V] state, the chain with one segment per
rank) where no multi-GPU machine is at hand; the real collective is tested with gloo on the
interpreter lane and timed by ``kreg.families.kda.bench.cp`` under torchrun.
"""

from __future__ import annotations

import pytest
import torch

from kreg.families.kda import api
from kreg.families.kda import context_parallel as cp

pytestmark = pytest.mark.gpu

MAX_REL_RMS = 5e-3  # tests/test_kda_gpu.py's bound against the float64 loop
BF16 = torch.bfloat16


class _Ranks:
    """The simulated group: rank ``rank`` of ``world``; the maps sent so far."""

    def __init__(self, world):
        self.world, self.rank, self.sent = world, 0, {}

    def gather(self, send):
        self.sent[self.rank] = send.clone()
        return torch.stack([self.sent.get(r, torch.zeros_like(send)) for r in range(self.world)])


@pytest.fixture
def simulate(monkeypatch):
    def run(x, offsets, **kw):
        ranks = _Ranks(len(offsets) - 1)
        monkeypatch.setattr(cp, "_group", lambda g: (g.rank, g.world))
        monkeypatch.setattr(cp, "_all_gather", lambda send, g: g.gather(send))
        outs = []
        for r in range(ranks.world):
            ranks.rank = r
            a, b = offsets[r], offsets[r + 1]
            part = {n: t[:, a:b].contiguous() for n, t in x.items()}
            outs.append(cp.kda_prefill_cp(**part, group=ranks, cp_offsets=offsets, **kw))
        return outs

    return run


def _inputs(T, H, seed=0, B=1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    K = 128

    def randn(*s):
        return torch.randn(s, generator=gen, device="cuda")

    q = torch.nn.functional.normalize(randn(B, T, H, K), dim=-1).to(BF16)
    k = torch.nn.functional.normalize(randn(B, T, H, K), dim=-1).to(BF16)
    v = randn(B, T, H, K).to(BF16)
    g = (-0.2 * torch.rand(B, T, H, K, generator=gen, device="cuda")).to(BF16)  # mild decay
    beta = torch.rand(B, T, H, generator=gen, device="cuda").to(BF16)
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@torch.inference_mode()
def test_one_long_sequence_over_four_ranks(simulate):
    x = _inputs(32768, 8)
    cu = torch.tensor([0, 32768])
    offsets = (0, 8191, 16400, 16400, 32768)  # mid-chunk cuts and an empty rank
    h0 = 0.1 * torch.randn(1, 8, 128, 128, device="cuda")
    kw = dict(cu_seqlens=cu, initial_state=h0, output_final_state=True)
    outs = simulate(x, offsets, **kw)
    o = torch.cat([o for o, _ in outs], 1)
    ref_o, ref_ht = api.kda_prefill(**x, **kw)
    err_o, err_ht = _rel(o, ref_o), _rel(outs[-1][1], ref_ht)
    print(f"cp vs single: o {err_o:.2e}, state {err_ht:.2e}")
    assert err_o < MAX_REL_RMS and err_ht < MAX_REL_RMS
    # the carried state matters: slices from zeros are far off
    o0 = torch.cat([api.kda_prefill(**{n: t[:, a:b].contiguous() for n, t in x.items()})[0]
                    for a, b in zip(offsets, offsets[1:], strict=False) if b > a], 1)  # fmt: skip
    assert _rel(o0, ref_o) > 5 * err_o
    again = simulate(x, offsets, **kw)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(outs, again, strict=True))
    assert torch.equal(outs[-1][1], again[-1][1])


@torch.inference_mode()
def test_varlen_and_fixed_batches_with_cut_sequences(simulate):
    lens = [3000, 0, 9000, 1500, 2884]
    T = sum(lens)
    x = _inputs(T, 4, seed=1)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    offsets = (0, 5001, 12000, T)
    outs = simulate(x, offsets, cu_seqlens=cu, output_final_state=True, state_layout="vk")
    ref_o, ref_ht = api.kda_prefill(**x, cu_seqlens=cu, output_final_state=True,
                                    state_layout="vk")  # fmt: skip
    assert _rel(torch.cat([o for o, _ in outs], 1), ref_o) < MAX_REL_RMS
    ht = torch.empty_like(ref_ht)
    for r, (_, part) in enumerate(outs):
        ht[list(cp.plan_cp(offsets, r, cu_seqlens=cu).owned_seqs)] = part
    assert _rel(ht, ref_ht) < MAX_REL_RMS
    xb = _inputs(4096, 4, seed=2, B=3)
    outs = simulate(xb, (0, 1000, 4096), output_final_state=True)
    ref_o, ref_ht = api.kda_prefill(**xb, output_final_state=True)
    assert _rel(torch.cat([o for o, _ in outs], 1), ref_o) < MAX_REL_RMS
    assert _rel(outs[1][1], ref_ht) < MAX_REL_RMS
