"""Context parallel KDA prefill: one batch's token axis split over the ranks of a process group.

One implementation serves both delta-rule families, parametrised by a ``CpEntry`` (family and
gate kind): ``kda_prefill_cp`` here, and ``gdn_prefill_cp`` (``kreg.families.gdn``; its scalar
gate ``[B, T, HV]`` is sliced on the token axis as every other input) through ``prefill_cp``.
After the prep kernel the two gate kinds' tiles feed the same scan, map and combine kernels.

Each rank holds a contiguous slice of the tokens (of a packed batch, or of every row of a
fixed-length batch); a slice may cut sequences anywhere, hold nothing, and need not be a whole
number of chunks. The recurrence is affine in the state (docs/kda/ALGORITHM.md section 2), so
a rank needs only one thing from the ranks before it: the state at its slice's start.

1. Every rank computes its chunk tiles (the prep kernel) and, for each sequence that continues
   past its slice ("open" pieces: at most one with ``cu_seqlens``, every row of a fixed batch),
   the affine map ``S_end = M S_start + N`` of its piece: the segment-map kernel over the
   piece's segments, then the segment-combine kernel run on the augmented state ``[M | N]``
   from ``[I | 0]``, which composes the segments' maps in order.
2. One ``all_gather`` exchanges those maps (``[slots, HV, K, K + V]`` fp32 per rank).
3. Each rank runs the segment-combine kernel over the maps of the ranks before it, in rank
   order, from the sequence's initial state: its incoming state. The order is fixed, so the
   result is the same bit for bit from run to run.
4. The local scan (the split path's scan kernel, sequence-parallel where its spec says so)
   runs from those states; the rank holding a sequence's end returns its final state.

Chunks are local to each slice (a rank's first chunk starts at its slice's start): the chunk
form is exact for any chunking, so this changes roundings only, and ranks may run different
specs.
"""

from __future__ import annotations

import inspect
import numbers

import attrs
import numpy as np
import torch

from kreg.dispatch import select

from . import api, launch
from .builders import segment_combine_launch
from .selection import FAMILY_NAME
from .specs import SEGMENT_CHUNKS, padded_spec

# Segments of the open piece's map when the local scan has none (its spec's otherwise): the
# map pass is then a parallel map kernel plus a chain of chunks / this many combine steps.
MAP_SEGMENT_CHUNKS = max(SEGMENT_CHUNKS)


@attrs.frozen
class CpEntry:
    """The single-process entry a context parallel one serves: the family whose split candidate
    runs every slice (its segment maps carry the state across ranks) and the gate kind
    ``api._validate`` checks g against ("per_channel": ``[B, T, HV, K]``; "scalar":
    ``[B, T, HV]``)."""

    family: str
    gate: str

    @property
    def algorithm(self) -> str:
        return f"{self.family}.split"


KDA = CpEntry(FAMILY_NAME, "per_channel")


@attrs.frozen
class CpPlan:
    """What one rank holds, from host values alone (every rank can plan every rank).

    A *piece* is the part of one sequence inside the rank's slice; an empty sequence is a piece
    of the rank holding its end position's token before it (rank 0 at position 0).
    """

    rank: int
    offsets: tuple[int, ...]  # the global token offset of every rank's slice, world + 1
    varlen: bool
    seqs: tuple[int, ...]  # the global sequence of each piece, in token order
    local_cu: tuple[int, ...] | None  # the pieces' offsets in the slice (varlen), P + 1
    open: tuple[int, ...]  # pieces continuing past the slice (the maps this rank sends)
    slots: int  # maps every rank sends (padded): 1 with cu_seqlens, B without
    preds: tuple[tuple[tuple[int, int], ...], ...]  # per piece: (rank, slot) of earlier pieces
    owned: tuple[int, ...]  # pieces whose sequence ends in this slice (their final states)

    @property
    def tokens(self) -> int:
        return self.offsets[self.rank + 1] - self.offsets[self.rank]

    @property
    def owned_seqs(self) -> tuple[int, ...]:
        """The global sequences whose final states this rank returns, in that order."""
        return tuple(self.seqs[p] for p in self.owned)


