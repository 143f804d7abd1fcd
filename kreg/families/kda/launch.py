"""Launch the KDA kernels for a validated call: buffers, grids, chunk tables.

Inputs reach this module already checked by ``api.kda_prefill``; nothing here validates.
"""

from __future__ import annotations

import attrs
import torch
import triton

from . import plans
from .builders import (
    KernelLaunch,
    fused_launch,
    pairs_launch,
    prep_launch,
    scan_launch,
    segment_combine_launch,
    segment_map_launch,
    tables_launch,
)
from .recurrent import recurrent_launch, recurrent_scalars
from .runtime_args import scan_scalars, tile_scalars


@attrs.frozen
class Call:
    """Tensors of one prefill call, flattened to one token axis of B * T rows."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    scale: float
    A_log: torch.Tensor | None
    dt_bias: torch.Tensor | None
    lower_bound: float
    gate_activation: str
    qk_l2norm: bool
    beta_sigmoid: bool
    initial_state: torch.Tensor | None
    output_final_state: bool
    output_chunk_states: bool
    state_layout: str
    # int64 or int32 [N + 1] on the device, or None: a device copy of the validated host offsets,
    # or the caller's device offsets (not validated: device-only, or under CUDA graph capture);
    # chunk_tables makes them safe before any other kernel reads them (the decode kernel clamps
    # each sequence's pair itself)
    cu_seqlens: torch.Tensor | None
    cu_seqlens_host: torch.Tensor | None = None  # the validated CPU offsets, int64
    # varlen: the longest sequence's tokens the scan is planned for (the problem's, read once
    # from the host offsets or the caller's max_seqlen); None: the packed length
    longest: int | None = None
    # int64 [N] slots of a state pool (``initial_state`` is then the pool [P, HV, K, V]), or None
    state_indices: torch.Tensor | None = None
    # with output_chunk_states: a state every chunk_states_size tokens, in this dtype
    chunk_states_size: int = 64
    chunk_states_dtype: torch.dtype = torch.float32


def chunk_tables(call: Call, chunk: int):
    """(call, (seq_chunk [N+1] int32, chunk_seq [NC_max] int32, NC_max)), made on the device in
    one launch (``table_kernels``): no sync. The returned call reads the offsets that kernel made
    safe (clamped into [0, T], non-decreasing: the same values where they were valid), which is
    what every kernel of a packed batch must read. ``chunk`` = 0: the offsets alone.

    For fixed-length batches the kernels derive chunks arithmetically and no tables are made.
    """
    B, T = call.q.shape[:2]
    if call.cu_seqlens is None:
        return call, (None, None, B * triton.cdiv(T, chunk) if chunk else 0)
    cu = call.cu_seqlens
    n = cu.shape[0] - 1
    dev = call.q.device
    # every sequence adds at most one part chunk
    nc_max = triton.cdiv(T, chunk) + n if chunk else 0
    clean = torch.empty(n + 1, dtype=torch.int64, device=dev)
    seq_chunk = torch.empty(n + 1, dtype=torch.int32, device=dev) if chunk else None
    chunk_seq = torch.empty(max(nc_max, 1), dtype=torch.int32, device=dev) if chunk else None
    _launch(tables_launch(chunk, 0), (1,), cu, clean, seq_chunk, chunk_seq, None, N=n, T=T,
            NC=nc_max, STEPS=n.bit_length())  # fmt: skip
    return attrs.evolve(call, cu_seqlens=clean), (seq_chunk, chunk_seq, nc_max)


def chunk_state_rows(call: Call) -> int:
    """Rows of the chunk-state buffer: one per ``chunk_states_size`` tokens of each sequence,
    for varlen the most the packed length allows (no host sync: each sequence adds at most one
    part chunk), of which ``api`` returns the ones written."""
    B, T = call.q.shape[:2]
    per = triton.cdiv(T, call.chunk_states_size)
    return B * per if call.cu_seqlens is None else per + call.cu_seqlens.numel() - 2


def _chunk_state_table(call: Call, spec) -> torch.Tensor | None:
    """hs_seq [N + 1] int32: each sequence's first chunk-state row, built on the device (no
    sync), where the kernels need it (varlen, a state every few chunks); else None."""
    if call.cu_seqlens is None or not call.output_chunk_states or spec.chunk_states_every == 1:
        return None
    cu = call.cu_seqlens
    size = call.chunk_states_size
    table = torch.zeros(cu.numel(), dtype=torch.int32, device=cu.device)
    table[1:] = torch.cumsum(torch.div(cu[1:] - cu[:-1] + size - 1, size, rounding_mode="floor"), 0)
    return table


def _outputs(call: Call):
    B, T, HV = call.v.shape[:3]
    K, V = call.k.shape[-1], call.v.shape[-1]
    n_states = B if call.cu_seqlens is None else call.cu_seqlens.numel() - 1
    shape = (K, V) if call.state_layout == "kv" else (V, K)
    dev = call.q.device
    o = torch.empty_like(call.v)
    ht = torch.empty((n_states, HV, *shape), dtype=torch.float32, device=dev) \
        if call.output_final_state else None  # fmt: skip
    hs = torch.empty((chunk_state_rows(call), HV, *shape), dtype=call.chunk_states_dtype,
                     device=dev) if call.output_chunk_states else None  # fmt: skip
    return o, ht, hs


def _scalars(call: Call) -> dict:
    H, HV = call.q.shape[2], call.v.shape[2]
    return tile_scalars(call.q.shape[1], H, HV, call.scale, call.lower_bound)


def _launch(lc: KernelLaunch, grid, *args, **runtime):
    """Launch ``lc`` (the spec's derivation in builders.py, the one the builds compile); a
    recording plan (``plans``) notes the launch to replay it."""
    with plans.launching():
        kernel = lc.fn[grid](*args, **runtime, **lc.constexprs, num_warps=lc.num_warps,
                             num_stages=lc.num_stages)  # fmt: skip
    plans.note_launch(lc, grid, args, runtime, kernel)


def _inputs(call: Call):
    return (call.q, call.k, call.v, call.g, call.beta, call.A_log, call.dt_bias)


def run_pairs(call: Call, tile, tables):
    """The safe anchor's pairs kernel (the diagonal sub-blocks, [NC, HV, C, BS] fp32 each for
    A and Aqk), before the prep or the fused kernel; (None, None) with the block anchor."""
    if not tile.pairs:
        return None, None
    seq_chunk, chunk_seq, nc = tables
    HV = call.v.shape[2]
    pa = torch.empty((nc, HV, tile.chunk, tile.solve_block), dtype=torch.float32,
                     device=call.q.device)  # fmt: skip
    pqk = torch.empty_like(pa)
    scalars = {n: x for n, x in _scalars(call).items() if n != "scale"}
    _launch(pairs_launch(tile), (nc, HV), call.q, call.k, call.g, call.A_log, call.dt_bias,
            pa, pqk, chunk_seq, seq_chunk, call.cu_seqlens, **scalars)  # fmt: skip
    return pa, pqk


def _n_states(call: Call) -> int:
    return call.q.shape[0] if call.cu_seqlens is None else call.cu_seqlens.numel() - 1


def run_split(call: Call, spec):
    """``kda.split``: pairs (safe anchor), prep and scan kernels. Returns (o, final_state,
    chunk_states)."""
    return _pooled(call, spec, _split)


def _split(call: Call, spec):
    call, tables = chunk_tables(call, spec.tile.chunk)
    return run_scan(call, spec.tile, spec.scan, tables, run_prep(call, spec.tile, tables))


def _pooled(call: Call, spec, run):
    """``run(call, spec)`` of a chunked path, which reads and writes [N, ...] states: a pool's
    N slots are gathered into a buffer and the final states scattered back into the pool,
    which is returned as the final state."""
    pool, slots = call.initial_state, call.state_indices
    if slots is None:
        return run(call, spec)
    call = attrs.evolve(call, initial_state=gather_slots(pool, slots), state_indices=None,
                        output_final_state=True)  # fmt: skip
    o, ht, hs = run(call, spec)
    scatter_slots(pool, slots, ht)
    return o, pool, hs


def gather_slots(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The start states ``[N, ...]`` of pooled sequences, in the pool's dtype: slot ``slots[n]``,
    zeros for a negative slot, NaN past the pool (that sequence's outputs become NaN, as
    ``kda.recurrent`` makes them; nothing outside the pool is read). No device sync."""
    P = pool.shape[0]
    inside = ((slots >= 0) & (slots < P)).view(-1, 1, 1, 1)
    if P == 0:
        rows = pool.new_zeros((slots.shape[0], *pool.shape[1:]))
    else:
        rows = pool.index_select(0, slots.clamp(0, P - 1))
    fill = torch.where(slots < 0, 0.0, float("nan")).to(pool.dtype).view(-1, 1, 1, 1)
    return torch.where(inside, rows, fill)


