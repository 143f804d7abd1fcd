"""KDA specs (compile-time configurations), their enumeration per target and validity rules.

Named as in the seed: ``KdaTileSpec`` (prep kernel), ``KdaScanSpec`` (scan kernel) and
``KdaChunkFusedSpec`` (both in one kernel). Problem-fixed fields (head dims, dtype, options) are
filled from the problem by ``specialize``; the enumeration varies the tuning fields.
"""

from __future__ import annotations

import attrs

from kreg.problems.linear_attention import CHUNK_STATE_DTYPES, STATE_LAYOUTS
from kreg.registry.model import Target, Verdict

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# fp32 exp overflows past 88.72 nats; the kernels keep a margin below it.
MAX_ANCHOR_NATS = 85.0
HEAD_DIMS = (32, 64, 128, 256)  # the kernels' head dims; any K, V <= 256 is padded up to one
MAX_HEAD_DIM = HEAD_DIMS[-1]
CHUNKS = (16, 32, 64)
SOLVE_BLOCKS = (16, 32)
ANCHORS = ("safe", "block")  # the default first
# (chunk, solve_block, num_warps) of the prep kernel worth enumerating, per head dim: larger
# tiles at large head dims spill heavily and take minutes to compile (measured on sm90).
TILE_SHAPES = {
    32: ((16, 16, 2), (16, 16, 4), (32, 16, 4), (32, 32, 4), (64, 16, 8), (64, 32, 8)),
    64: ((16, 16, 2), (16, 16, 4), (32, 16, 4), (32, 32, 4), (64, 16, 8), (64, 32, 8)),
    128: ((16, 16, 2), (16, 16, 4), (32, 16, 4), (32, 16, 8), (64, 16, 8)),
    256: ((16, 16, 4), (16, 16, 8), (32, 16, 8)),
}
# (num_warps, num_stages, largest chunk) of the scan worth enumerating: pipelining depth of the
# tile loads and the warps on the dependency chain. On sm90 three stages and two warps each won
# at some shapes (H200 probe, 2026-12-02: docs/kda/SPEED.md); AMD's LDS is smaller and was never
# measured. One stage comes last on cuda (a tie keeps the earlier pipelines): GDN's scan, which
# reads q and k, measured fastest unpipelined (plugin.SCALAR_SCAN_STAGE_UNITS); only up to chunk
# 32, since a hand-made single-stage chunk-64 scan faulted on an H100 (2026-12-06,
# docs/gdn/SPEED.md; not investigated) and chunk 64's prep measured 4x slower at K = 128.
SCAN_PIPELINES_BY_BACKEND = {
    "cuda": ((4, 2, 64), (4, 3, 64), (2, 2, 64), (2, 3, 64), (4, 1, 32)),
    "hip": ((4, 1, 64),),
}
SEGMENT_CHUNKS = (0, 16, 64)
# The segment combine multiplies each segment's [K, K] map into the state. Up to this K it stages
# the map whole (the kernel measured since 2026-12-02); above it, in row blocks of
# COMBINE_BLOCK_K, which is what fits a K = 256 combine in one block's shared memory.
COMBINE_WHOLE_MAX_K = 128
COMBINE_BLOCK_K = 64
FP32_DOT_BY_BACKEND = {"cuda": ("tf32", "tf32x3", "ieee"), "hip": ("ieee",)}


def padded_head_dim(d: int) -> int:
    """The kernel head dim a problem head dim ``d`` (1..MAX_HEAD_DIM) runs at: the smallest of
    ``HEAD_DIMS`` >= d (``api._pad_inputs`` zero-pads the inputs to it, exactly: see the note there)."""
    for size in HEAD_DIMS:
        if d <= size:
            return size
    raise ValueError(f"head dim {d} > {MAX_HEAD_DIM}, the largest the kernels serve")


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def input_dim(d: int) -> int:
    """A spec's ``input_dim_k`` / ``input_dim_v`` for a problem head dim ``d``: 0 where the
    kernels run ``d`` itself, else ``d`` (masked tiles: the kernels read and write the caller's
    ``d`` columns through masks, their tiles at ``padded_head_dim(d)``)."""
    return 0 if padded_head_dim(d) == d else d