def plan_cp(offsets, rank: int, *, cu_seqlens=None, batch: int = 1) -> CpPlan:
    """The plan of ``rank`` for slices at token ``offsets`` (validated, world + 1 ints) of a
    packed batch with host offsets ``cu_seqlens`` (validated), or of a fixed batch of
    ``batch`` rows."""
    offsets = tuple(int(x) for x in offsets)
    world = len(offsets) - 1
    if cu_seqlens is None:
        return _plan_fixed(offsets, rank, world, batch)
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    start, end = cu[:-1], cu[1:]
    # the rank holding the token before each sequence's end (rank 0 for an end at 0)
    owner = np.searchsorted(np.asarray(offsets[1:]), end, side="left")
    a, b = offsets[rank], offsets[rank + 1]
    held = ((start < b) & (end > a) & (a < b)) | ((start == end) & (owner == rank))
    seqs = tuple(int(n) for n in np.flatnonzero(held))
    local_cu = (0, *(int(min(max(end[n], a), b)) - a for n in seqs)) if seqs else (0,)
    opened = [_open_seq(cu, offsets, r) for r in range(world)]
    preds = tuple(
        tuple((r, 0) for r in range(rank) if opened[r] == n) for n in seqs
    )  # fmt: skip
    return CpPlan(
        rank=rank, offsets=offsets, varlen=True, seqs=seqs, local_cu=local_cu,
        open=tuple(p for p, n in enumerate(seqs) if opened[rank] == n), slots=1, preds=preds,
        owned=tuple(p for p, n in enumerate(seqs) if owner[n] == rank),
    )  # fmt: skip


def _open_seq(cu: np.ndarray, offsets, r: int) -> int | None:
    """The sequence continuing past rank ``r``'s slice, if any (only its last can)."""
    a, b = offsets[r], offsets[r + 1]
    if a == b or b == int(cu[-1]):
        return None
    n = int(np.searchsorted(cu, b, side="right")) - 1  # the last sequence starting <= b
    return n if cu[n] < b else None


def _plan_fixed(offsets, rank: int, world: int, batch: int) -> CpPlan:
    T = offsets[-1]
    held = [r for r in range(world) if offsets[r] < offsets[r + 1]]
    if rank not in held:
        return CpPlan(rank=rank, offsets=offsets, varlen=False, seqs=(), local_cu=None, open=(),
                      slots=batch, preds=(), owned=())  # fmt: skip
    rows = tuple(range(batch))
    earlier = tuple(r for r in held if r < rank)
    return CpPlan(
        rank=rank, offsets=offsets, varlen=False, seqs=rows, local_cu=None,
        open=rows if offsets[rank + 1] < T else (), slots=batch,
        preds=tuple(tuple((r, b) for r in earlier) for b in rows),
        owned=rows if offsets[rank + 1] == T else (),
    )  # fmt: skip


@attrs.frozen
class CpCall:
    """One rank's validated share of a context parallel call (``prepare_cp``)."""

    plan: CpPlan
    group: object
    problem: object  # the slice's LinearAttentionProblem (a one-token stand-in if empty)
    call: launch.Call | None  # the slice's launch call (None for an empty slice)
    target: object
    v: torch.Tensor  # the slice's v (shapes, device; the empty output of an empty slice)
    k_dim: int
    initial_state: torch.Tensor | None  # the global initial states, as given
    state_layout: str
    output_final_state: bool
    allow_opt_in: bool


def kda_prefill_cp(q, k, v, g, beta, *, group, cp_offsets=None, **options):
    """``kda_prefill`` of one batch whose token axis is split over the ranks of ``group`` (a
    ``torch.distributed`` process group; every rank calls this with its slice). Returns
    ``(o, final_state)``: ``o`` the slice's outputs, ``final_state`` the final states of the
    sequences whose end lies in this slice, ``[len(plan.owned_seqs), HV, K, V]`` in sequence
    order (``plan_cp`` says which), or None without ``output_final_state``.

    q, k, v, g, beta are the slice: ``[B, T_r, ...]`` (T_r may be 0). ``cp_offsets``: the
    global token offset of every rank's slice, world + 1 ints from 0 (a CPU tensor or a
    sequence; rank r holds tokens ``[cp_offsets[r], cp_offsets[r + 1])`` of every row); None
    means equal slices of T_r tokens. ``cu_seqlens`` (with ``cu_seqlens_cpu``),
    ``initial_state`` and ``max_seqlen`` describe the whole batch, as ``kda_prefill``'s do, and
    are the same on every rank. Every other option is ``kda_prefill``'s; ``algorithm`` may be
    "auto" or "kda.split" (the split path's segment maps carry the state across ranks), and
    ``output_chunk_states`` is not served (chunks are local to each slice).

    One collective per call (an all-gather of ``[slots, HV, K, K + V]`` fp32 per rank: slots
    1 with ``cu_seqlens``, B without). Every rank must call with the same global arguments; a
    rank whose arguments are refused raises before the collective (and the others then wait in
    it, as with any collective).
    """
    return prefill_cp(KDA, q, k, v, g, beta, group, cp_offsets, options)


