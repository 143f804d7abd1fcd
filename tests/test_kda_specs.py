"""KDA specs: admission and rejection rules (with their reasons), the numeric rule, the builders on
every target, and the shared-memory estimate as an upper bound of the compiled size.

Compiles for sm90, gfx950 and gfx942 on a CPU-only machine (Triton's AOT path); runs in the main
(non-interpreter) process only.

The footprint check compiles every distinct kernel of every valid enumerated spec of both
candidates on every target (prep, scan, fused, and the sequence-parallel scan's segment map and
combine kernels) when ``KREG_TEST_FOOTPRINT=all``: about 4.5 minutes on the 2-core CI box, over
budget. By default it compiles a fixed subset, about half of that: every scan, segment map and
combine kernel, and every prep and fused kernel with ``solve_block=16``. The ``solve_block=32``
variants compile slowest (their solve unrolls twice as deep) and allocate the same shared memory
as their ``solve_block=16`` twins (same chunk, head dims, dtype and warps) in the full run.
"""

from __future__ import annotations

import os

import attrs
import pytest

from kreg.dispatch import NoCandidateError, select
from kreg.families.kda import specs as S
from kreg.families.kda.builders import (
    PAIRS_ROWS_PER_WARP,
    build_kda_chunk_fused,
    build_kda_chunk_pairs,
    build_kda_chunk_prep,
    build_kda_chunk_scan,
    build_kda_segment_combine,
    build_kda_segment_map,
)
from kreg.families.kda.plugin import FUSED, SPLIT
from kreg.problems import LinearAttentionProblem
from kreg.registry import get_registry
from kreg.registry.interpreter import interpreting
from kreg.registry.targets import GFX942, GFX950, SM90

pytestmark = pytest.mark.skipif(
    interpreting(), reason="kernels defined under TRITON_INTERPRET=1 cannot be compiled"
)

TARGETS = {t.name: t for t in (SM90, GFX950, GFX942)}
FULL_FOOTPRINT = os.environ.get("KREG_TEST_FOOTPRINT", "") == "all"


def problem(**kw):
    base = dict(batch=1, seq_len=2048, heads_qk=32, heads_v=32, head_dim_k=128, head_dim_v=128)
    return LinearAttentionProblem(**{**base, **kw})


def reasons_of(verdict) -> str:
    assert not verdict.ok, "expected a rejection"
    return " | ".join(verdict.reasons)


# --- the registered targets are the ones these tests reason about ------------------------------


def test_builtin_targets_are_registered():
    registry = get_registry()
    for name, target in TARGETS.items():
        assert registry.targets[name] == target
    assert [c.name for c in get_registry().families["kda"].candidates] == [
        "kda.split",
        "kda.recurrent",
        "kda.fused",
    ]


# --- tile (prep) spec rules ---------------------------------------------------------------------