def scatter_slots(pool: torch.Tensor, slots: torch.Tensor, final: torch.Tensor) -> None:
    """Write the final states ``[N, ...]`` into their slots of ``pool``, in place, skipping
    negative slots and slots past the pool, without a device sync (so no boolean indexing).
    Every row writes to its slot clamped into the pool; a row that must not write stores the
    value its clamped slot ends with anyway (the final state of the sequence that owns that
    slot, else the slot's own value), so the duplicate writes all carry one value and
    ``index_copy_`` is deterministic. Two sequences given one slot (not detectable here without
    a sync) race, as in ``kda.recurrent``: the documented contract."""
    P = pool.shape[0]
    if P == 0:
        return
    inside = (slots >= 0) & (slots < P)
    target = slots.clamp(0, P - 1).to(torch.int64)  # index_copy_ takes int64 only
    owns = (target[:, None] == slots[None, :]) & inside[None, :]  # [n, m]: m owns n's target
    owner = torch.where(inside, torch.arange(slots.shape[0], device=slots.device),
                        owns.to(torch.int8).argmax(1))  # fmt: skip
    owned = owns.any(1).view(-1, 1, 1, 1)
    value = torch.where(owned, final.index_select(0, owner).to(pool.dtype),
                        pool.index_select(0, target))  # fmt: skip
    pool.index_copy_(0, target, value)


