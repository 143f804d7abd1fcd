"""Context parallel cases for the interpreter lane: the worker that ``torch.multiprocessing``
spawns (one process per rank, gloo, the interpreter kernels) and the parent's assembly.

A separate module (no ``test_`` prefix): the spawned children import it to find ``worker``.
The children inherit ``TRITON_INTERPRET=1`` from the lane's environment before any import.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import torch

FP16, FP32 = torch.float16, torch.float32


@attrs.frozen
class Case:
    name: str
    offsets: tuple[int, ...]  # the ranks' slices
    cu: tuple[int, ...] | None = None  # packed sequence offsets; None: a fixed batch of B rows
    B: int = 1
    H: int = 1
    HV: int = 1
    K: int = 32
    V: int = 32
    dtype: torch.dtype = FP16
    lb: float = -0.1  # gates in [lb, 0]: mild decay, so a rank's incoming state matters
    h0: torch.dtype | None = FP32  # the initial states' dtype, None for none
    layout: str = "kv"
    # per rank: the pinned (chunk, segment_chunks), or None for what the dispatcher selects
    specs: tuple[tuple[int, int] | None, ...] | None = None
    options: tuple[tuple[str, object], ...] = ()  # further kda_prefill options
    repeat: bool = False  # run twice per rank: bitwise equal run to run
    seed: int = 0

    @property
    def world(self) -> int:
        return len(self.offsets) - 1

    @property
    def T(self) -> int:
        return self.offsets[-1]

    @property
    def n_seqs(self) -> int:
        return self.B if self.cu is None else len(self.cu) - 1


def inputs(case: Case):
    """The whole batch's inputs (every rank makes the same ones) and keyword arguments."""
    from test_kda_numerics import make, state

    x = make(B=case.B, T=case.T, H=case.H, HV=case.HV, K=case.K, V=case.V, dtype=case.dtype,
             lb=case.lb, seed=case.seed)  # fmt: skip
    kw = dict(case.options, output_final_state=True, state_layout=case.layout)
    if case.cu is not None:
        kw["cu_seqlens"] = torch.tensor(case.cu)
    if case.h0 is not None:
        h0 = state(case.n_seqs, case.HV, case.K, case.V, seed=case.seed + 1)
        if case.layout == "vk":
            h0 = h0.transpose(-1, -2).contiguous()
        kw["initial_state"] = h0.to(case.h0)
    return x, kw


def pinned(problem, chunk_seg):
    """The ``kda.split`` selection for ``problem``, its chunk and segments pinned (or as
    selected for None), checked valid."""
    from kreg.dispatch import select

    sel = select(problem, "sm90", algorithm="kda.split")
    if chunk_seg is None:
        return sel
    chunk, seg = chunk_seg
    tile = attrs.evolve(sel.spec.tile, chunk=chunk, solve_block=16)
    # one pipeline stage: it only schedules loads, and the selected depth may not fit the chunk
    scan = attrs.evolve(sel.spec.scan, chunk=chunk, segment_chunks=seg, num_stages=1)
    spec = attrs.evolve(sel.spec, tile=tile, scan=scan)
    verdict = sel.candidate.is_valid(spec, sel.target, problem)
    assert verdict.ok, verdict.reasons
    return attrs.evolve(sel, spec=spec)


def cp_options(kw: dict) -> dict:
    """Every option ``prepare_cp`` takes besides the tensors, group and offsets: ``kw`` over
    ``kda_prefill_cp``'s defaults."""
    import inspect

    from kreg.families.kda.context_parallel import kda_prefill_cp

    skip = ("group", "cp_offsets", "allow_opt_in")
    sig = inspect.signature(kda_prefill_cp).parameters.items()
    base = {n: p.default for n, p in sig if p.kind is p.KEYWORD_ONLY and n not in skip}
    return {**base, **kw}


def run_rank(case: Case, rank: int, group):
    """This rank's ``(o, final states)`` of ``case``."""
    from kreg.families.kda.context_parallel import prepare_cp, run_cp

    x, kw = inputs(case)
    a, b = case.offsets[rank], case.offsets[rank + 1]
    local = {n: t[:, a:b].contiguous() for n, t in x.items()}
    cp = prepare_cp(**local, group=group, cp_offsets=case.offsets, **cp_options(kw))
    spec = None if case.specs is None else case.specs[rank]
    return run_cp(cp, pinned(cp.problem, spec))


def worker(rank: int, world: int, store: str, out: str, cases: list[Case]):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        for case in cases:
            with torch.no_grad():
                runs = [run_rank(case, rank, dist.group.WORLD)]
                if case.repeat:
                    runs.append(run_rank(case, rank, dist.group.WORLD))
            torch.save(runs, Path(out) / f"{case.name}.{rank}.pt")
    finally:
        dist.destroy_process_group()


def spawn(cases: list[Case], tmp: Path) -> dict[str, list]:
    """Run ``cases`` (all of one world size) in one spawn; returns case name -> per rank
    runs."""
    import torch.multiprocessing as mp

    world = cases[0].world
    assert all(c.world == world for c in cases)
    assert os.environ.get("TRITON_INTERPRET") == "1"
    tmp.mkdir(parents=True, exist_ok=True)
    mp.spawn(worker, args=(world, str(tmp / "store"), str(tmp), cases), nprocs=world)
    return {c.name: [torch.load(tmp / f"{c.name}.{r}.pt") for r in range(world)] for c in cases}


def assemble(case: Case, per_rank, run: int = 0):
    """The whole batch's outputs and final states from each rank's share."""
    from kreg.families.kda.context_parallel import plan_cp

    o = torch.cat([runs[run][0] for runs in per_rank], dim=1)
    ht = None
    for rank, runs in enumerate(per_rank):
        part = runs[run][1]
        plan = plan_cp(case.offsets, rank, cu_seqlens=case.cu, batch=case.B)
        assert part.shape[0] == len(plan.owned_seqs)
        if ht is None:
            ht = part.new_full((case.n_seqs, *part.shape[1:]), float("nan"))
        ht[list(plan.owned_seqs)] = part
    return o, ht