def prefill_cp(entry: CpEntry, q, k, v, g, beta, group, cp_offsets, options: dict):
    """``entry``'s context parallel call (``kda_prefill_cp``'s arguments, ``options`` its
    prefill keywords): validate and plan the slice, select the family's split candidate, run."""
    cp = _prepare_cp(entry, q, k, v, g, beta, group, cp_offsets, options)
    selection = select(cp.problem, cp.target, family=entry.family, algorithm=entry.algorithm,
                       allow_opt_in=cp.allow_opt_in)  # fmt: skip
    return run_cp(cp, selection)


# the prefill keywords context parallelism does not serve: pools are per engine step, chunk
# states are local to each slice
_NOT_SERVED = ("output_chunk_states", "initial_state_indices", "initial_state_indices_cpu",
               "chunk_states_size", "chunk_states_dtype")  # fmt: skip


def prepare_cp(q, k, v, g, beta, *, group, cp_offsets=None, entry: CpEntry = KDA,
               **options) -> CpCall:  # fmt: skip
    """Validate one rank's arguments (``options``: ``kda_prefill``'s keywords, bound by its
    signature; each checked once: ``api._validate`` checks the slice's tensors, g against
    ``entry``'s gate kind, and the global options) and plan its slice."""
    return _prepare_cp(entry, q, k, v, g, beta, group, cp_offsets, options)


def _prepare_cp(entry: CpEntry, q, k, v, g, beta, group, cp_offsets, options: dict) -> CpCall:
    a = api.prefill_arguments(q, k, v, g, beta, **options)
    for name in _NOT_SERVED:
        if api.given(a, name):
            api._fail(name, "not served with context parallelism: chunks are local to each "
                            "rank's slice, and state pools to one engine's step")  # fmt: skip
    algorithm, target, max_seqlen = a["algorithm"], a["target"], a["max_seqlen"]
    cu_seqlens, initial_state = a["cu_seqlens"], a["initial_state"]
    output_final_state, state_layout = a["output_final_state"], a["state_layout"]
    rank, world = _group(group)
    split = entry.algorithm
    if algorithm not in ("auto", split, "split"):
        api._fail("algorithm", f"context parallel runs {split} (its segment maps carry the "
                               f"state across ranks): 'auto' or '{split}', got {algorithm!r}")  # fmt: skip
    T_r = int(q.shape[1]) if isinstance(q, torch.Tensor) and q.dim() == 4 else None
    stand = _stand_ins(q, k, v, g, beta) if T_r == 0 else (q, k, v, g, beta)
    # max_seqlen is the whole batch's: checked against its length below
    checked = api._validate(*stand, **{**api.validated(a), "max_seqlen": None}, gate=entry.gate)
    api._check_device(q)
    sel_target = api._target(q, target)
    varlen = cu_seqlens is not None
    offsets = _check_offsets(cp_offsets, rank, world, T_r)
    if varlen:  # the global offsets: validated against the whole batch's length
        cu_host, _ = api._offsets(cu_seqlens, a["cu_seqlens_cpu"], offsets[-1], q.device)
        if max_seqlen is not None:
            api.longest_seq(cu_host, api._check_max_seqlen(max_seqlen, offsets[-1], True))
    else:
        cu_host = None
        if offsets[-1] == 0:
            api._fail("cp_offsets", "the slices hold no token: every row would be empty")
        api._check_max_seqlen(max_seqlen, offsets[-1], False)
    plan = plan_cp(offsets, rank, cu_seqlens=cu_host, batch=int(q.shape[0]))
    # the slice's problem: pieces start from the incoming states (fp32, [K, V]); outputs in
    # the caller's layout are made from the [K, V] ones at the end
    local = dict(initial_state=True, state_dtype="fp32", state_layout="kv",
                 output_chunk_states=False)  # fmt: skip
    if T_r == 0:
        call = None
        problem = checked.problem(**local, max_seqlen=1 if varlen else None)
    else:
        lens = np.diff(plan.local_cu) if varlen else None
        local_host = torch.tensor(plan.local_cu, dtype=torch.int64) if varlen else None
        local_dev = None
        if varlen:
            local_dev = local_host if q.device.type == "cpu" else local_host.to(q.device)
        problem = checked.problem(
            **local, seq_len=T_r, num_seqs=len(plan.seqs) if varlen else int(q.shape[0]),
            max_seqlen=max(1, int(lens.max())) if varlen else None,
        )  # fmt: skip
        call = api.pad_call(api.make_call(
            checked, problem, q, k, v, g, beta, initial_state=None, output_final_state=output_final_state,
            output_chunk_states=False, state_layout="kv", cu_host=local_host, cu_dev=local_dev,
        ), problem)  # fmt: skip
    return CpCall(plan=plan, group=group, problem=problem, call=call, target=sel_target, v=v,
                  k_dim=int(q.shape[-1]), initial_state=initial_state, state_layout=state_layout,
                  output_final_state=output_final_state,
                  allow_opt_in=a["allow_opt_in"])  # fmt: skip