TILE_REJECTIONS = [
    # (id, spec changes, target, reason fragment)
    ("head_dim_k", dict(head_dim_k=48), "sm90", "head_dim_k=48 not in supported"),
    ("head_dim_v", dict(head_dim_v=96), "sm90", "head_dim_v=96 not in supported"),
    ("chunk", dict(chunk=128), "sm90", "chunk=128 not in (16, 32, 64)"),
    ("chunk_small", dict(chunk=8, solve_block=16), "sm90", "chunk=8 not in"),
    ("dtype", dict(dtype="fp8"), "sm90", "dtype='fp8' not in"),
    ("solve_block", dict(solve_block=8), "sm90", "solve_block=8 not in (16, 32)"),
    ("solve_block_divides", dict(chunk=16, solve_block=32), "sm90",
     "solve_block=32 must divide chunk=16"),
    ("num_warps", dict(num_warps=3), "sm90", "num_warps=3 not a power of 2"),
    ("num_warps_big", dict(num_warps=32), "sm90", "num_warps=32"),
    ("tf32_gfx950", dict(fp32_dot="tf32"), "gfx950", "fp32_dot='tf32' not available on gfx950"),
    ("tf32_gfx942", dict(chunk=16, head_dim_k=32, head_dim_v=32, fp32_dot="tf32"), "gfx942",
     "fp32_dot='tf32' not available on gfx942"),
    ("tf32x3_gfx950", dict(fp32_dot="tf32x3"), "gfx950", "fp32_dot='tf32x3' not available"),
    ("unknown_precision", dict(fp32_dot="bf16x3"), "sm90", "fp32_dot='bf16x3' not available"),
    ("shared_per_block_gfx942", dict(chunk=64), "gfx942",
     "shared memory estimate 114688 B > 65536 B per block on gfx942"),
    ("ballast", dict(ballast_bytes=100), "sm90", "ballast_bytes=100 must be 0 or a power of 2"),
    # masked tiles: the caller's head dims below the kernel's, or 0
    ("input_dim_k_full", dict(input_dim_k=128), "sm90", "input_dim_k=128, input_dim_v=0 must be 0"),
    ("input_dim_v_above", dict(input_dim_v=200), "sm90", "input_dim_k=0, input_dim_v=200 must be 0"),
    ("input_dim_negative", dict(input_dim_k=-1), "sm90", "input_dim_k=-1"),
    ("input_dim_scalar_gate", dict(input_dim_k=96, scalar_gate=True), "sm90",
     "a scalar gate's kernels run on padded copies"),
    ("ballast_small", dict(ballast_bytes=256), "sm90", "ballast_bytes=256"),
    ("shared_per_block_gfx950", dict(head_dim_k=256, head_dim_v=256, chunk=64), "gfx950",
     "shared memory estimate 212992 B > 163840 B per block on gfx950"),
]  # fmt: skip


@pytest.mark.parametrize("changes,target,fragment", [c[1:] for c in TILE_REJECTIONS],
                         ids=[c[0] for c in TILE_REJECTIONS])  # fmt: skip
def test_tile_rejections(changes, target, fragment):
    spec = attrs.evolve(S.KdaTileSpec(chunk=16), **changes)
    assert fragment in reasons_of(S.is_valid_tile_spec(spec, TARGETS[target]))


def test_tile_admissions():
    for fp32_dot in ("tf32", "tf32x3", "ieee"):
        assert S.is_valid_tile_spec(S.KdaTileSpec(chunk=32, fp32_dot=fp32_dot), SM90).ok
    assert S.is_valid_tile_spec(S.KdaTileSpec(chunk=16), GFX950).ok
    assert S.is_valid_tile_spec(S.KdaTileSpec(head_dim_k=32, head_dim_v=32, chunk=32), GFX942).ok
    # head dim 256 at chunk 64 fits sm90's 227 KiB per block, not gfx950's 160 KiB
    big = S.KdaTileSpec(head_dim_k=256, head_dim_v=256, chunk=64)
    assert big.shared_bytes_estimate() == 212992
    assert S.is_valid_tile_spec(big, SM90).ok
    assert not S.is_valid_tile_spec(big, GFX950).ok


def test_masked_tiles_pair_only_with_the_same_caller_dims():
    tile = S.KdaTileSpec(chunk=16, input_dim_k=96, input_dim_v=96)
    scan = S.KdaScanSpec(chunk=16, input_dim_k=96, input_dim_v=96)
    assert S.is_valid_split_spec(S.KdaSplitSpec(tile, scan), SM90).ok
    other = attrs.evolve(scan, input_dim_v=0)
    assert "disagree on head dims" in reasons_of(
        S.is_valid_split_spec(S.KdaSplitSpec(tile, other), SM90)
    )
    assert "input_dim_k=96, input_dim_v=200 must be 0" in reasons_of(
        S.is_valid_scan_spec(attrs.evolve(scan, input_dim_v=200), SM90)
    )


