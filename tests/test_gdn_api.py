"""gdn_prefill's entry, on CPU without launching: the one signature, and each family's entry
refusing the other's gate by name, before any launch."""

from __future__ import annotations

import inspect

import pytest
import torch

from kreg.dispatch import select
from kreg.families.gdn import gdn_prefill
from kreg.families.kda import api, kda_prefill
from kreg.problems import LinearAttentionProblem

B, T, H, HV, K = 1, 16, 2, 4, 32


def inputs(gate_dims):
    q = torch.randn(B, T, H, K)
    return q, q.clone(), torch.randn(B, T, HV, K), -torch.rand(*gate_dims), torch.rand(B, T, HV)


def test_the_one_signature():
    assert inspect.signature(gdn_prefill) == api.PREFILL_SIGNATURE


@pytest.mark.parametrize(
    "entry,gate_dims,message",
    [
        (gdn_prefill, (B, T, HV, K), "a per-channel gate [B, T, HV, K] is KDA's"),
        (kda_prefill, (B, T, HV), "a scalar gate [B, T, HV] is GDN's"),
        (gdn_prefill, (B, T, HV - 1), "expected shape (1, 16, 4)"),
    ],
)
def test_each_entry_refuses_the_other_gate_by_name(entry, gate_dims, message):
    with pytest.raises(ValueError, match=r"^g: .*" + message.replace("[", r"\[").replace(
            "]", r"\]").replace("(", r"\(").replace(")", r"\)")):  # fmt: skip
        entry(*inputs(gate_dims))


def test_scalar_gate_parameters_are_per_head():
    q, k, v, g, beta = inputs((B, T, HV))
    with pytest.raises(ValueError, match=r"^dt_bias: expected shape \(4,\)"):
        gdn_prefill(q, k, v, g, beta, gate_activation="softplus", dt_bias=torch.zeros(HV, K))
    with pytest.raises(ValueError, match=r"^A_log: expected shape \(4,\)"):
        gdn_prefill(q, k, v, g, beta, gate_activation="softplus", A_log=torch.zeros(HV + 1))


def test_the_scalar_gate_scan_runs_unpipelined_and_kda_keeps_its_pipelines():
    """GDN's scan (q and k read in it) measured fastest at one stage (plugin.
    SCALAR_SCAN_STAGE_UNITS); the tie-break must not touch KDA's choices."""
    d = 128  # Qwen3-Next's head dim, where it was measured
    for T, seqs in ((8192, 1), (4096, 1), (8192, 7)):
        scalar = LinearAttentionProblem(1, T, 16, 32, d, d, gate="scalar",
                                        gate_activation="softplus", qk_l2norm=True,
                                        varlen=seqs > 1, num_seqs=seqs)  # fmt: skip
        sel = select(scalar, "sm90")
        assert sel.candidate.name == "gdn.split" and sel.spec.scan.num_stages == 1, sel.spec
        assert sel.spec.tile.chunk == 32  # not the single-stage chunk 64 the rules refuse
    channel = LinearAttentionProblem(1, 8192, 32, 32, d, d)
    assert select(channel, "sm90").spec.scan.num_stages > 1


def test_short_algorithm_names_resolve_to_the_family_that_takes_the_problem():
    scalar = LinearAttentionProblem(B, 4096, H, HV, K, K, gate="scalar")
    channel = LinearAttentionProblem(B, 4096, H, HV, K, K)
    assert select(scalar, "sm90", algorithm="split").candidate.name == "gdn.split"
    assert select(channel, "sm90", algorithm="split").candidate.name == "kda.split"
    assert select(scalar, "sm90", algorithm="fused", allow_opt_in=True).candidate.name == (
        "gdn.fused")  # fmt: skip
    with pytest.raises(ValueError, match="unknown algorithm 'gdn.nope'"):
        select(scalar, "sm90", algorithm="gdn.nope")