def _group(group):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        api._fail("group", "torch.distributed is not initialised (init_process_group first)")
    try:
        return dist.get_rank(group), dist.get_world_size(group)
    except (RuntimeError, ValueError, TypeError) as e:
        api._fail("group", f"not a process group this rank belongs to ({e})")


def _stand_ins(*xs):
    """An empty slice's tensors as one-token ones of the same kind, so that ``_validate`` checks
    every other dimension, dtype, device and gradient flag as for any slice."""
    out = []
    for name, x in zip(("q", "k", "v", "g", "beta"), xs, strict=True):
        if not isinstance(x, torch.Tensor) or x.dim() < 3:
            out.append(x)  # _validate names what is wrong with it
            continue
        if x.shape[1] != 0:
            api._fail(name, f"q holds an empty slice (T=0), {name} has T={x.shape[1]}")
        one = torch.empty((x.shape[0], 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
        out.append(one.requires_grad_(x.requires_grad and x.is_floating_point()))
    return out


def _check_offsets(cp_offsets, rank: int, world: int, T_r: int | None) -> tuple[int, ...]:
    if cp_offsets is None:
        return tuple(r * (T_r or 0) for r in range(world + 1))
    if isinstance(cp_offsets, torch.Tensor):
        if (
            cp_offsets.device.type != "cpu"
            or cp_offsets.dim() != 1
            or cp_offsets.is_floating_point()
        ):
            api._fail("cp_offsets", "expected a 1-d integer CPU tensor or a sequence of ints")
        cp_offsets = cp_offsets.tolist()
    if isinstance(cp_offsets, (str, bytes)) or not hasattr(cp_offsets, "__len__"):
        api._fail("cp_offsets", f"expected world + 1 = {world + 1} ints, got {cp_offsets!r}")
    values = list(cp_offsets)
    if len(values) != world + 1 or not all(
        isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)) for x in values
    ):
        api._fail("cp_offsets", f"expected world + 1 = {world + 1} ints, got {values!r}")
    values = [int(x) for x in values]
    if values[0] != 0 or any(b < a for a, b in zip(values, values[1:], strict=False)):
        api._fail("cp_offsets", f"must start at 0 and be non-decreasing, got {values}")
    if T_r is not None and values[rank + 1] - values[rank] != T_r:
        api._fail("cp_offsets", f"rank {rank}'s slice [{values[rank]}, {values[rank + 1]}) "
                                f"holds {values[rank + 1] - values[rank]} tokens, q has T={T_r}")  # fmt: skip
    return tuple(values)


