"""KDA's golden IR cases: the (candidate, spec) pairs whose normalised IR is pinned per target.

The representative cases are head dim 128 bf16 at chunks 32 (the specs the dispatcher picks for
the default problem on sm90 and gfx950) and 16, plus chunk 64 at head dim 64 (head dim 128 at
chunk 64 is rejected on every target by the shared-memory rules). The option cases turn on, one
group at a time, every spec field that is off by default; they use small head dims so that most
of them are valid, and therefore pinned, on all three targets. A case whose spec is invalid on
a target is recorded as skipped there (with the reasons) instead of compiled.

Case names are the stems of the golden keys (``kda/<case>/<target>/<kernel>``): keep them unique.
"""

from __future__ import annotations

from kreg.registry.model import GoldenCase

from .recurrent import KdaRecurrentSpec
from .specs import KdaChunkFusedSpec, KdaScanSpec, KdaSplitSpec, KdaTileSpec


def _split(d, chunk, *, fp32_dot="ieee", block_v=32, stages=1, warps=4, tile=None, scan=None,
           **shape):  # fmt: skip
    tile = KdaTileSpec(d, d, chunk=chunk, solve_block=16, num_warps=warps, fp32_dot=fp32_dot,
                       **shape, **(tile or {}))  # fmt: skip
    scan = KdaScanSpec(d, d, chunk=chunk, block_v=min(block_v, d), num_stages=stages, **shape,
                       **(scan or {}))  # fmt: skip
    return KdaSplitSpec(tile, scan)


def _fused(d, chunk, *, warps=4, tile=None, scan=None, **shape):
    t = KdaTileSpec(d, d, chunk=chunk, solve_block=16, num_warps=warps, **shape, **(tile or {}))
    s = KdaScanSpec(d, d, chunk=chunk, block_v=d, num_warps=warps, num_stages=1, **shape,
                    **(scan or {}))  # fmt: skip
    return KdaChunkFusedSpec(t, s)


_STATES = dict(initial_state=True, state_dtype="bf16", output_final_state=True)
# chunk states every 64 tokens (the default): every 2nd chunk at chunk 32, bf16 here; the fused
# case below stores every 4th chunk's (chunk 16) of varlen sequences, through the row table
_CHUNK_STATES_VK = dict(output_chunk_states=True, state_layout="vk", chunk_states_dtype="bf16")
_ALL_SCAN = dict(initial_state=True, output_final_state=True, **_CHUNK_STATES_VK)

CASES = (
    # representative: head dim 128, bf16
    GoldenCase("split_d128_c32_tf32", "kda.split",
               _split(128, 32, fp32_dot="tf32", stages=2),
               note="the sm90 dispatch default for the default problem"),
    GoldenCase("split_d128_c32", "kda.split", _split(128, 32),
               note="the gfx950 dispatch default for the default problem"),
    GoldenCase("split_d128_c16", "kda.split", _split(128, 16, block_v=64)),
    GoldenCase("split_d64_c64", "kda.split", _split(64, 64, warps=8),
               note="chunk 64 (head dim 128 at chunk 64 is rejected on every target)"),
    GoldenCase("fused_d128_c32", "kda.fused", _fused(128, 32)),
    GoldenCase("fused_d64_c64", "kda.fused", _fused(64, 64, warps=8)),
    # options that are off by default, on the split path (head dim 32: valid on every target)
    GoldenCase("split_sigmoid_bound_beta_sigmoid", "kda.split",
               _split(32, 32, tile=dict(gate_activation="sigmoid_bound", beta_sigmoid=True))),
    GoldenCase("split_softplus_qk_l2norm", "kda.split",
               _split(32, 32, tile=dict(gate_activation="softplus", qk_l2norm=True))),
    GoldenCase("split_varlen_states", "kda.split", _split(32, 32, varlen=True, scan=_STATES),
               note="varlen, bf16 initial state, final state"),
    GoldenCase("split_chunk_states_vk", "kda.split", _split(32, 32, scan=_CHUNK_STATES_VK)),
    GoldenCase("split_segments", "kda.split", _split(64, 32, scan=dict(segment_chunks=16)),
               note="sequence-parallel scan (the scan kernel's segment mode)"),
    GoldenCase("split_fp16", "kda.split", _split(32, 32, dtype="fp16")),
    # options on the fused path (head dim 64, chunk 16: valid on every target)
    GoldenCase("fused_all_options", "kda.fused",
               _fused(64, 16, varlen=True, scan=_ALL_SCAN,
                      tile=dict(gate_activation="sigmoid_bound", qk_l2norm=True,
                                beta_sigmoid=True)),
               note="every tile and scan option on at once"),
    GoldenCase("fused_fp16_softplus", "kda.fused",
               _fused(64, 16, dtype="fp16", tile=dict(gate_activation="softplus"))),
    # the decode candidate: the dispatcher's sm90 pick for a one-token step at head dim 128,
    # and every option on (a pool in place, varlen, gate, norms, vk) at head dim 64
    GoldenCase("recurrent_d128", "kda.recurrent",
               KdaRecurrentSpec(block_v=16, num_warps=1, num_stages=1, initial_state=True,
                                output_final_state=True),
               note="one decode step with states in and out"),
    GoldenCase("recurrent_pool_all_options", "kda.recurrent",
               KdaRecurrentSpec(64, 64, block_v=32, num_warps=2, num_stages=1,
                                gate_activation="sigmoid_bound", qk_l2norm=True,
                                beta_sigmoid=True, initial_state=True, output_final_state=True,
                                state_pool=True, state_layout="vk", varlen=True),
               note="state pool written in place, varlen, every option on"),
)  # fmt: skip


def golden_cases() -> tuple[GoldenCase, ...]:
    return CASES