def test_every_reason_is_listed():
    spec = S.KdaTileSpec(head_dim_k=48, chunk=16, solve_block=32, fp32_dot="tf32")
    reasons = S.is_valid_tile_spec(spec, GFX950).reasons
    assert len(reasons) == 3
    assert "head_dim_k=48" in reasons[0]
    assert "must divide chunk=16" in reasons[1]
    assert "fp32_dot='tf32'" in reasons[2]


# --- the numeric rule --------------------------------------------------------------------------


def test_numeric_rule():
    bad = S.numeric_rule(32, -5.0)
    assert "solve_block=32 at gate lower bound -5 spans 160 nats > 85" in reasons_of(bad)
    assert S.numeric_rule(16, -5.0).ok  # 80 nats
    assert S.numeric_rule(32, -2.5).ok  # 80 nats
    assert not S.numeric_rule(32, -2.7).ok  # 86.4 nats
    assert S.numeric_rule(32, -0.1).ok
    unbounded = reasons_of(S.numeric_rule(16, None))
    assert "unbounded gates" in unbounded and "no bound for any solve_block" in unbounded


def test_numeric_rule_applies_with_a_problem_only():
    spec = S.KdaTileSpec(chunk=32, solve_block=32, fp32_dot="tf32", anchor="block")
    assert S.is_valid_tile_spec(spec, SM90).ok  # hardware rules alone
    assert "160 nats" in reasons_of(
        S.is_valid_tile_spec(spec, SM90, problem(gate_lower_bound=-5.0))
    )
    assert S.is_valid_tile_spec(spec, SM90, problem(gate_lower_bound=-1.0)).ok
    assert "unbounded" in reasons_of(
        S.is_valid_tile_spec(spec, SM90, problem(gate_lower_bound=None))
    )
    # the split and fused rules carry it
    split = S.KdaSplitSpec(spec, S.KdaScanSpec(chunk=32))
    assert "160 nats" in reasons_of(
        S.is_valid_split_spec(split, SM90, problem(gate_lower_bound=-5.0))
    )
    fused = S.KdaChunkFusedSpec(spec, S.KdaScanSpec(chunk=32, block_v=128))
    assert "160 nats" in reasons_of(
        S.is_valid_fused_spec(fused, SM90, problem(gate_lower_bound=-5.0))
    )


@pytest.mark.parametrize(
    "bound, solve_block, anchor",
    [(None, 16, "safe"), (None, 32, "safe"), (-5.0, 16, "block"), (-5.0, 32, "safe"),
     (-2.5, 32, "block"), (-6.0, 16, "safe")],
)  # fmt: skip
def test_the_anchor_follows_the_problem(bound, solve_block, anchor):
    """Specialising picks the block anchor exactly where the promised bound keeps the span
    within the numeric rule, the safe anchor everywhere else (unbounded gates included)."""
    p = problem(gate_lower_bound=bound, head_dim_k=32, head_dim_v=32)
    for target in TARGETS.values():
        for cand in (SPLIT, FUSED):
            valid = [
                s
                for s in (cand.specialize(s, p) for s in cand.enumerate_specs(target))
                if s is not None and cand.is_valid(s, target, p)
            ]
            assert valid, (target.name, cand.name)
            got = {s.tile.anchor for s in valid if s.tile.solve_block == solve_block}
            assert got == {anchor}, (target.name, cand.name, got)


def test_block_anchor_pinned_on_unbounded_gates_is_refused_with_the_reason():
    spec = S.KdaSplitSpec(S.KdaTileSpec(chunk=32, anchor="block"), S.KdaScanSpec(chunk=32))
    reasons = reasons_of(S.is_valid_split_spec(spec, SM90, problem(gate_lower_bound=None)))
    assert "unbounded gates" in reasons and "anchor='safe'" in reasons


# --- scan spec rules ---------------------------------------------------------------------------


