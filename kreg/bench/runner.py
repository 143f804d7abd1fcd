"""Running a scenario's cases: warm-up and compilation in worker processes, then per case the
comparison against the references, memory, host overhead and device time of each implementation."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .cases import (
    FLAG_REL_ERR,
    BenchCase,
    Impl,
    Prepared,
    Skip,
    impl_selected,
)
from .timing import (
    DEFAULT_BUDGET,
    QUICK_BUDGET,
    Budget,
    Timer,
    environment,
    first_line,
    host_overhead_us,
    peak_extra_bytes,
    rel_rms,
    require_gpu,
    row_metrics,
)


def run_cases(
    scenario: str,
    cases: Sequence[BenchCase],
    prepare: Callable[[BenchCase, Any, Any], Prepared],
    *,
    target=None,
    impls: Sequence[str] | None = None,
    quick: bool = False,
    progress: bool = True,
    doc: str = "",
    meta: Mapping[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
    device=None,
    workers: int | None = None,
    on_case: Callable[[dict], None] | None = None,
    worker_env: Mapping[str, str] | None = None,
    deadline_s: float | None = None,
    budget: Budget | None = None,
    warm_jobs: Callable[[Sequence[BenchCase]], Sequence[tuple[BenchCase, Sequence[str]]]]
    | None = None,
) -> dict:
    """Measure every case; returns the results dict that :func:`write_results` stores.

    ``device`` defaults to the current CUDA device (another one only for dry runs of the flow).
    ``workers``: processes that first call every case's implementations once, in parallel, to
    fill Triton's on-disk kernel cache (compilation dominates a cold run); None picks
    :func:`default_workers`, 0 compiles in this process as it goes. ``on_case(results)`` is
    called after every case (the CLI saves the JSON so far). ``worker_env``: environment
    variables set in the compiling workers only (e.g. to keep a peer from persisting autotuning
    results measured while the workers share the GPU).
    ``deadline_s``: seconds from the start after which no further case is begun (compiling
    stops at half of it); the cases left are listed in ``results["not_measured"]``. ``budget``:
    repetitions and host-timing calls, instead of the default or quick budget. ``warm_jobs``:
    the family's compile plan, (case, implementation names) that between them launch every
    kernel once (:func:`precompile_named`), instead of calling every case's implementations.
    """
    if target is None:
        target = require_gpu(f"kreg bench {scenario}")
    import torch

    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    budget = budget or (QUICK_BUDGET if quick else DEFAULT_BUDGET)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    t_start = time.perf_counter()
    if workers is None:
        workers = default_workers(len(cases))
    precompile_s = None
    if workers > 0 and cases:
        t0 = time.perf_counter()
        stop = None if deadline_s is None else t_start + deadline_s / 2
        if warm_jobs is not None:
            jobs = [(c, [n for n in names if impl_selected(n, impls)])
                    for c, names in warm_jobs(cases)]  # fmt: skip
            problems = precompile_named([j for j in jobs if j[1]], prepare, target, workers,
                                        device, progress, log, worker_env, stop)  # fmt: skip
        else:
            problems = precompile(cases, prepare, target, impls, workers, device, progress, log,
                                  worker_env, stop)  # fmt: skip
        precompile_s = time.perf_counter() - t0
        log(f"kreg bench: precompiled {len(cases)} cases in {precompile_s:.0f} s with {workers} "
            f"workers" + (f" ({len(problems)} problems, reported per row)" if problems else ""))  # fmt: skip
    timer = Timer(torch, device)
    copy_gbs = timer.copy_bandwidth(device)
    results = {
        "scenario": scenario,
        "key": environment(target),
        "quick": quick,
        "budget": attrs.asdict(budget),
        "copy_gbs": copy_gbs,
        "flag_rel_err": FLAG_REL_ERR,
        "doc": doc,
        "meta": dict(meta or {}),
        "cases": [],
    }
    bar = _progress(len(cases), progress)
    longest = 0.0  # the longest case so far: a case is begun only if one such fits
    try:
        for i, case in enumerate(cases):
            spent = time.perf_counter() - t_start
            if deadline_s is not None and spent + longest > deadline_s:
                results["not_measured"] = [c.name for c in cases[i:]]
                log(f"kreg bench: deadline {deadline_s:.0f} s: {len(cases) - i} cases not "
                    f"measured ({spent:.0f} s spent)")  # fmt: skip
                break
            bar.set_description(case.name)
            results["cases"].append(
                _run_case(case, prepare, target, device, timer, budget, impls, copy_gbs, bar, log)
            )
            results["elapsed_s"] = time.perf_counter() - t_start
            longest = max(longest, results["cases"][-1]["elapsed_s"])
            bar.update(1)
            if not progress:
                log(f"kreg bench: {case.name} done in {results['cases'][-1]['elapsed_s']:.1f} s "
                    f"({results['elapsed_s']:.0f} s so far)")  # fmt: skip
            if on_case is not None:
                on_case(results)
    finally:
        bar.close()
    results["elapsed_s"] = time.perf_counter() - t_start
    results["precompile"] = {"workers": workers, "seconds": precompile_s}
    return results


def default_workers(n_cases: int) -> int:
    """Half the CPU cores, at most 8 and at most one per case."""
    return max(0, min(n_cases, 8, (os.cpu_count() or 2) // 2))


def precompile(cases, prepare, target, patterns, workers: int, device, progress, log,
               env: Mapping[str, str] | None = None, deadline: float | None = None) -> list:  # fmt: skip
    """Call every case's implementations once in ``workers`` spawned processes, so that the
    measuring process finds every kernel in Triton's on-disk cache. Failures here are only
    reported: the measuring process meets (and records) them again."""
    jobs = [(case, _warm_case, (patterns,)) for case in cases]
    return _run_jobs(jobs, prepare, target, workers, device, progress, log, env, deadline)


def precompile_named(jobs: Sequence[tuple[BenchCase, Sequence[str]]], prepare, target,
                     workers: int, device=None, progress: bool = False, log=None,
                     env: Mapping[str, str] | None = None,
                     deadline: float | None = None) -> list:  # fmt: skip
    """As :func:`precompile`, for jobs that each call only the named implementations of a case
    (a family that knows which kernels its cases share warms each kernel once). Jobs still
    pending at ``deadline`` (``time.perf_counter()``) are dropped: the measuring process then
    compiles what it meets."""
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    full = [(case, _warm_named, (tuple(names),)) for case, names in jobs]
    return _run_jobs(full, prepare, target, workers, device, progress, log, env, deadline)


def _run_jobs(jobs, prepare, target, workers, device, progress, log, env, deadline) -> list:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures import TimeoutError as FutureTimeout

    ctx = multiprocessing.get_context("spawn")  # CUDA does not survive fork
    problems: list[str] = []
    bar = _progress(len(jobs), progress)
    bar.set_description("precompile")
    dev = str(device) if device is not None else None
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init,
                               initargs=(dict(env or {}),))  # fmt: skip
    futures = {pool.submit(fn, prepare, case, target, *args, dev): case
               for case, fn, args in jobs}  # fmt: skip
    left = None if deadline is None else max(0.0, deadline - time.perf_counter())
    try:
        for future in as_completed(futures, timeout=left):
            case = futures[future]
            try:
                problems += [f"{case.name}: {p}" for p in future.result()]
            except Exception as e:  # a worker died: the measuring process will compile
                problems.append(f"{case.name}: worker failed: {type(e).__name__}: "
                                f"{first_line(e)}")  # fmt: skip
            bar.update(1)
    except FutureTimeout:
        dropped = sum(f.cancel() for f in futures)
        running = sum(not f.done() for f in futures)
        problems.append(f"deadline: {dropped} compile jobs dropped, {running} stopped")
        # the workers are this process's own children; stop them rather than wait for a job
        # that compiles for another minute (the measuring process compiles what it meets)
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    bar.close()
    for p in problems:
        log(f"kreg bench: precompile: {p}")
    return problems


def _worker_init(env: dict) -> None:
    os.environ.update(env)


def _warm_case(prepare, case, target, patterns, device) -> list[str]:
    """In a worker: prepare one case and call each implementation (and reference) once."""
    return _warm(
        prepare,
        case,
        target,
        device,
        lambda impl, prepared: (
            impl_selected(impl.name, patterns) or impl.name in prepared.references
        ),
    )


def _warm_named(prepare, case, target, names, device) -> list[str]:
    """In a worker: prepare one case and call the implementations named once."""
    return _warm(prepare, case, target, device, lambda impl, prepared: impl.name in names)


def _warm(prepare, case, target, device, wanted) -> list[str]:
    import torch

    dev = torch.device(device) if device else torch.device("cuda", torch.cuda.current_device())
    problems = []
    prepared = prepare(case, target, dev)
    for impl in prepared.impls:
        if not isinstance(impl, Impl) or not wanted(impl, prepared):
            continue
        try:
            impl.run()
            if dev.type == "cuda":
                torch.cuda.synchronize()
        except Exception as e:
            problems.append(f"{impl.name}: {type(e).__name__}: {first_line(e)}")
    del prepared
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return problems


class _NoBar:
    def set_description(self, *_):
        pass

    def set_postfix_str(self, *_):
        pass

    def update(self, *_):
        pass

    def close(self):
        pass


def _progress(n: int, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=n, unit="case", file=sys.stderr, dynamic_ncols=True)


def _run_case(case, prepare, target, device, timer, budget, patterns, copy_gbs, bar, log) -> dict:
    import torch

    t0 = time.perf_counter()
    out: dict = {
        "name": case.name, "params": dict(case.params), "flops": case.flops,
        "bytes": case.bytes, "tokens": case.tokens, "heads": case.heads, "bh": case.bh,
        "tags": list(case.tags), "rows": [], "skipped": [], "notes": [],
    }  # fmt: skip
    prepared = prepare(case, target, device)
    out["notes"] += list(prepared.notes)
    runnable = [i for i in prepared.impls if isinstance(i, Impl)]
    out["skipped"] = [{"impl": s.name, "reason": s.reason} for s in prepared.impls
                      if isinstance(s, Skip) and impl_selected(s.name, patterns)]  # fmt: skip
    timed = [i for i in runnable if impl_selected(i.name, patterns)]
    # references run (untimed) even when filtered out: every timed row is checked
    refs = [i for i in runnable if i.name in prepared.references]
    warm = timed + [r for r in refs if r not in timed]

    # 1. warm-up (compile, autotune) and outputs
    outputs: dict[str, Mapping[str, Any]] = {}
    failed: dict[str, str] = {}
    warmup_s: dict[str, float] = {}
    for impl in warm:
        bar.set_postfix_str(f"{impl.name}: warm-up")
        try:
            t_first = time.perf_counter()
            impl.run()
            torch.cuda.synchronize()
            warmup_s[impl.name] = time.perf_counter() - t_first
            ret = impl.run()
            torch.cuda.synchronize()
            outputs[impl.name] = dict(prepared.outputs(ret))
        except Exception as e:
            failed[impl.name] = f"{type(e).__name__}: {first_line(e)}"
            log(f"kreg bench: {case.name}: {impl.name} failed: {failed[impl.name]}")
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
    errors = {name: _compare(outs, outputs, prepared.references, name)
              for name, outs in outputs.items()}  # fmt: skip
    del outputs
    _release(torch)

    # 2-4. memory, host overhead and device time per implementation
    for impl in timed:
        row: dict = {"impl": impl.name, "info": dict(impl.info),
                     "first_call_s": warmup_s.get(impl.name)}  # fmt: skip
        if impl.name in failed:
            row["error"] = failed[impl.name]
            out["rows"].append(row)
            continue
        bar.set_postfix_str(impl.name)
        try:
            row["peak_extra_bytes"] = peak_extra_bytes(torch, impl.run)
            host = host_overhead_us(torch, impl.call or impl.run, budget.host_calls,
                                    budget.host_budget_s)  # fmt: skip
            row["host_us"], row["host_calls"] = host["us"], host["calls"]
            row.update(timer.time(impl, min_reps=budget.min_reps, min_ms=budget.min_ms,
                                  max_reps=budget.max_reps))  # fmt: skip
            row.update(row_metrics(case, row["ms"], copy_gbs))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {first_line(e)}"
            log(f"kreg bench: {case.name}: {impl.name} failed: {row['error']}")
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
        row["rel_err"] = errors.get(impl.name, {})
        row["flagged"] = any(not (v <= FLAG_REL_ERR) for ref in row["rel_err"].values()
                             for v in ref.values())  # fmt: skip
        out["rows"].append(row)
        _release(torch)

    peer = prepared.peer
    ms = {r["impl"]: r["ms"] for r in out["rows"] if r.get("ms")}
    peer_of = {i.name: i.peer or peer for i in timed}
    pair_peers = {p.peer for p in prepared.pairs}
    for r in out["rows"]:
        # a peer row of a pair is the measure of the others, not measured against one
        row_peer = None if r["impl"] in pair_peers else peer_of.get(r["impl"])
        r["peer"] = row_peer
        peer_ms = ms.get(row_peer) if row_peer else None
        r["vs_peer"] = peer_ms / r["ms"] if peer_ms and r.get("ms") else None
    out["peer"] = peer
    out["references"] = list(prepared.references)
    out["pairs"] = [attrs.asdict(p) for p in prepared.pairs]
    out["elapsed_s"] = time.perf_counter() - t0
    del prepared, runnable, timed, refs, warm
    _release(torch)
    return out


def _compare(outs: Mapping[str, Any], outputs: Mapping, references: Sequence[str], name: str):
    """{reference: {output name: rel RMS}} for every reference that ran (not itself). A
    reference output that is not finite judges nothing (a peer that does not serve the inputs,
    e.g. fla's default on -inf gates): its own row is flagged against the other reference."""
    import torch

    res: dict[str, dict[str, float]] = {}
    for ref in references:
        if ref == name or ref not in outputs:
            continue
        errs = {}
        for key, t in outs.items():
            other = outputs[ref].get(key)
            if t is None or other is None or not bool(torch.isfinite(other).all()):
                continue
            if not bool(torch.isfinite(t).all()):
                errs[key] = math.inf
            else:
                errs[key] = rel_rms(t, other)
        res[ref] = errs
    return res


def _release(torch):
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
