"""What each KDA spec launches, and the builders that compile exactly that for any target.

``*_launch(spec)`` is the one derivation of a kernel's function, constexprs, warps and stages
from its spec: ``launch.py`` launches with it and the builders compile with it (with the runtime
values of ``runtime_args.py``), so goldens and ``kreg build`` describe the kernels that run.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs

from kreg.registry.compile import compile_kernel
from kreg.registry.model import Artifact, Target

from . import kernels
from .runtime_args import (
    REPRESENTATIVE,
    LaunchShape,
    scan_absent,
    scan_qk_absent,
    scan_scalars,
    segment_count,
    tile_absent,
    tile_scalars_of,
)
from .specs import KdaChunkFusedSpec, KdaScanSpec, KdaTileSpec

_SCALARS = {"T": "i32", "H": "i32", "HV": "i32", "scale": "fp32", "lower_bound": "fp32"}
_TABLES = {"chunk_seq": "*i32", "seq_chunk": "*i32", "cu_seqlens": "*i64"}
# the scan side's tables and integers (runtime_args.scan_scalars; the combine takes no H)
_SEGMENT = {"seq_chunk": "*i32", "cu_seqlens": "*i64", "T": "i32", "HV": "i32", "NSEG": "i32"}


def _inputs(dtype: str) -> dict[str, str]:
    return {n: f"*{dtype}" for n in ("q", "k", "v", "g", "beta")} | {
        "alog": "*fp32",
        "dtb": "*fp32",
    }


_PAIRS = {"pa_t": "*fp32", "pqk_t": "*fp32"}  # the pairs kernel's diagonal sub-blocks


def _tiles(dtype: str, scalar_gate: bool) -> dict[str, str]:
    """The prep's outputs, the scan's inputs; a scalar gate's gq_t and gkt_t hold fp32 row
    scales and dec_t one decay per chunk (kernels._scan_step)."""
    tiles = {n: f"*{dtype}" for n in ("w_t", "u_t", "gq_t", "aqk_t", "gkt_t")}
    if scalar_gate:
        tiles |= {"gq_t": "*fp32", "gkt_t": "*fp32"}
    return tiles | {"dec_t": "*fp32"}


def _scan_inputs(spec: KdaScanSpec) -> dict[str, str]:
    """The scan and segment map's inputs: q and k (read with a scalar gate) and the tiles."""
    return {"q": f"*{spec.dtype}", "k": f"*{spec.dtype}"} | _tiles(spec.dtype, spec.scalar_gate)


def _states(spec: KdaScanSpec) -> dict[str, str]:
    return {"o": f"*{spec.dtype}", "h0": f"*{spec.state_dtype}", "ht": "*fp32",
            "hs": f"*{spec.chunk_states_dtype}", "hs_seq": "*i32"}  # fmt: skip


def _launch_values(signature: dict, *parts: dict) -> dict:
    """The runtime values a launch passes (runtime_args.py), for this kernel's arguments."""
    merged = {k: v for part in parts for k, v in part.items()}
    return {k: v for k, v in merged.items() if k in signature}


def _caller_dims(spec, v: bool = True) -> dict:
    """KI (and with ``v`` VI): the caller's head dims of a spec with masked tiles, passed only
    where set (the kernels' default 0 keeps every other kernel, and its golden, as it was)."""
    dims = {"KI": spec.input_dim_k, "VI": spec.input_dim_v if v else 0}
    return {name: d for name, d in dims.items() if d}


def _tile_constexprs(spec: KdaTileSpec) -> dict:
    return _caller_dims(spec) | dict(
        K=spec.head_dim_k, V=spec.head_dim_v, C=spec.chunk, BS=spec.solve_block,
        GATE_ACT=kernels.GATE_ACT[spec.gate_activation], QK_L2=spec.qk_l2norm,
        BETA_SIG=spec.beta_sigmoid, FP32_DOT=spec.fp32_dot, ANCHOR=kernels.ANCHORS[spec.anchor],
        SCALAR_GATE=spec.scalar_gate,
    )  # fmt: skip