def test_scan_occupancy_rule():
    """Fits one block on sm90, but not two per SM: rejected for min_occupancy=2, not for 1."""
    spec = S.KdaScanSpec(chunk=64, block_v=64)
    est = spec.shared_bytes_estimate()
    assert est == 155648
    assert SM90.shared_mem_per_unit // 2 < est <= SM90.shared_mem_per_block
    text = reasons_of(S.is_valid_scan_spec(spec, SM90))
    assert "shared memory estimate 155648 B > 116736 B" in text
    assert "min_occupancy 2" in text
    assert S.is_valid_scan_spec(attrs.evolve(spec, min_occupancy=1), SM90).ok


SCAN_REJECTIONS = [
    ("block_v_not_pow2", dict(block_v=48), "block_v=48 must be a power of 2"),
    ("block_v_small", dict(block_v=8), "block_v=8 must be a power of 2 in [16"),
    ("block_v_wide", dict(block_v=256), "block_v=256 must be a power of 2 in [16, head_dim_v=128]"),
    ("num_warps", dict(num_warps=6), "num_warps=6"),
    ("num_stages", dict(num_stages=0), "num_stages=0 must be >= 1"),
    ("min_occupancy", dict(min_occupancy=0), "min_occupancy=0 must be >= 1"),
    ("state_layout", dict(state_layout="kk"), "state_layout='kk' not one of ('kv', 'vk')"),
    ("state_dtype", dict(state_dtype="fp16"), "state_dtype='fp16' not fp32/bf16"),
    ("chunk", dict(chunk=48), "chunk=48 not in"),
    ("head_dim", dict(head_dim_k=96), "head_dim_k=96 not in supported"),
    ("segment_chunks", dict(segment_chunks=-1), "segment_chunks=-1 must be >= 0"),
    (
        "combine_too_big",
        dict(head_dim_k=256, head_dim_v=256, block_v=256, segment_chunks=16),
        "segment combine shared memory estimate 589824 B > 232448 B per block on sm90",
    ),
]


@pytest.mark.parametrize("changes,fragment", [c[1:] for c in SCAN_REJECTIONS],
                         ids=[c[0] for c in SCAN_REJECTIONS])  # fmt: skip
def test_scan_rejections(changes, fragment):
    spec = attrs.evolve(S.KdaScanSpec(chunk=16, block_v=64), **changes)
    assert fragment in reasons_of(S.is_valid_scan_spec(spec, SM90))


def test_single_stage_scans_are_enumerated_up_to_chunk_32_on_cuda():
    """GDN's heuristic takes a single-stage scan where offered (plugin.SCALAR_SCAN_STAGE_UNITS);
    at chunk 64 one faulted on an H100 and its prep is slow, so cuda offers none there (a
    hand-made one stays valid: the interpreter lane runs them)."""
    cuda = {(s.chunk, s.num_stages) for s in S.enumerate_scan_specs(SM90)}
    assert (32, 1) in cuda and (16, 1) in cuda and (64, 1) not in cuda
    assert (64, 1) in {(s.chunk, s.num_stages) for s in S.enumerate_scan_specs(GFX950)}
    assert S.is_valid_scan_spec(S.KdaScanSpec(chunk=64, block_v=32, num_stages=1), SM90).ok


def test_scan_admissions():
    assert S.is_valid_scan_spec(S.KdaScanSpec(chunk=16, block_v=64), SM90).ok
    assert S.is_valid_scan_spec(S.KdaScanSpec(chunk=16, block_v=64, num_stages=1), GFX950).ok
    assert S.is_valid_scan_spec(S.KdaScanSpec(chunk=16, block_v=64, segment_chunks=16), SM90).ok
    small = S.KdaScanSpec(head_dim_k=32, head_dim_v=32, chunk=16, block_v=32)
    assert S.is_valid_scan_spec(small, GFX942).ok
    for opts in (dict(state_layout="vk"), dict(state_dtype="bf16", initial_state=True),
                 dict(output_chunk_states=True, output_final_state=True, varlen=True)):  # fmt: skip
        assert S.is_valid_scan_spec(attrs.evolve(small, **opts), GFX942).ok


# --- split pairing and fused rules -------------------------------------------------------------