def reads_caller_dims(spec) -> bool:
    """Whether ``spec``'s kernels read a caller's head dim below their own through masks (the
    chunked paths of a per-channel gate, specialised to such a problem), so that the call needs
    no zero-padded copies (``api.run_selection``); the recurrent step and a scalar gate's
    kernels run on padded copies."""
    tile = getattr(spec, "tile", None)
    return tile is not None and (tile.input_dim_k or tile.input_dim_v) != 0


def padded_spec(spec):
    """``spec`` run on zero-padded copies instead of masked tiles (context parallel, whose
    composed maps are sized from the call's tensors)."""
    if not hasattr(spec, "tile"):
        return spec
    unmasked = dict(input_dim_k=0, input_dim_v=0)
    return attrs.evolve(spec, tile=attrs.evolve(spec.tile, **unmasked),
                        scan=attrs.evolve(spec.scan, **unmasked))  # fmt: skip


@attrs.frozen
class KdaTileSpec:
    """Prep kernel: the six state-independent tiles of one chunk per program."""

    head_dim_k: int = 128
    head_dim_v: int = 128
    # the caller's head dims where the kernels' are padded ones (masked tiles), else 0
    input_dim_k: int = attrs.field(default=0, kw_only=True)
    input_dim_v: int = attrs.field(default=0, kw_only=True)
    dtype: str = "bf16"
    chunk: int = 64
    # Sub-block of the blocked solve, and the span of one exponent anchor.
    solve_block: int = 16
    # Diagonal sub-blocks are anchored at the sub-block start in one product, exact while a
    # row's decay span from there fits fp32. "safe" (any gate, -inf resets too) gives a row past
    # the span exact entries from a halving tree with no positive exponent, computed only in
    # chunks that have such a row; "block" (a promised bound: solve_block * |lower bound| within
    # the span, a rule) makes such a row NaN.
    anchor: str = "safe"
    num_warps: int = 4
    # Precision of the fp32 products (A, Aqk, the solve, W and U); "tf32" is cuda-only.
    fp32_dot: str = "ieee"
    gate_activation: str = "none"
    # one gate per token and value head (GDN), broadcast over K in registers; the safe anchor's
    # diagonal sub-blocks are then computed in the prep (no pairs kernel)
    scalar_gate: bool = False
    qk_l2norm: bool = False
    beta_sigmoid: bool = False
    varlen: bool = False
    # Case-study probes (docs/kda/CASE_STUDY.md), off by default: walk a sequence's chunks in one
    # program (as fused does), and unused shared memory that lowers programs per SM.
    looped: bool = False
    ballast_bytes: int = 0

    def shared_bytes_estimate(self) -> int:
        """Upper bound of the shared memory Triton allocates for this kernel."""
        return _tile_phase_bytes(self) + self.ballast_bytes

    @property
    def pairs(self) -> bool:
        """Whether the pairs kernel runs before the prep (the safe anchor's diagonal blocks)."""
        return self.anchor == "safe" and not self.scalar_gate

    def pairs_shared_bytes_estimate(self) -> int:
        """The safe anchor's pairs kernel: its row picks and channel sums stage at most the
        chunk's [C, K] rows and [C, solve_block] entries in fp32 (below the prep's estimate,
        so the prep's rules cover it)."""
        return 4 * self.chunk * (self.head_dim_k + self.solve_block)