def _scan_constexprs(spec: KdaScanSpec, block_v: int) -> dict:
    return _caller_dims(spec) | dict(
        BV=block_v, USE_H0=spec.initial_state, STORE_HT=spec.output_final_state,
        STORE_HS=spec.output_chunk_states, STATE_VK=spec.state_layout == "vk",
        VARLEN=spec.varlen, HS_EVERY=spec.chunk_states_every, SCALAR_GATE=spec.scalar_gate,
    )  # fmt: skip


@attrs.frozen
class KernelLaunch:
    """One kernel as a spec launches it."""

    fn: Any  # the @triton.jit function
    constexprs: dict
    num_warps: int
    num_stages: int

    @property
    def name(self) -> str:
        return self.fn.fn.__name__


# The pairs kernel's warps: one per 16 rows of the chunk. One warp per 16-row chunk keeps its
# row picks and channel sums inside a warp (no shared-memory round trip per column): a
# standalone copy of its loop at B1 T8192 H32 K128 on softplus gates, 64 channels per step, took
# 0.39 ms at 1 warp, 0.89 at 2, 2.68 at 4, 4.94 at 8 (H200, 2026-12-06); wider chunks get more
# warps so that no thread holds more rows (at 1 warp a 32-row chunk spills 1 KiB).
PAIRS_ROWS_PER_WARP = 16