def test_pairing_rule():
    tile = S.KdaTileSpec(chunk=16)
    for scan in (S.KdaScanSpec(chunk=32), S.KdaScanSpec(chunk=16, dtype="fp16"),
                 S.KdaScanSpec(chunk=16, varlen=True), S.KdaScanSpec(chunk=16, scalar_gate=True),
                 S.KdaScanSpec(head_dim_k=64, head_dim_v=64, chunk=16)):  # fmt: skip
        text = reasons_of(S.is_valid_split_spec(S.KdaSplitSpec(tile, scan), SM90))
        assert (
            "tile and scan specs disagree on head dims, dtype, chunk, varlen or scalar_gate" in text
        )
    assert S.is_valid_split_spec(S.KdaSplitSpec(tile, S.KdaScanSpec(chunk=16)), SM90).ok


def test_fused_rules():
    tile = S.KdaTileSpec(chunk=16)
    ok = S.KdaChunkFusedSpec(tile, S.KdaScanSpec(chunk=16, block_v=128))
    assert S.is_valid_fused_spec(ok, SM90).ok
    narrow = attrs.evolve(ok, scan=attrs.evolve(ok.scan, block_v=64))
    assert "fused block_v=64 must equal head_dim_v=128" in reasons_of(
        S.is_valid_fused_spec(narrow, SM90)
    )
    warps = attrs.evolve(ok, scan=attrs.evolve(ok.scan, num_warps=8))
    assert "scan num_warps=8 must equal tile num_warps=4" in reasons_of(
        S.is_valid_fused_spec(warps, SM90)
    )
    for probe in (dict(looped=True), dict(ballast_bytes=1024)):
        text = reasons_of(S.is_valid_fused_spec(attrs.evolve(ok, tile=attrs.evolve(tile, **probe)),
                                                SM90))  # fmt: skip
        assert "fused takes no prep-kernel probes" in text
    seg = attrs.evolve(ok, scan=attrs.evolve(ok.scan, segment_chunks=16))
    assert "segment_chunks=16 must be 0" in reasons_of(S.is_valid_fused_spec(seg, SM90))
    assert S.is_valid_fused_spec(attrs.evolve(ok, ablate_scan=True), SM90).ok
    paired = attrs.evolve(ok, scan=attrs.evolve(ok.scan, chunk=32))
    assert "tile and scan specs disagree" in reasons_of(S.is_valid_fused_spec(paired, SM90))
    # the occupancy budget: head dim 128 at chunk 32 fits sm90 twice per SM, not gfx942
    mid = S.KdaChunkFusedSpec(S.KdaTileSpec(chunk=32), S.KdaScanSpec(chunk=32, block_v=128))
    assert S.is_valid_fused_spec(mid, SM90).ok
    text = reasons_of(S.is_valid_fused_spec(mid, GFX942))
    assert "shared memory estimate" in text and "min_occupancy 2" in text
    assert mid.shared_bytes_estimate() == max(
        S.KdaTileSpec(chunk=32).shared_bytes_estimate(),
        S._scan_phase_bytes(mid.scan, 128, 1),
    )
    # the scan's state rules hold whichever kernel runs the scan: a fused chunk of 64 once
    # stored garbage chunk states every 16 tokens (its stride came out 0)
    wide = S.KdaChunkFusedSpec(S.KdaTileSpec(chunk=64, head_dim_k=32, head_dim_v=32),
                               S.KdaScanSpec(head_dim_k=32, head_dim_v=32, chunk=64, block_v=32,
                                             output_chunk_states=True, chunk_states_size=16))  # fmt: skip
    assert "chunk_states_size=16 is not a multiple of chunk=64" in reasons_of(
        S.is_valid_fused_spec(wide, SM90)
    )