@attrs.frozen
class KdaScanSpec:
    """Scan kernel: the serial recurrence, one program per (sequence, value head, V block)."""

    head_dim_k: int = 128
    head_dim_v: int = 128
    # the caller's head dims where the kernels' are padded ones (masked tiles), else 0
    input_dim_k: int = attrs.field(default=0, kw_only=True)
    input_dim_v: int = attrs.field(default=0, kw_only=True)
    dtype: str = "bf16"
    chunk: int = 64
    block_v: int = 64
    num_warps: int = 4
    num_stages: int = 2
    # Programs that must fit on one SM / CU at once: the seed's measured conclusion is that the
    # latency-bound recurrence needs a second resident program to hide its dependency chain.
    min_occupancy: int = 2
    # Sequence-parallel scan: chunks per segment (0: one serial chain per sequence). Segments
    # get their start states from a per-segment affine map and a short serial combine.
    segment_chunks: int = 0
    initial_state: bool = False
    state_dtype: str = "fp32"
    output_final_state: bool = False
    output_chunk_states: bool = False
    # with output_chunk_states: the state every chunk_states_size tokens of each sequence (a
    # multiple of chunk: every chunk_states_every-th chunk's start), stored in this dtype
    chunk_states_size: int = 64
    chunk_states_dtype: str = "fp32"
    state_layout: str = "kv"
    varlen: bool = False
    # one gate per token and value head (GDN): the prep stores q's and k's row scales, not the
    # tiles gq and gkt, and the scan reads q and k (kernels._scan_step)
    scalar_gate: bool = False

    @property
    def chunk_states_every(self) -> int:
        """Chunks per stored chunk state (1 when none are stored)."""
        return self.chunk_states_size // self.chunk if self.output_chunk_states else 1

    def shared_bytes_estimate(self) -> int:
        return _scan_phase_bytes(self, self.block_v, self.num_stages)

    @property
    def combine_block_k(self) -> int:
        """Rows of the [K, K] segment map the combine kernel multiplies at once."""
        k = self.head_dim_k
        return k if k <= COMBINE_WHOLE_MAX_K else COMBINE_BLOCK_K

    def combine_shared_bytes_estimate(self) -> int:
        """The segment combine kernel stages [combine_block_k, K] of the map and two [K, BV]
        blocks in fp32."""
        return 4 * self.head_dim_k * (self.combine_block_k + 2 * self.block_v)


@attrs.frozen
class KdaChunkFusedSpec:
    """Fused kernel: tiles computed on chip inside the recurrence, one program per (seq, head).

    It reuses the tile and scan specs it fuses (one kernel, so one ``num_warps``: the tile
    spec's), which is what pairs a fused spec with the split spec it must equal bit for bit.
    """

    tile: KdaTileSpec = KdaTileSpec()
    scan: KdaScanSpec = KdaScanSpec(block_v=128)
    # Case-study probe, off by default: replace the scan step by a fold of the tiles (the tile
    # phase alone, still consuming every tile so none is dead code).
    ablate_scan: bool = False

    def shared_bytes_estimate(self) -> int:
        return max(_tile_phase_bytes(self.tile), _scan_phase_bytes(self.scan, self.scan.block_v, 1))


@attrs.frozen
class KdaSplitSpec:
    """The split path's pair: prep kernel spec and scan kernel spec."""

    tile: KdaTileSpec = KdaTileSpec()
    scan: KdaScanSpec = KdaScanSpec()


# --- footprint estimates -----------------------------------------------------------------------
# Triton stages dot operands and layout conversions through shared memory; the estimates count
# every operand tile of the largest phase once in fp32 (conversions) plus its dot operands,
# calibrated against compiled kernels by tests/test_kda_specs.py (never below the real size),
# compiled with the launch specialisation Triton's JIT applies (kreg.registry.compile).


def _tile_phase_bytes(s: KdaTileSpec) -> int:
    c, k, v = s.chunk, s.head_dim_k, s.head_dim_v
    return 4 * (2 * c * k + c * c + c * max(k, v))