def pairs_launch(spec: KdaTileSpec) -> KernelLaunch:
    constexprs = dict(K=spec.head_dim_k, C=spec.chunk, BS=spec.solve_block,
                      GATE_ACT=kernels.GATE_ACT[spec.gate_activation], QK_L2=spec.qk_l2norm,
                      VARLEN=spec.varlen, FP32_DOT=spec.fp32_dot)  # fmt: skip
    constexprs |= _caller_dims(spec, v=False)
    warps = max(1, spec.chunk // PAIRS_ROWS_PER_WARP)
    return KernelLaunch(kernels.kda_chunk_pairs_kernel, constexprs, warps, 1)


def prep_launch(spec: KdaTileSpec) -> KernelLaunch:
    constexprs = _tile_constexprs(spec) | {"VARLEN": spec.varlen}
    constexprs |= {"LOOPED": spec.looped, "BALLAST": spec.ballast_bytes}
    return KernelLaunch(kernels.kda_chunk_prep_kernel, constexprs, spec.num_warps, 1)


def scan_launch(spec: KdaScanSpec) -> KernelLaunch:
    constexprs = dict(K=spec.head_dim_k, V=spec.head_dim_v, C=spec.chunk, SEG=spec.segment_chunks)
    constexprs |= _scan_constexprs(spec, spec.block_v)
    return KernelLaunch(kernels.kda_chunk_scan_kernel, constexprs, spec.num_warps,
                        spec.num_stages)  # fmt: skip


def fused_launch(spec: KdaChunkFusedSpec) -> KernelLaunch:
    constexprs = _tile_constexprs(spec.tile) | _scan_constexprs(spec.scan, spec.scan.block_v)
    constexprs["ABLATE_SCAN"] = spec.ablate_scan
    return KernelLaunch(kernels.kda_chunk_fused_kernel, constexprs, spec.tile.num_warps, 1)


def segment_map_launch(spec: KdaScanSpec) -> KernelLaunch:
    constexprs = dict(K=spec.head_dim_k, V=spec.head_dim_v, C=spec.chunk, BV=spec.block_v,
                      VARLEN=spec.varlen, SEG=spec.segment_chunks,
                      SCALAR_GATE=spec.scalar_gate)  # fmt: skip
    return KernelLaunch(kernels.kda_segment_map_kernel, constexprs, spec.num_warps,
                        spec.num_stages)  # fmt: skip


def segment_combine_launch(spec: KdaScanSpec, fp32_dot: str) -> KernelLaunch:
    constexprs = dict(K=spec.head_dim_k, V=spec.head_dim_v, C=spec.chunk, BV=spec.block_v,
                      USE_H0=spec.initial_state, STATE_VK=spec.state_layout == "vk",
                      VARLEN=spec.varlen, SEG=spec.segment_chunks, FP32_DOT=fp32_dot,
                      BK=spec.combine_block_k, **_caller_dims(spec))  # fmt: skip
    return KernelLaunch(kernels.kda_segment_combine_kernel, constexprs, 4, 1)


def _compile(lc: KernelLaunch, signature: dict, target: Target, values: dict) -> Artifact:
    return compile_kernel(lc.fn, signature, lc.constexprs, target, num_warps=lc.num_warps,
                          num_stages=lc.num_stages, values=values)  # fmt: skip


# Every builder compiles the kernel Triton's JIT runs for a launch of ``shape`` (runtime_args.py):
# the representative production shape unless given the problem's (``launch_shape(problem)``).


@functools.cache
def build_kda_chunk_pairs(
    spec: KdaTileSpec, target: Target, shape: LaunchShape = REPRESENTATIVE
) -> Artifact | None:
    """The safe anchor's pairs kernel (None with the block anchor, which has none)."""
    if not spec.pairs:
        return None
    lc = pairs_launch(spec)
    signature = {n: t for n, t in _inputs(spec.dtype).items() if n not in ("v", "beta")}
    signature |= _PAIRS | _TABLES | {n: _SCALARS[n] for n in ("T", "H", "HV", "lower_bound")}
    values = _launch_values(signature, tile_scalars_of(shape), tile_absent(spec))
    return _compile(lc, signature, target, values)


@functools.cache
def build_kda_chunk_prep(
    spec: KdaTileSpec, target: Target, shape: LaunchShape = REPRESENTATIVE
) -> Artifact:
    signature = _inputs(spec.dtype) | _PAIRS | _tiles(spec.dtype, spec.scalar_gate) | _TABLES
    signature |= _SCALARS
    values = _launch_values(signature, tile_scalars_of(shape), tile_absent(spec))
    return _compile(prep_launch(spec), signature, target, values)


@functools.cache
def build_kda_chunk_scan(
    spec: KdaScanSpec, target: Target, shape: LaunchShape = REPRESENTATIVE
) -> Artifact:
    signature = _scan_inputs(spec) | _states(spec) | _SEGMENT | {"H": "i32"}
    if spec.segment_chunks:  # h0 then holds the segments' fp32 start states
        signature["h0"] = "*fp32"
    values = _launch_values(
        signature, _scan_scalars(spec, shape),
        scan_absent(spec, h0_is_segment_starts=bool(spec.segment_chunks)), scan_qk_absent(spec),
    )  # fmt: skip
    return _compile(scan_launch(spec), signature, target, values)


@functools.cache
def build_kda_chunk_fused(
    spec: KdaChunkFusedSpec, target: Target, shape: LaunchShape = REPRESENTATIVE
) -> Artifact:
    tile, scan = spec.tile, spec.scan
    signature = _inputs(tile.dtype) | _PAIRS | _states(scan)
    signature |= {"seq_chunk": "*i32", "cu_seqlens": "*i64"} | _SCALARS
    values = _launch_values(
        signature, tile_scalars_of(shape), tile_absent(tile),
        scan_absent(scan, h0_is_segment_starts=False),
    )  # fmt: skip
    return _compile(fused_launch(spec), signature, target, values)


def _scan_scalars(spec: KdaScanSpec, shape: LaunchShape) -> dict:
    return scan_scalars(shape.T, shape.H, shape.HV, spec.chunk, spec.segment_chunks,
                        shape.longest)  # fmt: skip


@functools.cache
def build_kda_segment_map(
    spec: KdaScanSpec, target: Target, shape: LaunchShape = REPRESENTATIVE
) -> Artifact | None:
    """Sequence-parallel scan, pass 1 (None when the spec has no segments)."""
    if not spec.segment_chunks:
        return None
    signature = _scan_inputs(spec) | {"seg_map": "*fp32"} | _SEGMENT
    signature |= {"H": "i32", "MAP_LAST": "i32"}
    values = _launch_values(
        signature, _scan_scalars(spec, shape) | {"MAP_LAST": 0},  # context parallel passes 1
        scan_absent(spec, h0_is_segment_starts=False), scan_qk_absent(spec),
    )  # fmt: skip
    return _compile(segment_map_launch(spec), signature, target, values)


@functools.cache
def build_kda_segment_combine(
    spec: KdaScanSpec,
    target: Target,
    fp32_dot: str = "ieee",
    shape: LaunchShape = REPRESENTATIVE,
) -> Artifact | None:
    """Sequence-parallel scan, pass 2 (None when the spec has no segments)."""
    if not spec.segment_chunks:
        return None
    signature = {"seg_map": "*fp32", "seg_start": "*fp32", "h0": f"*{spec.state_dtype}"}
    signature |= _SEGMENT
    values = _launch_values(
        signature, _scan_scalars(spec, shape), scan_absent(spec, h0_is_segment_starts=False)
    )
    return _compile(segment_combine_launch(spec, fp32_dot), signature, target, values)


# --- the varlen tables: one launch before the kernels of a packed batch -------------------------
TABLES_BLOCK = 256


def tables_launch(chunk: int, hs_size: int) -> KernelLaunch:
    """The offsets (and with ``chunk`` the chunk tables, with ``hs_size`` the chunk-state rows)
    of a packed batch: ``table_kernels``. ``chunk`` = 0 / ``hs_size`` = 0: not made."""
    from .table_kernels import kda_varlen_tables_kernel

    constexprs = dict(C=chunk, HS=hs_size, BLOCK=TABLES_BLOCK)
    return KernelLaunch(kda_varlen_tables_kernel, constexprs, 4, 1)


@functools.cache
def build_kda_varlen_tables(target: Target, chunk: int = 64, hs_size: int = 0) -> Artifact:
    signature = {"cu_in": "*i64", "cu_out": "*i64", "seq_chunk": "*i32", "chunk_seq": "*i32",
                 "hs_seq": "*i32", "N": "i32", "T": "i32", "NC": "i32", "STEPS": "i32"}  # fmt: skip
    values = dict(N=64, T=8192, NC=192, STEPS=7)
    if not chunk:
        values |= dict.fromkeys(("seq_chunk", "chunk_seq"))
    if not hs_size:
        values["hs_seq"] = None
    return _compile(tables_launch(chunk, hs_size), signature, target, values)


def _int_class(n: int) -> int:
    """How Triton's JIT specialises an integer argument: 1, divisible by 16, or neither."""
    return 1 if n == 1 else (16 if n % 16 == 0 else 0)


def kernel_keys(problem, spec) -> set[tuple]:
    """The kreg kernels a launch of ``spec`` for ``problem`` compiles, as keys: function,
    constexprs, warps, stages and the classes of the integers the JIT specialises on (T, H, HV,
    NSEG, runtime_args.py). Equal keys are one compiled kernel."""
    T, H, HV = problem.seq_len, problem.heads_qk, problem.heads_v
    ints = (_int_class(T), _int_class(H), _int_class(HV))
    nseg = _int_class(
        segment_count(problem.longest_seq, spec.tile.chunk, spec.scan.segment_chunks)
    )  # as launch._scan_scalars
    launches = [(prep_launch(spec.tile), ints), (scan_launch(spec.scan), ints + (nseg,))]
    if spec.tile.pairs:
        launches.append((pairs_launch(spec.tile), ints))
    if spec.scan.segment_chunks:
        launches += [(segment_map_launch(spec.scan), ints + (nseg,)),
                     (segment_combine_launch(spec.scan, spec.tile.fp32_dot), ints + (nseg,))]  # fmt: skip
    return {(lc.name, tuple(sorted(lc.constexprs.items())), lc.num_warps, lc.num_stages, cls)
            for lc, cls in launches}  # fmt: skip
