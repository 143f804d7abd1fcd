"""The KDA family's registration: candidates ``kda.split`` (prefill), ``kda.recurrent``
(decode-shaped problems and state pools) and ``kda.fused`` (opt-in).

``kda.split`` and ``kda.recurrent`` share a priority: the dispatcher takes the one whose best
spec has the lower estimated cost, in microseconds of the same latency model (``split_cost``,
``recurrent.recurrent_cost``), so the threshold between them is where the model's costs cross,
not a constant.
"""

from __future__ import annotations

from kreg.problems import LinearAttentionProblem
from kreg.registry.hookspecs import hookimpl
from kreg.registry.model import Candidate, Family, Verdict

from . import model, recurrent, specs
from .builders import (
    build_kda_chunk_fused,
    build_kda_chunk_pairs,
    build_kda_chunk_prep,
    build_kda_chunk_scan,
    build_kda_segment_combine,
    build_kda_segment_map,
)
from .runtime_args import launch_shape
from .selection import ABI_VERSION, FAMILY_NAME

FUSED_OPT_IN_REASON = (
    "measured 2.5-50x slower than the tuned split on the H200 across the KDA scenario "
    "(2026-12-03; 1.7-12x against the untuned split on 2026-12-02, docs/kda/CASE_STUDY.md): one "
    "program per (sequence, head) serialises the parallel tile phase, and holding both phases "
    "live spills registers; the seed saw the same on gfx950"
)


def accepts(problem: LinearAttentionProblem) -> Verdict:
    return Verdict.check(
        (problem.gate == "per_channel",
         f"gate={problem.gate!r}: KDA gates are per-channel (broadcast a scalar gate over K)"),
        (max(problem.head_dim_k, problem.head_dim_v) <= specs.MAX_HEAD_DIM,
         f"head dims K={problem.head_dim_k}, V={problem.head_dim_v}: at most "
         f"{specs.MAX_HEAD_DIM} (smaller ones run at the next of {specs.HEAD_DIMS})"),
    )  # fmt: skip


# The chunked form's fixed latency beside its chains (microseconds on the H200, as
# recurrent.LAUNCH_US): two kernel launches (prep, scan) and the prep kernel's chunk, which
# every chain waits for. One unit of the scan model below is ~1.3 us: 1.6 us per dependent chunk
# step measured at block_v / V = 1/4 (docs/kda/SPEED.md), i.e. 1.25 units.
SPLIT_FIXED_US = 2 * recurrent.LAUNCH_US + 4.0
SPLIT_UNIT_US = 1.3
# The chains above do not tell the scan's pipelines apart. With a scalar gate (GDN: q and k read
# in the scan, kernels._scan_step) a second stage costs: on one H100 (2026-12-07,
# benchmarks/scan_specs.py gdn, K = V = 128, chunk 32) the single-stage scan side was faster in
# 11 of the 12 (V block, segments) pairs timed at 1x8192 H16/HV32 and on a varlen batch of seven,
# by 19-25 % at 64-column V blocks (0.353 against 0.446 ms at 64-chunk segments; 0.270 against
# 0.335 without), where the two-stage build spills 36 B per thread on sm90. A tie-breaker only:
# smaller than any difference in waves or steps.
SCALAR_SCAN_STAGE_UNITS = 0.05