def _scan_phase_bytes(s: KdaScanSpec, bv: int, stages: int) -> int:
    c, k = s.chunk, s.head_dim_k
    # One tile-dtype copy of every dot operand: the tiles loaded per chunk (W, Q*Gamma,
    # (K*Gamma')^T, Aqk, U), counted once per pipeline stage, plus the state and the residual
    # converted for their products. Compiled as the JIT runs it (aligned pointers, T and HV
    # divisible by 16), Triton 3.6 on sm90 pipelines the tile loads through cp.async buffers:
    # up to 2.1x the one-stage sum at three stages, still at most 0.9x this estimate (measured
    # over every enumerated scan and segment map, tests/test_kda_specs.py).
    # An unknown dtype is a rule's reason, not an error here: count it at 4 bytes.
    loads = 3 * c * k + c * c + c * bv
    return DTYPE_BYTES.get(s.dtype, 4) * (stages * loads + k * bv + c * bv)


# --- enumeration ---------------------------------------------------------------------------------


def enumerate_tile_specs(target: Target) -> list[KdaTileSpec]:
    fp32_dot = FP32_DOT_BY_BACKEND[target.backend][0]
    return [
        KdaTileSpec(d, d, chunk=c, solve_block=b, num_warps=w, fp32_dot=fp32_dot)
        for d in HEAD_DIMS
        for c, b, w in TILE_SHAPES[d]
    ]


def enumerate_scan_specs(target: Target) -> list[KdaScanSpec]:
    return [
        KdaScanSpec(
            head_dim_k=d,
            head_dim_v=d,
            chunk=c,
            block_v=bv,
            num_warps=warps,
            num_stages=stages,
            segment_chunks=seg,
        )
        for d in HEAD_DIMS
        for c in CHUNKS
        if any(t[0] == c for t in TILE_SHAPES[d])
        for bv in sorted({32, min(64, d)})
        for warps, stages, largest in SCAN_PIPELINES_BY_BACKEND[target.backend]
        if c <= largest
        for seg in SEGMENT_CHUNKS
    ]


def enumerate_split_specs(target: Target) -> list[KdaSplitSpec]:
    """Each tile spec with each scan spec of the same shape."""
    scans = enumerate_scan_specs(target)
    return [
        KdaSplitSpec(t, s)
        for t in enumerate_tile_specs(target)
        for s in scans
        if (s.head_dim_k, s.chunk) == (t.head_dim_k, t.chunk)
    ]


def valid_split_specs(target: Target, problem) -> list[KdaSplitSpec]:
    """The enumerated split specs specialised to ``problem`` and valid for it, distinct, in
    enumeration order."""
    out: dict[KdaSplitSpec, None] = {}
    for spec in enumerate_split_specs(target):
        spec = specialize_split(spec, problem)
        if spec is not None and is_valid_split_spec(spec, target, problem).ok:
            out.setdefault(spec)
    return list(out)


def enumerate_fused_specs(target: Target) -> list[KdaChunkFusedSpec]:
    return [
        KdaChunkFusedSpec(t, KdaScanSpec(t.head_dim_k, t.head_dim_v, t.dtype, t.chunk,
                                         block_v=t.head_dim_v, num_warps=t.num_warps,
                                         num_stages=1))
        for t in enumerate_tile_specs(target)
    ]  # fmt: skip


# --- rules ---------------------------------------------------------------------------------------


def _shape_rules(spec) -> Verdict:
    head_dim_k, head_dim_v, chunk, dtype = spec.head_dim_k, spec.head_dim_v, spec.chunk, spec.dtype
    ik, iv = spec.input_dim_k, spec.input_dim_v
    return Verdict.check(
        (head_dim_k in HEAD_DIMS, f"head_dim_k={head_dim_k} not in supported {HEAD_DIMS}"),
        (head_dim_v in HEAD_DIMS, f"head_dim_v={head_dim_v} not in supported {HEAD_DIMS}"),
        (
            0 <= ik < head_dim_k and 0 <= iv < head_dim_v,
            f"input_dim_k={ik}, input_dim_v={iv} must be 0 (the kernel's head dim) or a caller's "
            f"smaller one (below head_dim_k={head_dim_k}, head_dim_v={head_dim_v})",
        ),
        (
            not (spec.scalar_gate and (ik or iv)),
            "a scalar gate's kernels run on padded copies: input_dim_k and input_dim_v must be 0",
        ),
        (chunk in CHUNKS, f"chunk={chunk} not in {CHUNKS}"),
        (dtype in DTYPE_BYTES, f"dtype={dtype!r} not in {tuple(DTYPE_BYTES)}"),
    )