def run_cp(cp: CpCall, selection):
    """Launch one rank's share: prep, the open pieces' maps, the exchange, the incoming states,
    the scan. ``selection`` is a split selection for ``cp.problem`` (``kda.split``,
    ``gdn.split``: the tiles of either gate kind feed the same scan and map kernels)."""
    plan, call = cp.plan, cp.call
    # on zero-padded copies (prepare_cp) at the kernels' head dims: the composed maps and the
    # incoming states are sized from them, the outputs cut back to the caller's at the end
    spec = padded_spec(selection.spec)
    tile, scan = spec.tile, spec.scan
    HV, K, V = cp.v.shape[2], scan.head_dim_k, scan.head_dim_v
    dev = cp.v.device
    send = torch.zeros((plan.slots, HV, K, K + V), dtype=torch.float32, device=dev)
    tables = tiles = seg_map = None
    if call is not None:
        call, tables = launch.chunk_tables(call, tile.chunk)
        tiles = launch.run_prep(call, tile, tables)
        if scan.segment_chunks:  # the local scan's maps: the open piece's map reuses them
            seg_map = launch.segment_maps(call, tiles, scan, tables[0], len(plan.seqs),
                                          map_last=bool(plan.open))  # fmt: skip
        if plan.open:
            send[: len(plan.open)] = _open_maps(call, plan, tile, scan, tables, tiles, seg_map)
    gathered = _all_gather(send, cp.group)
    starts = _incoming(cp, gathered, scan, tile.fp32_dot)
    Kc, Vc = cp.k_dim, cp.v.shape[3]  # the caller's
    if call is None:
        o, ht = cp.v.new_empty(cp.v.shape), starts
    else:
        o, ht, _ = launch.run_scan(attrs.evolve(call, initial_state=starts), tile, scan, tables,
                                   tiles, seg_map)  # fmt: skip
        o = o if Vc == V else o[..., :Vc].contiguous()
    if not cp.output_final_state:
        return o, None
    ht = ht[list(plan.owned)][..., :Kc, :Vc]
    return o, (ht.transpose(-1, -2) if cp.state_layout == "vk" else ht).contiguous()


