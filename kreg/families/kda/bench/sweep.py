"""The spec sweep over the KDA grid (``python benchmarks/kda_grid.py sweep``): per grid shape, the
device time of every spec of its pool (:func:`kreg.families.kda.model.pool`: every role that resolves)
and of the dispatcher's current choice, then fla-core's calls with the same promise, in one
process on one GPU; written to a JSON file after every shape, so a run cut by its deadline keeps
what it measured.

Order: kernels are compiled first, each once (:func:`compile_jobs`: every kreg kernel on the
smallest shape that launches it, every fla autotuning class once), in worker processes, for at
most half the deadline; then the kreg specs of every shape (round robin over head
configurations); then the fla rows, shape by shape, as long as the deadline leaves time (fla
autotunes once per class, about 10 s each, on the idle GPU). Timing: kreg.bench's CUDA-graph
replays with the L2 flushed, medians (quick: at least 10 replays and 40 ms). Each spec's output
is compared with the current choice's (relative RMS of o and the final state); a spec above
1e-2 is flagged and never fitted.

The JSON (``SWEEP_KIND``): the run's key (device, date, Triton, torch), fla's version, and per
shape its params (the bench's, with split and gate), the problem, and per spec its roles, its
tuning fields, ms, replays and error; ``complete`` is false until both phases ran through.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import attrs

from .. import builders, model
from . import grid

SWEEP_KIND = "kda-spec-sweep"
SWEEP_VERSION = 1
CURRENT = "current"  # the label of the dispatcher's choice when no role names it
TUNING_FIELDS = {
    "tile": ("chunk", "solve_block", "num_warps", "fp32_dot"),
    "scan": ("chunk", "block_v", "num_warps", "num_stages", "segment_chunks"),
}
FLAG_REL_ERR = 1e-2
FLA_MARGIN_S = 20.0  # fla's first call of an autotuning class takes ~10 s on the H200
# ... and a few minutes more where the workers did not compile its configs in time
FLA_MARGIN_UNCOMPILED_S = 150.0


def spec_fields(spec) -> dict:
    return {part: {f: getattr(getattr(spec, part), f) for f in fields}
            for part, fields in TUNING_FIELDS.items()}  # fmt: skip


def spec_label(spec) -> str:
    t, s = spec.tile, spec.scan
    return (f"c{t.chunk}.sb{t.solve_block}.tw{t.num_warps}|bv{s.block_v}.w{s.num_warps}"
            f".s{s.num_stages}.seg{s.segment_chunks}")  # fmt: skip


@attrs.frozen
class ShapePlan:
    shape: grid.GridShape
    problem: object
    specs: tuple  # ((label, spec, roles), ...): the pool's distinct specs, then the current one
    current: str  # label of the dispatcher's choice
    decided_by: str


def plan_shape(shape: grid.GridShape, target) -> ShapePlan:
    """What the sweep times on ``shape`` (CPU): its pool's specs and the current choice, made
    without any cost model (``$KREG_MODELS`` is set empty for the run)."""
    from ..selection import select_kda

    problem = grid.problem_of(shape)
    by_spec: dict = {}
    for role, spec in model.pool(problem, target):
        by_spec.setdefault(spec, []).append(role)
    sel = select_kda(problem, target, algorithm="split")  # the split path's, not decode's
    by_spec.setdefault(sel.spec, [])
    specs = tuple((spec_label(s), s, tuple(roles)) for s, roles in by_spec.items())
    return ShapePlan(shape, problem, specs, spec_label(sel.spec), sel.decided_by)


def fla_rows(shape: grid.GridShape) -> tuple[str, ...]:
    """fla's calls with the promises the shape's gate regime admits."""
    from .scenario import PEER, SAFE_PEER

    return tuple(SAFE_PEER if pair == "bounded" else PEER for pair in grid.pairs(shape))


def compile_jobs(plans, spec_chunk: int = 4) -> list[tuple]:
    """(case, implementation names) that between them launch every kreg kernel once, on the
    smallest shape launching it, in jobs of at most ``spec_chunk`` specs sharing a prep chunk; and
    one job per fla class. kreg's jobs go first (the fit needs them; fla's, which compile every
    autotuning config, are what a compile deadline cuts), the largest first."""
    seen: set = set()
    kreg_jobs: list = []
    fla_jobs: list = []
    for p in sorted(plans, key=lambda p: p.shape.work):
        case = sweep_case(p.shape)
        by_chunk: dict[int, list[str]] = {}
        for label, spec, _ in p.specs:
            keys = builders.kernel_keys(p.problem, spec)
            if not keys <= seen:
                seen |= keys
                by_chunk.setdefault(spec.tile.chunk, []).append(label)
        for labels in by_chunk.values():
            for i in range(0, len(labels), spec_chunk):
                kreg_jobs.append((case, labels[i : i + spec_chunk]))
        for row in fla_rows(p.shape):
            key = ("fla",) + grid.fla_class(p.shape, safe_gate=row.endswith("safe_gate"))
            if key not in seen:
                seen.add(key)
                fla_jobs.append((case, [row]))
    kreg_jobs.sort(key=lambda j: -len(j[1]))
    return kreg_jobs + fla_jobs


def sweep_case(shape: grid.GridShape):
    from kreg.bench import BenchCase

    return BenchCase(name=shape.name, params=grid.params_of(shape), flops=0.0, bytes=0.0,
                     tokens=shape.tokens, heads=shape.HV, bh=shape.num_seqs * shape.HV)  # fmt: skip


def prepare(case, target, device):
    """kreg.bench's Prepared for one grid shape: an Impl per spec label, and the fla rows."""
    import torch

    from kreg.bench import Impl, Prepared, Skip

    from ..api import _prepare, run_selection
    from ..selection import select_kda
    from .scenario import _seed, fla_kwargs, kreg_kwargs, load_fla, make_inputs

    shape = grid.shape_named(case.name)
    plan = plan_shape(shape, target)
    params = case.params
    x = make_inputs(params, device, _seed(case.name))
    kw = kreg_kwargs(params, x, bounded=shape.gate == "bounded")
    problem, call = _prepare(**kw, state_layout="kv", output_chunk_states=False)
    if problem != plan.problem:
        raise RuntimeError(f"{case.name}: the call's problem {problem!r} is not the planned one")
    sel = select_kda(problem, target)
    impls: list = []
    for label, spec, roles in plan.specs:
        s = attrs.evolve(sel, spec=spec)
        impls.append(Impl(label, run=lambda s=s: run_selection(s, call, problem),
                          info={"roles": list(roles), "spec": spec_fields(spec)}))  # fmt: skip
    chunk_kda, version = load_fla()
    for row in fla_rows(shape):
        if chunk_kda is None:
            impls.append(Skip(row, version))
            continue
        fkw = fla_kwargs(params, x, "bounded" if row.endswith("safe_gate") else "default")

        def run_fla(fkw=fkw):
            with torch.inference_mode():
                return chunk_kda(**fkw)

        impls.append(Impl(row, run=run_fla, info={"version": version}))
    return Prepared(impls=impls, outputs=lambda r: {"o": r[0], "state": r[1]},
                    references=(plan.current,))  # fmt: skip