def numeric_rule(solve_block: int, lower_bound: float | None, anchor: str = "block") -> Verdict:
    """The block anchor's exponent inside a sub-block spans up to solve_block * |lower_bound|
    nats; the safe anchor has no positive exponent it cannot take."""
    if anchor == "safe":
        return Verdict()
    if lower_bound is None:
        return Verdict((
            "unbounded gates: exp(-Gin) inside a sub-block has no bound for any solve_block "
            "with anchor='block'; anchor='safe' serves any gate exactly",
        ))  # fmt: skip
    span = solve_block * abs(lower_bound)
    return Verdict.check((
        span <= MAX_ANCHOR_NATS,
        f"solve_block={solve_block} at gate lower bound {lower_bound:g} spans {span:g} nats "
        f"> {MAX_ANCHOR_NATS:g} (fp32 exp overflows past 88.7)",
    ))  # fmt: skip


def is_valid_tile_spec(spec: KdaTileSpec, target: Target, problem=None) -> Verdict:
    est = spec.shared_bytes_estimate()
    v = _shape_rules(spec) & Verdict.check(
        (spec.solve_block in SOLVE_BLOCKS, f"solve_block={spec.solve_block} not in {SOLVE_BLOCKS}"),
        (spec.solve_block <= spec.chunk and spec.chunk % spec.solve_block == 0,
         f"solve_block={spec.solve_block} must divide chunk={spec.chunk}"),
        (spec.num_warps in (1, 2, 4, 8, 16), f"num_warps={spec.num_warps} not a power of 2 <= 16"),
        (spec.anchor in ANCHORS, f"anchor={spec.anchor!r} not in {ANCHORS}"),
        (spec.ballast_bytes == 0 or (_pow2(spec.ballast_bytes) and spec.ballast_bytes >= 512),
         f"ballast_bytes={spec.ballast_bytes} must be 0 or a power of 2 >= 512"),
        (spec.fp32_dot in FP32_DOT_BY_BACKEND[target.backend],
         f"fp32_dot={spec.fp32_dot!r} not available on {target.name} "
         f"(allowed: {FP32_DOT_BY_BACKEND[target.backend]})"),
        (est <= target.shared_mem_per_block,
         f"shared memory estimate {est} B > {target.shared_mem_per_block} B per block on "
         f"{target.name}"),
    )  # fmt: skip
    if problem is not None:
        v = v & numeric_rule(spec.solve_block, problem.gate_lower_bound, spec.anchor)
    return v


def _state_rules(spec: KdaScanSpec) -> Verdict:
    """What the scan's state options need, whichever kernel runs the scan (split or fused)."""
    return Verdict.check(
        (spec.state_layout in STATE_LAYOUTS, f"state_layout={spec.state_layout!r} not one of {STATE_LAYOUTS}"),
        (spec.state_dtype in ("fp32", "bf16"), f"state_dtype={spec.state_dtype!r} not fp32/bf16"),
        (spec.chunk_states_dtype in CHUNK_STATE_DTYPES,
         f"chunk_states_dtype={spec.chunk_states_dtype!r} not in {CHUNK_STATE_DTYPES}"),
        (not spec.output_chunk_states
         or (spec.chunk_states_size > 0 and spec.chunk_states_size % spec.chunk == 0),
         f"chunk_states_size={spec.chunk_states_size} is not a multiple of chunk={spec.chunk}"),
    )  # fmt: skip