@pytest.mark.parametrize("algorithm", ["kda.split", "kda.fused"])
@pytest.mark.parametrize("size", [16, 32, 48, 64, 128])
def test_chunk_state_spacing_is_served_at_a_chunk_dividing_it(algorithm, size):
    problem = LinearAttentionProblem(batch=1, seq_len=200, heads_qk=2, heads_v=2, head_dim_k=32,
                                     head_dim_v=32, output_chunk_states=True,
                                     chunk_states_size=size)  # fmt: skip
    sel = select(problem, SM90, algorithm=algorithm, allow_opt_in=True)
    assert size % sel.spec.scan.chunk == 0 and sel.spec.scan.chunk_states_every == size // (
        sel.spec.scan.chunk
    )


# --- enumerations and specialisation -------------------------------------------------------------


@pytest.mark.parametrize("target", list(TARGETS.values()), ids=list(TARGETS))
def test_enumerations(target):
    allowed = S.FP32_DOT_BY_BACKEND[target.backend]
    for tile in S.enumerate_tile_specs(target):
        assert tile.fp32_dot in allowed
    for split in S.enumerate_split_specs(target):
        assert S._pairing_rule(split.tile, split.scan).ok
    for fused in S.enumerate_fused_specs(target):
        assert fused.scan.block_v == fused.tile.head_dim_v
        assert fused.scan.num_warps == fused.tile.num_warps
    n_valid = [
        sum(bool(c.is_valid(s, target)) for s in c.enumerate_specs(target)) for c in (SPLIT, FUSED)
    ]
    assert all(n > 0 for n in n_valid), n_valid


def test_specialize_fills_problem_fields():
    p = problem(head_dim_k=64, head_dim_v=64, dtype="fp16", gate_activation="sigmoid_bound",
                gate_lower_bound=-5.0,
                qk_l2norm=True, beta_sigmoid=True, initial_state=True, state_dtype="bf16",
                output_final_state=True, state_layout="vk", output_chunk_states=True,
                varlen=True, num_seqs=3)  # fmt: skip
    split = S.KdaSplitSpec(S.KdaTileSpec(64, 64, chunk=32), S.KdaScanSpec(64, 64, chunk=32))
    out = S.specialize_split(split, p)
    assert (out.tile.dtype, out.scan.dtype, out.tile.varlen, out.scan.varlen) == (
        "fp16", "fp16", True, True)  # fmt: skip
    assert (out.tile.gate_activation, out.tile.qk_l2norm, out.tile.beta_sigmoid) == (
        "sigmoid_bound", True, True)  # fmt: skip
    assert (out.scan.initial_state, out.scan.state_dtype, out.scan.output_final_state,
            out.scan.state_layout, out.scan.output_chunk_states) == (
        True, "bf16", True, "vk", True)  # fmt: skip
    assert (out.tile.chunk, out.scan.block_v) == (32, 64)  # tuning fields kept
    assert S.specialize_split(S.KdaSplitSpec(), p) is None  # head dim 128 != 64
    fused = S.specialize_fused(S.KdaChunkFusedSpec(S.KdaTileSpec(64, 64), S.KdaScanSpec(64, 64)), p)
    assert fused.tile.dtype == fused.scan.dtype == "fp16"
    assert S.specialize_fused(S.KdaChunkFusedSpec(), p) is None


def test_dispatcher_defaults():
    """Every target serves the default problem; on gfx942 (64 KiB LDS) at head dim 128 only
    chunk 16 keeps two scan programs per CU, and the trace says why chunk 32 does not."""
    for target in ("sm90", "gfx950", "gfx942"):
        sel = select(problem(), target)
        assert sel.candidate is SPLIT
        assert SPLIT.is_valid(sel.spec, sel.target, problem()).ok
    sel = select(problem(), "gfx942")
    assert sel.spec.tile.chunk == 16
    c32 = [s for s in SPLIT.enumerate_specs(sel.target)
           if s.tile.chunk == 32 and s.tile.head_dim_k == 128]  # fmt: skip
    assert c32 and all("min_occupancy 2" in reasons_of(SPLIT.is_valid(s, sel.target)) for s in c32)
    assert select(problem(head_dim_k=64, head_dim_v=64), "gfx942").candidate is SPLIT
    # fused at head dim 128: not on gfx942, whose 64 KiB LDS does not hold its tile phase twice
    for target in ("sm90", "gfx950"):
        assert select(problem(), target, algorithm="fused").candidate is FUSED
    with pytest.raises(NoCandidateError, match="candidate kda.fused cannot serve"):
        select(problem(), "gfx942", algorithm="fused")