def run_prep(call: Call, tile, tables):
    """The prep kernel alone: returns the tiles (w, u, gq, aqk, gkt, dec), chunk-major; a
    scalar gate's gq and gkt are [NC, HV, C] fp32 row scales and dec one decay per chunk
    [NC, HV] (kernels._scan_step)."""
    seq_chunk, chunk_seq, nc = tables
    # the kernels' head dims (the spec's: with masked tiles the call's are the caller's)
    HV, K, V, C = call.v.shape[2], tile.head_dim_k, tile.head_dim_v, tile.chunk
    dev, dt = call.q.device, call.q.dtype
    w = torch.empty((nc, HV, C, K), dtype=dt, device=dev)
    u = torch.empty((nc, HV, C, V), dtype=dt, device=dev)
    aqk = torch.empty((nc, HV, C, C), dtype=dt, device=dev)
    if tile.scalar_gate:
        gq = torch.empty((nc, HV, C), dtype=torch.float32, device=dev)
        gkt = torch.empty_like(gq)
        dec = torch.empty((nc, HV), dtype=torch.float32, device=dev)
    else:
        gq = torch.empty_like(w)
        gkt = torch.empty((nc, HV, K, C), dtype=dt, device=dev)
        dec = torch.empty((nc, HV, K), dtype=torch.float32, device=dev)
    args = (*_inputs(call), *run_pairs(call, tile, tables), w, u, gq, aqk, gkt, dec, chunk_seq,
            seq_chunk, call.cu_seqlens)  # fmt: skip
    _launch(prep_launch(tile), (_n_states(call) if tile.looped else nc, HV), *args,
            **_scalars(call))  # fmt: skip
    return w, u, gq, aqk, gkt, dec


def run_scan(call: Call, tile, scan, tables, tiles, seg_map=None):
    """The scan (and, with segments, its map and combine kernels) over stored tiles;
    ``seg_map``: the segments' maps where already computed (``segment_maps``)."""
    seq_chunk = tables[0]
    HV = call.v.shape[2]
    n_states = _n_states(call)
    o, ht, hs = _outputs(call)
    h0, seg = call.initial_state, scan.segment_chunks
    scalars = _scan_scalars(call, tile.chunk, seg)  # NSEG is 1 without segments
    if seg:
        if seg_map is None:
            seg_map = segment_maps(call, tiles, scan, seq_chunk, n_states)
        scalars["NSEG"] = seg_map.shape[1]  # the maps' (given ones planned for this call)
        h0 = segment_starts(call, seg_map, scan, seq_chunk, n_states, tile.fp32_dot)
    _launch(
        scan_launch(scan), (v_blocks(scan), n_states * HV, scalars["NSEG"]),
        *_qk(call, scan), *tiles, o, h0, ht, hs, _chunk_state_table(call, scan), seq_chunk, call.cu_seqlens,
        **scalars,
    )  # fmt: skip
    return o, ht, hs