def is_valid_scan_spec(spec: KdaScanSpec, target: Target, problem=None) -> Verdict:
    est = spec.shared_bytes_estimate()
    budget = target.shared_mem_per_unit // max(1, spec.min_occupancy)
    rules = _shape_rules(spec)
    return rules & _state_rules(spec) & Verdict.check(
        (_pow2(spec.block_v) and 16 <= spec.block_v <= spec.head_dim_v
         and spec.head_dim_v % spec.block_v == 0,
         f"block_v={spec.block_v} must be a power of 2 in [16, head_dim_v={spec.head_dim_v}]"),
        (spec.num_warps in (1, 2, 4, 8, 16), f"num_warps={spec.num_warps} not a power of 2 <= 16"),
        (spec.num_stages >= 1, f"num_stages={spec.num_stages} must be >= 1"),
        (spec.min_occupancy >= 1, f"min_occupancy={spec.min_occupancy} must be >= 1"),
        (spec.segment_chunks >= 0, f"segment_chunks={spec.segment_chunks} must be >= 0"),
        (not spec.segment_chunks
         or spec.combine_shared_bytes_estimate() <= target.shared_mem_per_block,
         f"segment combine shared memory estimate {spec.combine_shared_bytes_estimate()} B > "
         f"{target.shared_mem_per_block} B per block on {target.name}"),
        (est <= budget,
         f"shared memory estimate {est} B > {budget} B, the {target.name} per-unit budget "
         f"{target.shared_mem_per_unit} B / min_occupancy {spec.min_occupancy}: fits the hardware "
         f"but leaves the latency-bound scan one program per unit"),
    )  # fmt: skip


def is_valid_split_spec(spec: KdaSplitSpec, target: Target, problem=None) -> Verdict:
    t, s = spec.tile, spec.scan
    return (
        is_valid_tile_spec(t, target, problem)
        & is_valid_scan_spec(s, target, problem)
        & _pairing_rule(t, s)
    )


def is_valid_fused_spec(spec: KdaChunkFusedSpec, target: Target, problem=None) -> Verdict:
    t, s = spec.tile, spec.scan
    est = spec.shared_bytes_estimate()
    # The fused kernel keeps the whole V width per program (its tiles are computed once per
    # program), and runs with the tile spec's warps; the occupancy bound of the scan applies
    # to the kernel that runs it.
    budget = target.shared_mem_per_unit // max(1, s.min_occupancy)
    return (
        is_valid_tile_spec(t, target, problem)
        & _pairing_rule(t, s)
        & _state_rules(s)
        & Verdict.check(
            (
                not (t.looped or t.ballast_bytes),
                "fused takes no prep-kernel probes (looped, ballast_bytes)",
            ),
            (
                s.block_v == s.head_dim_v,
                f"fused block_v={s.block_v} must equal head_dim_v={s.head_dim_v}",
            ),
            (
                s.segment_chunks == 0,
                f"fused runs one serial chain per sequence: segment_chunks={s.segment_chunks} "
                f"must be 0",
            ),
            (
                s.num_warps == t.num_warps,
                f"fused runs one kernel: scan num_warps={s.num_warps} must equal tile "
                f"num_warps={t.num_warps}",
            ),
            (
                est <= budget,
                f"shared memory estimate {est} B > {budget} B ({target.name} per-unit budget / "
                f"min_occupancy {s.min_occupancy})",
            ),
        )  # fmt: skip
    )


def bitwise_pair(fused: KdaChunkFusedSpec) -> KdaSplitSpec:
    """The split spec that computes bit for bit what ``fused`` computes: the same tile spec, and
    a scan whose step runs the fused kernel's products (all of V in one block, its warps, one
    serial chain). Other scan shapes tile the same products differently on the tensor cores and
    agree within rounding only."""
    scan = attrs.evolve(fused.scan, block_v=fused.scan.head_dim_v,
                        num_warps=fused.tile.num_warps, segment_chunks=0)  # fmt: skip
    return KdaSplitSpec(fused.tile, scan)


