"""GDN's golden IR cases: the scalar-gate kernels (prep, scan, fused, recurrence) at the
representative Qwen3-Next head dim 128, and every option at once at head dim 64. The scan's
scalar-gate branch reads q and k with the prep's row scales (kernels._scan_step); the segment
combine is the one KDA's cases pin."""

from __future__ import annotations

from kreg.families.kda.recurrent import KdaRecurrentSpec
from kreg.families.kda.specs import KdaChunkFusedSpec, KdaScanSpec, KdaSplitSpec, KdaTileSpec
from kreg.registry.model import GoldenCase

_SCALAR = dict(scalar_gate=True)


def _split(d, chunk, *, fp32_dot="ieee", anchor="safe", tile=None, **shape):
    tile = KdaTileSpec(d, d, chunk=chunk, solve_block=16, fp32_dot=fp32_dot, anchor=anchor,
                       **shape, **_SCALAR, **(tile or {}))  # fmt: skip
    return KdaSplitSpec(tile, KdaScanSpec(d, d, chunk=chunk, block_v=32, **shape, **_SCALAR))


CASES = (
    GoldenCase("split_d128_c32_softplus", "gdn.split",
               _split(128, 32, fp32_dot="tf32",
                      tile=dict(gate_activation="softplus", qk_l2norm=True)),
               note="Qwen3-Next's call: softplus gate and L2 norm in the kernel"),
    GoldenCase("split_d64_c32_block", "gdn.split",
               _split(64, 32, anchor="block", varlen=True,
                      tile=dict(gate_activation="sigmoid_bound", beta_sigmoid=True)),
               note="a promised bound (block anchor), varlen"),
    GoldenCase("fused_d64_c16", "gdn.fused",
               KdaChunkFusedSpec(
                   KdaTileSpec(64, 64, chunk=16, solve_block=16, gate_activation="softplus",
                               **_SCALAR),
                   KdaScanSpec(64, 64, chunk=16, block_v=64, num_stages=1, initial_state=True,
                               output_final_state=True, **_SCALAR))),
    GoldenCase("recurrent_pool_softplus", "gdn.recurrent",
               KdaRecurrentSpec(128, 128, block_v=16, num_warps=1, num_stages=1,
                                gate_activation="softplus", qk_l2norm=True, initial_state=True,
                                output_final_state=True, state_pool=True, varlen=True,
                                **_SCALAR),
               note="a decode step on a state pool, as the engines call it"),
)  # fmt: skip


def golden_cases() -> tuple[GoldenCase, ...]:
    return CASES