def segment_maps(call: Call, tiles, scan, seq_chunk, n_states: int, map_last: bool = False):
    """Sequence-parallel scan, pass 1: each segment's affine map [M | N], as
    [n_states, NSEG, HV, K, K + V] fp32 (entries past a sequence's segments are not written,
    nor its last segment's unless ``map_last``: the scan needs none of those).
    ``seq_chunk`` and ``call.cu_seqlens`` may start at any sequence (the first ``n_states``
    from there are mapped)."""
    HV, K, V = call.v.shape[2], scan.head_dim_k, scan.head_dim_v
    # runtime_args.segment_count: for the longest sequence; segments past a sequence's end do
    # nothing.
    scalars = _scan_scalars(call, scan.chunk, scan.segment_chunks)
    n_seg = scalars["NSEG"]
    seg_map = torch.empty((n_states, n_seg, HV, K, K + V), dtype=torch.float32,
                          device=call.q.device)  # fmt: skip
    _launch(
        segment_map_launch(scan), (K // scan.block_v + v_blocks(scan), n_states * HV, n_seg),
        *_qk(call, scan), *tiles, seg_map, seq_chunk, call.cu_seqlens, **scalars,
        MAP_LAST=int(map_last),
    )  # fmt: skip
    return seg_map


def segment_starts(call: Call, seg_map, scan, seq_chunk, n_states: int, fp32_dot: str):
    """Sequence-parallel scan, pass 2: the serial chain over segments from the initial state.
    Returns the start states [N, NSEG, HV, K, V] fp32."""
    HV, V = call.v.shape[2], scan.head_dim_v
    starts = torch.empty((*seg_map.shape[:-1], V), dtype=torch.float32, device=call.q.device)
    scalars = _scan_scalars(call, scan.chunk, scan.segment_chunks)
    _launch(
        segment_combine_launch(scan, fp32_dot), (v_blocks(scan), n_states * HV),
        seg_map, starts, call.initial_state, seq_chunk, call.cu_seqlens,
        T=scalars["T"], HV=scalars["HV"], NSEG=seg_map.shape[1],  # it reads no token rows: no H
    )  # fmt: skip
    return starts


def v_blocks(scan) -> int:
    """The scan's V blocks that hold a caller's column: with masked tiles a block wholly past
    the caller's V (V = 192 at 256 in blocks of 64) is not launched, nor its segment maps'
    columns and start states, which nothing else reads."""
    return triton.cdiv(scan.input_dim_v or scan.head_dim_v, scan.block_v)


def _qk(call: Call, scan) -> tuple:
    """q and k for the scan side: a scalar gate's scan forms gq and gkt from them."""
    return (call.q, call.k) if scan.scalar_gate else (None, None)


def _scan_scalars(call: Call, chunk: int, segment_chunks: int) -> dict:
    """The scan kernels' scalars, NSEG planned for ``call.longest``, not the packed length,
    which gives every sequence as many segments as all of them together hold (one
    30,000-token sequence among 20 short ones: 21 each instead of 15)."""
    return scan_scalars(call.q.shape[1], call.q.shape[2], call.v.shape[2], chunk, segment_chunks,
                        call.longest)  # fmt: skip


def run_fused(call: Call, spec):
    """``kda.fused``: the pairs kernel (safe anchor), then the fused kernel. Returns (o,
    final_state, chunk_states)."""
    return _pooled(call, spec, _fused)


def _fused(call: Call, spec):
    tile = spec.tile
    call, tables = chunk_tables(call, tile.chunk)
    seq_chunk = tables[0]
    HV = call.v.shape[2]
    pairs = run_pairs(call, tile, tables)
    o, ht, hs = _outputs(call)
    n_states = _n_states(call)
    _launch(
        fused_launch(spec), (1, n_states * HV),
        *_inputs(call), *pairs, o, call.initial_state, ht, hs, _chunk_state_table(call, spec.scan),
        seq_chunk, call.cu_seqlens, **_scalars(call),
    )  # fmt: skip
    return o, ht, hs


def run_recurrent(call: Call, spec):
    """Launch the recurrence for a validated ``launch.Call``. Returns (o, final_state, None):
    with a pool the final states are in the pool (returned as the final state). The offsets
    and slots go in as the caller gave them (int32 or int64): the kernel clamps each sequence's
    offsets itself, so a decode step is one launch (a cleaning launch and a dtype conversion
    cost an engine's every token host time)."""
    B, T, H = call.q.shape[:3]
    HV, V = call.v.shape[2], call.v.shape[3]
    n = B if call.cu_seqlens is None else call.cu_seqlens.numel() - 1
    o = torch.empty_like(call.v)
    pool = call.state_indices is not None
    ht = None
    if pool:
        ht = call.initial_state
    elif call.output_final_state:
        shape = (n, HV, call.k.shape[-1], V)
        ht = torch.empty(shape if call.state_layout == "kv" else (*shape[:2], V, shape[2]),
                         dtype=torch.float32, device=call.q.device)  # fmt: skip
    scalars = recurrent_scalars(T, H, HV, call.initial_state.shape[0] if pool else 1,
                                call.scale, call.lower_bound)  # fmt: skip
    _launch(
        recurrent_launch(spec), (n * HV * (V // spec.block_v),),
        *_inputs(call), o, call.initial_state, None if pool else ht, call.state_indices,
        call.cu_seqlens, **scalars,
    )  # fmt: skip
    return o, ht, None
