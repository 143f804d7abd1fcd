"""The case-study probes carry their own evidence, measured in the compiled artefact: a probe
that silently does not run (the seed's failure mode) fails here.

Compiled for gfx950 (about a second a kernel on a CPU): the evidence is target-independent.
"""

from __future__ import annotations

import attrs

from kreg.families.kda.builders import (
    build_kda_chunk_fused,
    build_kda_chunk_prep,
)
from kreg.families.kda.specs import KdaChunkFusedSpec, KdaScanSpec, KdaTileSpec
from kreg.registry import get_registry

TILE = KdaTileSpec(head_dim_k=64, head_dim_v=64, dtype="fp16", chunk=16, num_warps=4,
                   fp32_dot="ieee")  # fmt: skip


def _target():
    return get_registry().targets["gfx950"]


def _dots(artifact) -> int:
    return artifact.stages["ttir"].count("tt.dot ")


def test_ballast_really_allocates_its_bytes():
    plain = build_kda_chunk_prep(TILE, _target())
    ballast = 64 * 1024
    probe = build_kda_chunk_prep(attrs.evolve(TILE, ballast_bytes=ballast), _target())
    # the allocator may overlay the kernel's own buffers on it: the total is at least the ballast
    assert probe.shared_bytes >= ballast > plain.shared_bytes, (plain.shared_bytes,
                                                                probe.shared_bytes)  # fmt: skip


def test_scan_ablation_removes_exactly_the_scan_step_and_keeps_every_tile():
    """The ablated fused kernel keeps every product of the tile phase (so each tile is still
    computed, none dead code) and drops exactly the scan step's four."""
    scan = KdaScanSpec(64, 64, "fp16", 16, block_v=64, num_warps=4, num_stages=1)
    full = build_kda_chunk_fused(KdaChunkFusedSpec(TILE, scan), _target())
    ablated = build_kda_chunk_fused(KdaChunkFusedSpec(TILE, scan, ablate_scan=True), _target())
    # the split path's kernel with the same tile phase
    tiles = build_kda_chunk_prep(TILE, _target())
    assert _dots(full) - _dots(ablated) == 4  # v_new, o (two), the state update
    assert _dots(ablated) == _dots(tiles)  # the whole tile phase is still there