def _open_maps(call, plan: CpPlan, tile, scan, tables, tiles, seg_map):
    """The affine maps [M | N] of the open pieces (the last ones), ``[open, HV, K, K + V]``."""
    HV, K, V = call.v.shape[2], call.k.shape[-1], call.v.shape[-1]
    first, n_open = plan.open[0], len(plan.open)
    seq_chunk = tables[0]
    if seg_map is None:  # no local segments: map the open pieces alone, in segments of ours
        scan = attrs.evolve(scan, segment_chunks=MAP_SEGMENT_CHUNKS)
        if plan.varlen:  # the tables from the first open piece on (chunks stay absolute)
            sub = attrs.evolve(call, cu_seqlens=call.cu_seqlens[first:])
            seg_map = launch.segment_maps(sub, tiles, scan, seq_chunk[first:], n_open, True)
        else:
            seg_map = launch.segment_maps(call, tiles, scan, None, n_open, True)
    else:
        seg_map = seg_map[first:]
    seg, C = scan.segment_chunks, tile.chunk
    lens = np.diff(plan.local_cu)[first:] if plan.varlen else [call.q.shape[1]] * n_open
    chunks = [-(-int(n) // C) for n in lens]
    n_segs = [-(-c // seg) for c in chunks]
    # Compose each piece's segment maps with the combine kernel, on the augmented state
    # X = [M | N] ([K, K + V], from [I | 0]): X <- M_s X + [0 | N_s], so its map rows are
    # [M_s | 0 | N_s]. It stores the state before each segment; one more (zero) segment per
    # piece makes it store the state after the last, the piece's map.
    nseg = seg_map.shape[1]
    aug = torch.zeros((n_open, nseg + 1, HV, K, 2 * K + V), dtype=torch.float32,
                      device=seg_map.device)  # fmt: skip
    written = (torch.arange(nseg)[None, :] < torch.tensor(n_segs)[:, None]).to(seg_map.device)
    mapped = torch.where(written[:, :, None, None, None], seg_map, 0.0)  # unwritten: zero
    aug[:, :nseg, ..., :K] = mapped[..., :K]
    aug[:, :nseg, ..., 2 * K :] = mapped[..., K:]
    x0 = torch.zeros((n_open, HV, K, K + V), dtype=torch.float32, device=seg_map.device)
    x0[..., :K] = torch.eye(K, device=seg_map.device)
    maps = _combine(aug, x0, [c + seg for c in chunks], attrs.evolve(scan, head_dim_v=K + V),
                    seg, tile.fp32_dot, call.q.shape[1])  # fmt: skip
    return maps[torch.arange(n_open), torch.tensor(n_segs)]


def _combine(seg_map, h0, chunks, scan, seg: int, fp32_dot: str, T: int):
    """The segment-combine kernel over ``seg_map`` [n, NSEG, HV, K, K + V'] (V' =
    ``scan.head_dim_v``) from ``h0`` (None: zeros), piece i having ``chunks[i]`` chunks in
    segments of ``seg``: returns the start states [n, NSEG, HV, K, V'] fp32."""
    n, nseg, HV, K = seg_map.shape[:4]
    Vx = scan.head_dim_v
    dev = seg_map.device
    seq_chunk = torch.tensor(np.concatenate([[0], np.cumsum(chunks)]), dtype=torch.int32)
    seq_chunk = seq_chunk.to(dev)
    tokens = torch.zeros(n + 1, dtype=torch.int64, device=dev)  # read by the kernel, not used
    scan = attrs.evolve(scan, segment_chunks=seg, varlen=True, initial_state=h0 is not None)
    starts = torch.empty((n, nseg, HV, K, Vx), dtype=torch.float32, device=dev)
    launch._launch(
        segment_combine_launch(scan, fp32_dot), (Vx // scan.block_v, n * HV),
        seg_map, starts, h0, seq_chunk, tokens, T=T, HV=HV, NSEG=nseg,
    )  # fmt: skip
    return starts


def _all_gather(send: torch.Tensor, group) -> torch.Tensor:
    """The one collective: every rank's maps, rank after rank."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    out = send.new_empty((world * send.shape[0], *send.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, send, group=group)
    return out.view(world, *send.shape)


def _incoming(cp: CpCall, gathered: torch.Tensor, scan, fp32_dot: str) -> torch.Tensor:
    """Every piece's start state [P, HV, K, V] fp32: a piece that begins here starts from its
    sequence's initial state (or zeros); one that continues from earlier ranks from the chain
    of their maps, in rank order, from that initial state."""
    plan, h0 = cp.plan, cp.initial_state
    HV, K, V = cp.v.shape[2], scan.head_dim_k, scan.head_dim_v  # the kernels' (padded)
    Kc, Vc = cp.k_dim, cp.v.shape[3]  # the caller's: the initial states', zero-padded here
    P = len(plan.seqs)
    starts = torch.zeros((P, HV, K, V), dtype=torch.float32, device=cp.v.device)
    fresh = [p for p in range(P) if not plan.preds[p]]
    cont = [p for p in range(P) if plan.preds[p]]
    if h0 is not None and fresh:
        rows = h0[[plan.seqs[p] for p in fresh]].float()
        starts[fresh, :, :Kc, :Vc] = rows.transpose(-1, -2) if cp.state_layout == "vk" else rows
    if cont:
        # per continuing piece, the earlier ranks' maps then one zero map, so that the
        # combine kernel stores the state after the last of them
        counts = [len(plan.preds[p]) for p in cont]
        nseg = max(counts) + 1
        chain = gathered.new_zeros((len(cont) * nseg, HV, K, K + V))
        src = [r * plan.slots + slot for p in cont for r, slot in plan.preds[p]]
        dst = [i * nseg + j for i, p in enumerate(cont) for j in range(len(plan.preds[p]))]
        chain[dst] = gathered.flatten(0, 1)[src]
        chain = chain.view(len(cont), nseg, HV, K, K + V)
        h0c = None
        if h0 is not None:
            h0c = h0[[plan.seqs[p] for p in cont]]
            tail = (K, V) if cp.state_layout == "kv" else (V, K)
            h0c = api._padded_copy(h0c, (*h0c.shape[:2], *tail))
        x_scan = attrs.evolve(scan, state_layout=cp.state_layout, head_dim_v=V)
        out = _combine(chain, h0c, [c + 1 for c in counts], x_scan, 1, fp32_dot, 1)
        starts[cont] = out[torch.arange(len(cont)), torch.tensor(counts)]
    return starts


# every context parallel entry's: the prefill signature with the group and the slices' offsets
CP_SIGNATURE = api.PREFILL_SIGNATURE.replace(
    parameters=[
        *list(api.PREFILL_SIGNATURE.parameters.values())[:5],
        inspect.Parameter("group", inspect.Parameter.KEYWORD_ONLY),
        inspect.Parameter("cp_offsets", inspect.Parameter.KEYWORD_ONLY, default=None),
        *list(api.PREFILL_SIGNATURE.parameters.values())[5:],
    ]
)
kda_prefill_cp.__signature__ = CP_SIGNATURE