# --- builders on every target --------------------------------------------------------------------

_BUILDERS = {
    "pairs": build_kda_chunk_pairs,
    "prep": build_kda_chunk_prep,
    "scan": build_kda_chunk_scan,
    "fused": build_kda_chunk_fused,
}
_KERNEL_NAMES = {
    "pairs": "kda_chunk_pairs_kernel",
    "prep": "kda_chunk_prep_kernel",
    "scan": "kda_chunk_scan_kernel",
    "fused": "kda_chunk_fused_kernel",
    "segment_map": "kda_segment_map_kernel",
    "segment_combine": "kda_segment_combine_kernel",
}
# the representative problem per target: the default one where a spec is valid for it
_D64 = problem(head_dim_k=64, head_dim_v=64)
_REPRESENTATIVE = {"sm90": problem(), "gfx950": problem(), "gfx942": _D64}
_FUSED_REPRESENTATIVE = {"sm90": problem(), "gfx950": _D64, "gfx942": _D64}


def _check_artifact(art, target, kernel):
    asm = "ptx" if target.backend == "cuda" else "amdgcn"
    assert {"ttir", "ttgir", "llir", asm} <= set(art.stages)
    for stage in ("ttir", "ttgir", "llir", asm):
        assert len(art.stages[stage]) > 1000, stage
    assert art.kernel == _KERNEL_NAMES[kernel]
    assert art.target == target.name
    assert art.binary
    assert 0 < art.shared_bytes <= target.shared_mem_per_block
    assert isinstance(art.registers, int) and 0 < art.registers <= target.max_registers_per_thread
    assert isinstance(art.spills, int) and art.spills >= 0


@pytest.mark.parametrize("target", list(TARGETS), ids=list(TARGETS))
def test_builders_compile_the_dispatch_choice(target):
    t = TARGETS[target]
    split = select(_REPRESENTATIVE[target], t)
    assert split.candidate is SPLIT
    for kernel, build in SPLIT.builders.items():
        art = build(split.spec, t)
        if art is None:  # a kernel the spec does not use: the segment passes without segments
            assert kernel.startswith("segment_") and not split.spec.scan.segment_chunks
            continue
        _check_artifact(art, t, kernel)
        if kernel == "pairs":  # the default problem has no bound: the safe anchor's
            assert art.shared_bytes <= split.spec.tile.pairs_shared_bytes_estimate()
            assert art.num_warps == split.spec.tile.chunk // PAIRS_ROWS_PER_WARP
            continue
        scan = split.spec.scan
        if kernel == "segment_combine":
            assert art.shared_bytes <= scan.combine_shared_bytes_estimate()
            continue
        part = split.spec.tile if kernel.startswith("prep") else scan
        assert art.shared_bytes <= part.shared_bytes_estimate()
        assert art.num_warps == part.num_warps
    fused = select(_FUSED_REPRESENTATIVE[target], t, algorithm="fused")
    art = FUSED.builders["fused"](fused.spec, t)
    _check_artifact(art, t, "fused")
    assert art.shared_bytes <= fused.spec.shared_bytes_estimate()


# --- the footprint estimate bounds the compiled size ---------------------------------------------