def _pairing_rule(t: KdaTileSpec, s: KdaScanSpec) -> Verdict:
    return Verdict.check(
        ((t.head_dim_k, t.head_dim_v, t.input_dim_k, t.input_dim_v, t.dtype, t.chunk, t.varlen,
          t.scalar_gate)
         == (s.head_dim_k, s.head_dim_v, s.input_dim_k, s.input_dim_v, s.dtype, s.chunk, s.varlen,
             s.scalar_gate),
         "tile and scan specs disagree on head dims, dtype, chunk, varlen or scalar_gate"),
    )  # fmt: skip


# --- problem -> spec ---------------------------------------------------------------------------


def _problem_fields(problem) -> tuple[dict, dict]:
    # the problem's head dims are the caller's; the kernels run at the padded ones, reading a
    # per-channel gate's inputs at the caller's through masks (a scalar gate's: padded copies)
    scalar = problem.gate == "scalar"
    K, V = problem.head_dim_k, problem.head_dim_v
    shape = dict(
        head_dim_k=padded_head_dim(K), head_dim_v=padded_head_dim(V),
        input_dim_k=0 if scalar else input_dim(K), input_dim_v=0 if scalar else input_dim(V),
        dtype=problem.dtype, varlen=problem.varlen, scalar_gate=scalar,
    )  # fmt: skip
    tile = dict(
        gate_activation=problem.gate_activation, qk_l2norm=problem.qk_l2norm,
        beta_sigmoid=problem.beta_sigmoid,
    )  # fmt: skip
    scan = dict(
        initial_state=problem.initial_state, state_dtype=problem.state_dtype,
        output_final_state=problem.output_final_state,
        output_chunk_states=problem.output_chunk_states, state_layout=problem.state_layout,
        chunk_states_size=problem.chunk_states_size,
        chunk_states_dtype=problem.chunk_states_dtype,
    )  # fmt: skip
    return {**shape, **tile}, {**shape, **scan}


def _matches(spec, problem) -> bool:
    """Enumerations vary the head dim as K = V; a problem with K != V takes the specs of its
    (padded) K, with the padded V filled in (the rules then check V and the V blocks against
    it). A head dim past MAX_HEAD_DIM matches nothing (``plugin.accepts`` says why)."""
    if max(problem.head_dim_k, problem.head_dim_v) > MAX_HEAD_DIM:
        return False
    return spec.head_dim_k == padded_head_dim(problem.head_dim_k)


def anchor_for(solve_block: int, lower_bound: float | None) -> str:
    """The anchor a problem takes: "block" where its promised bound keeps every sub-block's span
    within fp32 (the same kernel without the safe path's fallback), "safe" otherwise. Both run
    the same arithmetic on gates within the span, so the anchor is not a tuning choice."""
    return "block" if numeric_rule(solve_block, lower_bound, "block").ok else "safe"


def _specialize_tile(tile: KdaTileSpec, problem, fields: dict) -> KdaTileSpec:
    tile = attrs.evolve(tile, **fields)
    return attrs.evolve(tile, anchor=anchor_for(tile.solve_block, problem.gate_lower_bound))


def specialize_split(spec: KdaSplitSpec, problem) -> KdaSplitSpec | None:
    if not _matches(spec.tile, problem):
        return None
    tile, scan = _problem_fields(problem)
    return KdaSplitSpec(_specialize_tile(spec.tile, problem, tile),
                        attrs.evolve(spec.scan, **scan))  # fmt: skip


def specialize_fused(spec: KdaChunkFusedSpec, problem) -> KdaChunkFusedSpec | None:
    if not _matches(spec.tile, problem):
        return None
    tile, scan = _problem_fields(problem)
    return KdaChunkFusedSpec(_specialize_tile(spec.tile, problem, tile),
                             attrs.evolve(spec.scan, **scan))  # fmt: skip
