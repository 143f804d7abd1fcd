"""The non-tensor values a launch passes each KDA kernel, and which pointers it passes as None.

Triton's JIT specialises a kernel on them at launch: an integer divisible by 16 gets a
``tt.divisibility = 16`` attribute, an integer equal to 1 and a None pointer are folded into
constants. The kernel therefore depends on these values, so ``launch.py`` passes the integers
built here and ``builders.py`` compiles with the same values (those of a representative problem
unless told the real one), making the AOT artifact the kernel that runs. No torch here: the
builders run on machines without a device.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class LaunchShape:
    """The problem sizes the kernels receive as integers."""

    T: int  # tokens per batch row (all packed tokens with varlen)
    H: int  # query / key heads
    HV: int  # value heads
    longest: int | None = None  # varlen: the longest sequence's tokens (plans NSEG)


# What goldens and a problem-less ``kreg build`` describe: the common production kernel, T a
# multiple of 16 and H, HV > 1 multiples of 16, so T, H and HV all get divisibility 16 and none
# is folded to 1. (A T not divisible by 16, or HV == 1, runs a different kernel.)
REPRESENTATIVE = LaunchShape(T=8192, H=16, HV=16)
# Floats are not specialised by the JIT; these only fill the argument.
_SCALE, _LOWER_BOUND = 1.0, -5.0


def launch_shape(problem=None) -> LaunchShape:
    """The launch shape of a ``LinearAttentionProblem``, or the representative one for None."""
    if problem is None:
        return REPRESENTATIVE
    return LaunchShape(T=problem.seq_len, H=problem.heads_qk, HV=problem.heads_v,
                       longest=problem.longest_seq if problem.varlen else None)  # fmt: skip


def segment_count(T: int, chunk: int, segment_chunks: int) -> int:
    """NSEG: scan segments per sequence for sequences of at most T tokens (the longest one's
    length where the host knows it, else the packed length); 1 without segments. A longer
    sequence (a captured CUDA graph replayed on new offsets) stays right: its last segment runs
    the chunks past NSEG segments (kernels._recurrence)."""
    if not segment_chunks:
        return 1
    n_chunks = -(-T // chunk)
    return max(1, -(-n_chunks // segment_chunks))


def tile_scalars(T: int, H: int, HV: int, scale: float, lower_bound: float) -> dict:
    """Runtime scalars of the prep and fused kernels."""
    return dict(T=T, H=H, HV=HV, scale=scale, lower_bound=lower_bound)


def scan_scalars(
    T: int, H: int, HV: int, chunk: int, segment_chunks: int, longest: int | None = None
) -> dict:
    """Runtime scalars of the scan, segment map and segment combine kernels; ``longest``: the
    longest sequence's tokens where known (varlen), which NSEG is planned for."""
    return dict(T=T, H=H, HV=HV, NSEG=segment_count(longest or T, chunk, segment_chunks))


def tile_scalars_of(shape: LaunchShape) -> dict:
    return tile_scalars(shape.T, shape.H, shape.HV, _SCALE, _LOWER_BOUND)


# Pointers a launch passes as None (launch.py gets them from the Call: absent options), per
# kernel, as functions of the spec the kernel is built from.
def tile_absent(tile) -> dict:
    """Prep / fused inputs: the gate parameters without a gate activation, the pairs' buffers
    with the block anchor (no pairs kernel), the chunk tables and offsets without varlen."""
    out = dict.fromkeys(("alog", "dtb")) if tile.gate_activation == "none" else {}
    out |= dict.fromkeys(("pa_t", "pqk_t")) if not tile.pairs else {}
    return out | ({} if tile.varlen else dict.fromkeys(("chunk_seq", "seq_chunk", "cu_seqlens")))


def scan_absent(scan, *, h0_is_segment_starts: bool) -> dict:
    """Scan-side pointers: h0 without an initial state (unless it holds the segments' start
    states), ht / hs when not stored, the sequence tables without varlen, hs_seq unless
    varlen chunk states are subsampled."""
    out = {} if scan.varlen else dict.fromkeys(("seq_chunk", "cu_seqlens"))
    if not (scan.initial_state or h0_is_segment_starts):
        out["h0"] = None
    if not scan.output_final_state:
        out["ht"] = None
    if not scan.output_chunk_states:
        out["hs"] = None
    if not (scan.output_chunk_states and scan.varlen and scan.chunk_states_every > 1):
        out["hs_seq"] = None  # only varlen subsampled chunk states need the row table
    return out


def scan_qk_absent(scan) -> dict:
    """The scan and segment map read q and k with a scalar gate only (launch._qk)."""
    return {} if scan.scalar_gate else dict.fromkeys(("q", "k"))
