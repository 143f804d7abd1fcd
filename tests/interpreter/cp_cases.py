"""Context parallel cases for the interpreter lane: the worker that ``torch.multiprocessing``
spawns (one process per rank, gloo, the interpreter kernels) and the parent's assembly. A case
is either family's (``Case.family``: KDA's per-channel gate or GDN's scalar one); ``entries``
gives the family's single-process and context parallel entries.

A separate module (no ``test_`` prefix): the spawned children import it to find ``worker``.
The children inherit ``TRITON_INTERPRET=1`` from the lane's environment before any import.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

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
    family: str = "kda"  # "gdn": g [B, T, HV] (channel 0 of the per-channel gates)
    # A_log [HV] and dt_bias (the gate kind's: [HV, K] per-channel, [HV] scalar) for the gate
    # activation, chosen for mild decays (about 0.03 per token under softplus)
    gate_params: bool = False

    @property
    def world(self) -> int:
        return len(self.offsets) - 1

    @property
    def T(self) -> int:
        return self.offsets[-1]

    @property
    def n_seqs(self) -> int:
        return self.B if self.cu is None else len(self.cu) - 1

    @property
    def one_rank(self) -> bool:
        """One rank holds every token: the result is the single process's bit for bit."""
        return sum(b > a for a, b in zip(self.offsets, self.offsets[1:], strict=False)) == 1

    @property
    def cuts(self) -> bool:
        """A slice boundary falls inside a sequence: states are carried between ranks."""
        inner = self.offsets[1:-1]
        if self.cu is None:
            return any(0 < b < self.T for b in inner)
        return any(s < b < e for b in inner for s, e in zip(self.cu, self.cu[1:], strict=False))


class Entries(NamedTuple):
    prefill: object  # the single-process entry (kda_prefill, gdn_prefill)
    prefill_cp: object  # the context parallel one (kda_prefill_cp, gdn_prefill_cp)
    cp: object  # its CpEntry (prepare_cp's ``entry``)
    gate: str  # the gate kind (api._prepare's ``gate``)


def entries(family: str) -> Entries:
    if family == "gdn":
        from kreg.families.gdn.api import gdn_prefill as prefill
        from kreg.families.gdn.context_parallel import GDN as cp
        from kreg.families.gdn.context_parallel import gdn_prefill_cp as prefill_cp
    else:
        assert family == "kda", family
        from kreg.families.kda.api import kda_prefill as prefill
        from kreg.families.kda.context_parallel import KDA as cp
        from kreg.families.kda.context_parallel import kda_prefill_cp as prefill_cp
    return Entries(prefill, prefill_cp, cp, cp.gate)


def inputs(case: Case):
    """The whole batch's inputs (every rank makes the same ones) and keyword arguments."""
    from test_kda_numerics import make, state

    x = make(B=case.B, T=case.T, H=case.H, HV=case.HV, K=case.K, V=case.V, dtype=case.dtype,
             lb=case.lb, seed=case.seed)  # fmt: skip
    if entries(case.family).gate == "scalar":
        x["g"] = x["g"][..., 0].contiguous()
    kw = dict(case.options, output_final_state=True, state_layout=case.layout)
    if case.gate_params:
        gen = torch.Generator().manual_seed(case.seed + 2)
        per_channel = x["g"].dim() == 4
        kw["A_log"] = -1.5 + 0.5 * torch.randn(case.HV, generator=gen)
        bias = (case.HV, case.K) if per_channel else (case.HV,)
        kw["dt_bias"] = -2.0 + 0.5 * torch.randn(bias, generator=gen)
    if case.cu is not None:
        kw["cu_seqlens"] = torch.tensor(case.cu)
    if case.h0 is not None:
        h0 = state(case.n_seqs, case.HV, case.K, case.V, seed=case.seed + 1)
        if case.layout == "vk":
            h0 = h0.transpose(-1, -2).contiguous()
        kw["initial_state"] = h0.to(case.h0)
    return x, kw


def pinned(problem, chunk_seg, family: str = "kda"):
    """The ``kda.split`` (``family``'s split) selection for ``problem``, its chunk and segments
    pinned (or as selected for None), checked valid."""
    from kreg.dispatch import select

    sel = select(problem, "sm90", family=family, algorithm=f"{family}.split")
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
    cp = prepare_cp(**local, group=group, cp_offsets=case.offsets, **cp_options(kw),
                    entry=entries(case.family).cp)  # fmt: skip
    spec = None if case.specs is None else case.specs[rank]
    return run_cp(cp, pinned(cp.problem, spec, case.family))


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