def _kernel_specs():
    """(target, kernel, spec) for every distinct kernel of every valid enumerated spec."""
    out = []
    for name, target in TARGETS.items():
        splits = [s for s in SPLIT.enumerate_specs(target) if SPLIT.is_valid(s, target)]
        fused = [s for s in FUSED.enumerate_specs(target) if FUSED.is_valid(s, target)]
        scans = [s.scan for s in splits]
        segmented = [s for s in scans if s.segment_chunks]
        safe = [s.tile for s in splits if s.tile.anchor == "safe"]
        groups = (("pairs", safe), ("prep", [s.tile for s in splits]), ("scan", scans),
                  ("fused", fused),
                  ("segment_map", segmented), ("segment_combine", segmented))  # fmt: skip
        for kernel, items in groups:
            for spec in dict.fromkeys(items):
                out.append((name, kernel, spec))
    return out


def _in_default_subset(target: str, kernel: str, spec) -> bool:
    if kernel in ("pairs", "prep", "fused"):
        return (spec.tile if kernel == "fused" else spec).solve_block == 16
    return True


def _label(target, kernel, spec):
    t = spec.tile if kernel == "fused" else spec
    text = f"{target}-{kernel}-d{t.head_dim_k}-c{t.chunk}"
    if kernel in ("pairs", "prep", "fused"):
        return f"{text}-bs{t.solve_block}-w{t.num_warps}-{t.fp32_dot}-{t.anchor}"
    return f"{text}-bv{spec.block_v}-w{spec.num_warps}-st{spec.num_stages}-seg{spec.segment_chunks}"


def _build(target, kernel, spec):
    """The artifact and the estimate that must bound it."""
    if kernel == "segment_map":  # the scan step on [I | 0]: bounded by the scan's estimate
        return build_kda_segment_map(spec, target), spec.shared_bytes_estimate()
    if kernel == "segment_combine":
        fp32_dot = S.FP32_DOT_BY_BACKEND[target.backend][0]  # as the enumerated tiles use
        art = build_kda_segment_combine(spec, target, fp32_dot)
        return art, spec.combine_shared_bytes_estimate()
    if kernel == "pairs":
        return build_kda_chunk_pairs(spec, target), spec.pairs_shared_bytes_estimate()
    return _BUILDERS[kernel](spec, target), spec.shared_bytes_estimate()


ALL_KERNEL_SPECS = _kernel_specs()
FOOTPRINT_CASES = [c for c in ALL_KERNEL_SPECS if FULL_FOOTPRINT or _in_default_subset(*c)]


def test_footprint_cases_cover_every_kernel_kind_and_target():
    kinds = set(SPLIT.builders) | set(FUSED.builders)  # what the chunked candidates launch
    targets = {t.name for t in (SM90, GFX950, GFX942)}
    assert {(t, k) for t, k, _ in ALL_KERNEL_SPECS} == {(t, k) for t in targets for k in kinds}
    assert {(t, k) for t, k, _ in FOOTPRINT_CASES} == {(t, k) for t, k, _ in ALL_KERNEL_SPECS}
    labels = [_label(*c) for c in ALL_KERNEL_SPECS]
    assert len(labels) == len(set(labels))


def _footprint_params() -> list:
    """Every case; all but the first and last of each (target, kernel) are also marked slow, so
    the quick lane (-m "not slow") compiles 36 of them and CI the whole subset."""
    groups: dict[tuple, list] = {}
    for c in FOOTPRINT_CASES:
        groups.setdefault(c[:2], []).append(c)
    quick = {_label(*g[i]) for g in groups.values() for i in (0, -1)}
    return [pytest.param(*c, id=_label(*c), marks=() if _label(*c) in quick else pytest.mark.slow)
            for c in FOOTPRINT_CASES]  # fmt: skip


@pytest.mark.parametrize("target,kernel,spec", _footprint_params())
def test_footprint_estimate_bounds_compiled_size(target, kernel, spec):
    t = TARGETS[target]
    art, est = _build(t, kernel, spec)  # the builders cache: each kernel compiles once
    assert art.shared_bytes <= est, (
        f"{_label(target, kernel, spec)}: compiled {art.shared_bytes} B > estimate {est} B"
    )
    assert art.shared_bytes <= t.shared_mem_per_block