# --- the run (GPU) ---------------------------------------------------------------------------


def _cache_dir() -> Path:
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except Exception:
        return Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))


def save_autotune(dest: Path) -> int:
    """Copy Triton's on-disk autotuning results (fla's choices, made on the idle GPU) to
    ``dest`` in the cache's layout, so a later call on a fresh machine can copy them back into
    its cache and skip retuning; returns the count."""
    src = _cache_dir()
    n = 0
    for f in src.glob("*/*.autotune.json"):
        to = dest / f.parent.name / f.name
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, to)
        n += 1
    return n


def _write(results: dict, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
    tmp.replace(path)


def _time_impl(torch, timer, impl, reference_out, budget) -> dict:
    from kreg.bench import first_line, rel_rms

    row: dict = {"impl": impl.name, **dict(impl.info)}
    try:
        t0 = time.perf_counter()
        impl.run()
        torch.cuda.synchronize()
        row["first_call_s"] = time.perf_counter() - t0
        out = impl.run()
        torch.cuda.synchronize()
        if reference_out is not None:
            errs = {}
            for i, key in enumerate(("o", "state")):
                a, b = out[i], reference_out[i]
                if a is not None and b is not None:
                    finite = bool(torch.isfinite(a).all())
                    errs[key] = rel_rms(a, b) if finite else float("inf")
            row["rel_err"] = errs
            row["flagged"] = any(not (v <= FLAG_REL_ERR) for v in errs.values())
        del out
        row.update(timer.time(impl, min_reps=budget.min_reps, min_ms=budget.min_ms,
                              max_reps=budget.max_reps))  # fmt: skip
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {first_line(e)}"
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
    return row


def run(out_path, *, deadline_s: float = 540.0, quick: bool = True, workers: int | None = None,
        names=None, peer: bool = True, kreg: bool = True, started: float | None = None,
        log=None) -> dict:  # fmt: skip
    """Sweep the grid (or the shapes named) on this GPU; returns and writes the results.
    ``kreg=False`` times fla's rows only (every shape gets an entry without specs): a call of
    its own that autotunes fla on the idle GPU and saves the choices for later calls."""
    import torch
    import triton

    from kreg.bench import DEFAULT_BUDGET, QUICK_BUDGET, Timer, environment, require_gpu
    from kreg.dispatch import clear_cache

    from .scenario import load_fla

    started = time.perf_counter() if started is None else started
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    os.environ["KREG_MODELS"] = os.devnull  # the current choice, made without a cost model
    clear_cache()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    target = require_gpu("the KDA spec sweep")
    budget = QUICK_BUDGET if quick else DEFAULT_BUDGET
    order = [s for s in grid._order(grid.shapes()) if not names or s.name in names]
    plans = [plan_shape(s, target) for s in order]
    chunk_kda, fla_version = load_fla()
    peer = peer and chunk_kda is not None
    workers = workers if workers is not None else max(1, min(14, (os.cpu_count() or 2) - 2))
    results = {
        "kind": SWEEP_KIND, "version": SWEEP_VERSION, "key": environment(target),
        "fla": fla_version, "quick": quick, "budget": attrs.asdict(budget),
        "deadline_s": deadline_s, "roles": [r.name for r in model.ROLES],
        "grid_seed": grid.SEED, "complete": False, "shapes": [],
    }  # fmt: skip
    jobs = compile_jobs(plans)
    if not peer:
        jobs = [j for j in jobs if not j[1][0].startswith("fla")]
    if not kreg:
        jobs = [j for j in jobs if j[1][0].startswith("fla")]
    t0 = time.perf_counter()
    env = {"FLA_CACHE_RESULTS": "0", "KREG_MODELS": os.devnull}
    problems = []
    if workers > 0 and jobs:
        from kreg.bench import precompile_named

        problems = precompile_named(jobs, prepare, target, workers, progress=False, log=log,
                                    env=env, deadline=started + deadline_s / 2)  # fmt: skip
    results["precompile"] = {"workers": workers, "jobs": len(jobs),
                             "seconds": time.perf_counter() - t0, "problems": problems}  # fmt: skip
    log(f"kda sweep: compiled {len(jobs)} jobs in {time.perf_counter() - t0:.0f} s")
    timer = Timer(torch, torch.device("cuda", torch.cuda.current_device()))
    device = torch.device("cuda", torch.cuda.current_device())
    by_name: dict[str, dict] = {}

    def left() -> float:
        return deadline_s - (time.perf_counter() - started)

    slowest = 0.0
    for p in plans if kreg else ():  # phase 1: kreg's specs
        if left() < slowest * 1.5 + 5:
            results["stopped"] = f"deadline before kreg specs of {p.shape.name}"
            break
        t1 = time.perf_counter()
        prepared = prepare(sweep_case(p.shape), target, device)
        ref_out = None
        rows = []
        kreg_impls = [i for i in prepared.impls if i.name not in fla_rows(p.shape)]
        for impl in sorted(kreg_impls, key=lambda i: i.name != p.current):
            row = _time_impl(torch, timer, impl, ref_out, budget)
            if impl.name == p.current and "error" not in row:
                ref_out = impl.run()
                torch.cuda.synchronize()
            row["current"] = impl.name == p.current
            rows.append(row)
        entry = {"name": p.shape.name, "params": grid.params_of(p.shape),
                 "problem": attrs.asdict(p.problem), "current": p.current,
                 "decided_by": p.decided_by, "specs": rows, "fla": {},
                 "elapsed_s": time.perf_counter() - t1}  # fmt: skip
        results["shapes"].append(entry)
        by_name[p.shape.name] = entry
        del prepared, ref_out, kreg_impls
        torch.cuda.empty_cache()
        slowest = max(slowest, entry["elapsed_s"])
        results["elapsed_s"] = time.perf_counter() - started
        _write(results, out_path)
        timed = [r for r in rows if r.get("ms")]
        best = min(timed, key=lambda r: r["ms"]) if timed else {"impl": "-", "ms": float("nan")}
        log(f"kda sweep: {p.shape.name}: {len(timed)}/{len(rows)} specs in "
            f"{entry['elapsed_s']:.1f} s, best {best['impl']} {best['ms']:.3f} ms "
            f"({results['elapsed_s']:.0f} s so far)")  # fmt: skip
    else:
        results["phase1_complete"] = True
    for p in plans if peer else ():  # phase 2: fla with the same promise
        entry = by_name.get(p.shape.name)
        if entry is None and kreg:
            break
        if entry is None:
            entry = {"name": p.shape.name, "params": grid.params_of(p.shape),
                     "problem": attrs.asdict(p.problem), "current": p.current,
                     "decided_by": p.decided_by, "specs": [], "fla": {}}  # fmt: skip
            results["shapes"].append(entry)
        cut = any(str(x).startswith("deadline") for x in problems)
        if left() < (FLA_MARGIN_UNCOMPILED_S if cut else FLA_MARGIN_S):
            results["stopped"] = f"deadline before fla on {p.shape.name}"
            break
        prepared = prepare(sweep_case(p.shape), target, device)
        for impl in prepared.impls:
            if impl.name in fla_rows(p.shape) and hasattr(impl, "run"):
                entry["fla"][impl.name] = _time_impl(torch, timer, impl, None, budget)
        del prepared
        torch.cuda.empty_cache()
        results["elapsed_s"] = time.perf_counter() - started
        results["autotune_saved"] = save_autotune(out_path.parent / "triton_autotune")
        _write(results, out_path)
        log(f"kda sweep: {p.shape.name}: " + ", ".join(
            f"{k} {v.get('ms', float('nan')):.3f} ms" for k, v in entry["fla"].items())
            + f" ({results['elapsed_s']:.0f} s so far)")  # fmt: skip
    else:
        results["complete"] = results.get("phase1_complete", False) or not kreg
    results["elapsed_s"] = time.perf_counter() - started
    results["triton"] = triton.__version__
    results["autotune_saved"] = save_autotune(out_path.parent / "triton_autotune")
    _write(results, out_path)
    log(f"kda sweep: {len(results['shapes'])} of {len(plans)} shapes, complete "
        f"{results['complete']}, {results['elapsed_s']:.0f} s; wrote {out_path}")  # fmt: skip
    return results