def split_cost(spec: specs.KdaSplitSpec, problem: LinearAttentionProblem, target) -> float:
    """Heuristic: the serial steps of the scan's critical path, times the waves its programs take.

    Each (sequence, value head, V block) is one dependency chain of chunk steps, the longest
    as long as the longest sequence (``problem.longest_seq``: with varlen not the mean, or one
    long sequence among short ones would look short and get no segments). Segments
    (sequence-parallel scan) cut the chain to two passes over one segment plus a combine step
    per segment, but multiply the programs; waves count programs over two per unit. Only
    segments that hold chunks count: a short sequence's segments past its end exit at once, so
    a varlen batch has at most ``ceil(chunks of all sequences / segment) + N`` busy segments
    (for fixed-length batches that bound never binds). It agrees with every H200 measurement in
    docs/kda/RESULTS.md on whether segments pay; measured tuning-table entries take precedence
    where they exist. In estimated microseconds (an affine map of the scan model, so the ranking
    of split specs is unchanged), to compare with ``kda.recurrent``.
    """
    scan = spec.scan
    chunk, n = spec.tile.chunk, problem.num_seqs
    chunks = -(-problem.longest_seq // chunk)
    per_seg = problem.heads_v * (scan.head_dim_v // scan.block_v)  # programs per segment
    segments = n
    steps = chunks
    if scan.segment_chunks:
        n_seg = -(-chunks // scan.segment_chunks)
        steps = 2 * min(chunks, scan.segment_chunks) + n_seg
        all_chunks = -(-problem.seq_len * problem.batch // chunk) + n  # each sequence rounds up
        segments = min(n * n_seg, -(-all_chunks // scan.segment_chunks) + n)
    programs = segments * per_seg
    waves = -(-programs // (2 * target.compute_units))
    width = scan.block_v / scan.head_dim_v  # the padded V the kernels run
    # one cost for both anchors: the safe anchor's pairwise diagonal is in the tuning's timings
    units = waves * steps * (1.0 + width) + 0.01 * spec.tile.num_warps
    if scan.scalar_gate:  # the tie between pipelines, broken as measured (SCALAR_SCAN_STAGE_UNITS)
        units += SCALAR_SCAN_STAGE_UNITS * (scan.num_stages - 1)
    # microseconds, as recurrent's, with the same state traffic; a pool's slots are gathered
    # into a buffer and scattered back (launch.gather_slots): about two more passes, two launches
    pool_us = (
        2 * (recurrent.state_traffic_us(problem) + recurrent.LAUNCH_US)
        if problem.state_pool
        else 0.0
    )
    return (SPLIT_FIXED_US + SPLIT_UNIT_US * units + recurrent.state_traffic_us(problem)
            + pool_us)  # fmt: skip


def fused_cost(spec: specs.KdaChunkFusedSpec, problem: LinearAttentionProblem, target) -> float:
    tokens = problem.seq_len * problem.batch / problem.num_seqs
    return -(-tokens // spec.tile.chunk) + 0.01 * spec.tile.num_warps


def _launcher(name: str):
    """``launch.<name>(call, spec)`` as a candidate's ``run``, imported at the first launch:
    registering the family (the CLI, the CPU producers) does not import torch's launch path."""

    def run(call, spec):
        from . import launch

        return getattr(launch, name)(call, spec)

    run.__name__ = run.__qualname__ = name
    return run


def delta_rule_candidates(
    family: str,
    accepts,
    *,
    split_description: str,
    fused_description: str,
    fused_opt_in_reason: str,
):
    """The three candidates of a delta-rule family over the shared kernels: ``<family>.split``
    (prefill), ``<family>.recurrent`` (decode-shaped problems, pools) and ``<family>.fused``
    (opt-in), serving the problems ``accepts`` admits. KDA's and GDN's differ in their name,
    their gate kind (``accepts``) and their words, not in code."""

    def pairs(spec, target, problem=None):  # None without a pairs kernel (block anchor, scalar)
        return build_kda_chunk_pairs(spec.tile, target, launch_shape(problem))

    split = Candidate(
        name=f"{family}.split",
        family=family,
        run=_launcher("run_split"),
        problem_type=LinearAttentionProblem,
        spec_types=(specs.KdaTileSpec, specs.KdaScanSpec),
        enumerate_specs=specs.enumerate_split_specs,
        is_valid=specs.is_valid_split_spec,
        # (spec, target, problem=None): the kernel a launch for ``problem`` runs, for a
        # representative production problem without one (runtime_args.REPRESENTATIVE)
        builders={
            "pairs": pairs,
            "prep": lambda spec, target, problem=None: build_kda_chunk_prep(
                spec.tile, target, launch_shape(problem)
            ),
            "scan": lambda spec, target, problem=None: build_kda_chunk_scan(
                spec.scan, target, launch_shape(problem)
            ),
            # None unless the scan is sequence-parallel (segment_chunks > 0)
            "segment_map": lambda spec, target, problem=None: build_kda_segment_map(
                spec.scan, target, launch_shape(problem)
            ),
            "segment_combine": lambda spec, target, problem=None: build_kda_segment_combine(
                spec.scan, target, spec.tile.fp32_dot, launch_shape(problem)
            ),
        },
        accepts=accepts,
        specialize=specs.specialize_split,
        cost=split_cost,
        predict=model.predict,
        priority=10,
        description=split_description,
    )
    recurrent_ = Candidate(
        name=f"{family}.recurrent",
        family=family,
        run=_launcher("run_recurrent"),
        problem_type=LinearAttentionProblem,
        spec_types=(recurrent.KdaRecurrentSpec,),
        enumerate_specs=recurrent.enumerate_recurrent_specs,
        is_valid=recurrent.is_valid_recurrent_spec,
        builders={
            "recurrent": lambda spec, target, problem=None: recurrent.build_kda_recurrent(
                spec, target, launch_shape(problem)
            )
        },
        accepts=lambda problem: accepts(problem) & recurrent.accepts_recurrent(problem),
        specialize=recurrent.specialize_recurrent,
        cost=recurrent.recurrent_cost,
        priority=10,
        description="token-serial recurrence, state in registers, one program per (sequence, "
        "value head, V block); decode-shaped problems and state pools",
    )
    fused = Candidate(
        name=f"{family}.fused",
        family=family,
        run=_launcher("run_fused"),
        problem_type=LinearAttentionProblem,
        spec_types=(specs.KdaChunkFusedSpec,),
        enumerate_specs=specs.enumerate_fused_specs,
        is_valid=specs.is_valid_fused_spec,
        builders={
            "pairs": pairs,
            "fused": lambda spec, target, problem=None: build_kda_chunk_fused(
                spec, target, launch_shape(problem)
            ),
        },
        accepts=accepts,
        specialize=specs.specialize_fused,
        cost=fused_cost,
        priority=5,
        opt_in=True,
        opt_in_reason=fused_opt_in_reason,
        description=fused_description,
    )
    return split, recurrent_, fused


SPLIT, RECURRENT, FUSED = delta_rule_candidates(
    FAMILY_NAME,
    accepts,
    split_description="pairs kernel (the safe anchor's diagonal sub-blocks, unless a bound is "
    "promised) + prep kernel (tiles, one program per chunk) + scan kernel (recurrence)",
    fused_description="tiles and recurrence in one kernel, one program per (sequence, value "
    "head), after the pairs kernel (the safe anchor's diagonal sub-blocks, unless a bound is "
    "promised)",
    fused_opt_in_reason=FUSED_OPT_IN_REASON,
)

FAMILY = Family(
    name=FAMILY_NAME,
    problem_type=LinearAttentionProblem,
    candidates=(SPLIT, RECURRENT, FUSED),
    abi_version=ABI_VERSION,
    description="Kimi Delta Attention: gated delta-rule linear attention, chunkwise prefill and "
    "token-serial decode",
    docs="docs/families/kda.md",
    data=__package__,  # tuning.json and kda_model.json, beside this file
)


@hookimpl
def kreg_register_families(register):
    register(FAMILY)


@hookimpl
def kreg_register_golden_cases(register):
    from .golden_cases import golden_cases

    for case in golden_cases():
        register(case)


@hookimpl
def kreg_register_scenarios(register):
    from .bench import decode, grid, scenario

    register(scenario.scenario())
    register(grid.scenario())
    register(decode.scenario())
