"""The benchmark runner behind ``kreg bench``: generic across families.

A family contributes a :class:`~kreg.registry.model.Scenario` whose ``cases()`` returns
:class:`BenchCase` values (cheap, no GPU) and whose ``run(cases, **options)`` calls
:func:`run_cases` with a ``prepare(case, target, device)`` function. ``prepare`` makes the inputs
of one case on the device and returns a :class:`Prepared`: the implementations to time (each a
closure over those inputs, host work done up front), how to read named outputs from a return
value, which implementations are the references every other one is checked against, and which
one is the peer the speed ratio is taken against: one per case (``Prepared.peer``), or one per
row (``Impl.peer``) when a case times like-with-like pairs (``Prepared.pairs``: a kreg row and
the peer row called with the same promise, each ratio taken within its pair).

Per case the runner (1) calls every implementation twice (compilation, autotuning and
allocator warm-up stay out of every measurement) and compares the named outputs by relative
RMS against each reference, (2) measures the peak device memory one call allocates beyond its
inputs and outputs, (3) the host overhead of one call (wall clock of the Python call, no
synchronisation inside the timed region, median), and (4) the device time: a CUDA graph of one
call replayed with the L2 cache flushed before every replay, median of many replays; an
implementation that cannot be captured falls back to ``triton.testing.do_bench`` (median).
A large device-to-device copy measured in the same run gives the bandwidth that the compulsory
bytes of every row are compared against.

:func:`write_results` writes ``results.json``, ``RESULTS.md`` and the sweep plot;
:func:`render` regenerates the last two from the JSON alone.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

FLAG_REL_ERR = 1e-2  # rows whose relative RMS error against a reference exceeds this are flagged
FLUSH_BYTES = 256 * 1024 * 1024  # L2 flush buffer zeroed before every timed replay (as do_bench)
COPY_BYTES = 1024 * 1024 * 1024  # size of the device-to-device copy that measures bandwidth
PLOT_NAME = "bh_sweep.png"


@attrs.frozen(eq=False)
class BenchCase:
    """One benchmark case: its parameters and the work it represents (no tensors)."""

    name: str
    params: Mapping[str, Any]  # JSON-able; what the family's prepare() reads
    flops: float  # the nominal FLOP count (the family documents its formula)
    bytes: float  # compulsory device-memory bytes: inputs read once, outputs written once
    tokens: int  # total tokens of the case (all sequences)
    heads: int  # heads the per token·head time divides by
    bh: int  # batch (or sequences) x heads: the sweep plot's x axis
    tags: tuple[str, ...] = attrs.field(default=(), converter=tuple)  # "sweep" is plotted
    impls: tuple[str, ...] = attrs.field(default=(), converter=tuple)  # planned, for --list
    description: str = ""


@attrs.frozen(eq=False)
class Impl:
    """One implementation of a case, ready to run on prepared inputs."""

    name: str
    run: Callable[[], Any]  # the device work only; returns the outputs
    call: Callable[[], Any] | None = None  # the public call for host overhead (default: run)
    info: Mapping[str, Any] = attrs.field(factory=dict)  # JSON-able (spec, arguments, ...)
    graph: bool = True  # try CUDA-graph capture for the timing
    peer: str | None = None  # the row this one's ratio is taken against (None: Prepared.peer)


@attrs.frozen
class Skip:
    """An implementation that cannot run here, and why (reported in the results)."""

    name: str
    reason: str


@attrs.frozen
class Pair:
    """A like-with-like pair: a kreg row and the peer row that makes the same promise about
    its inputs; the kreg row's "× peer" is the peer's ms over its ms."""

    label: str  # e.g. "default", "bounded"
    impl: str  # the kreg row
    peer: str  # the peer row
    text: str = ""  # what the two rows call, for the rendered page


@attrs.frozen(eq=False)
class Prepared:
    impls: Sequence[Impl | Skip]
    outputs: Callable[[Any], Mapping[str, Any]]  # named output tensors of a return value
    references: tuple[str, ...] = ()  # impl names the others are compared against
    peer: str | None = None  # impl name of the peer: ratio = peer ms / impl ms
    notes: tuple[str, ...] = ()
    pairs: tuple[Pair, ...] = attrs.field(default=(), converter=tuple)


class ResultsError(ValueError):
    """A file that is not a kreg bench results file (what is wrong, in one line)."""


class BenchError(RuntimeError):
    """The benchmark cannot run here (no GPU, no target): one line for the user."""


# --- selection of cases and implementations -------------------------------------------------


def filter_cases(cases: Sequence[BenchCase], substrings: Sequence[str] | None):
    """The cases whose name contains one of ``substrings`` or that carry one as a tag (a
    family's named selection, e.g. ``kda``'s ``quick``)."""
    if not substrings:
        return list(cases)
    return [c for c in cases if any(s in c.name or s in c.tags for s in substrings)]


def impl_selected(name: str, patterns: Sequence[str] | None) -> bool:
    """An implementation is kept if a pattern equals its name or is a substring of it."""
    return not patterns or any(p == name or p in name for p in patterns)


# --- metrics ------------------------------------------------------------------------------------


def row_metrics(case: BenchCase, ms: float, copy_gbs: float | None) -> dict:
    """Throughput figures of one timed row."""
    s = ms * 1e-3
    gbs = case.bytes / s / 1e9
    return {
        "tflops": case.flops / s / 1e12,
        "gbs": gbs,
        "bw_fraction": gbs / copy_gbs if copy_gbs else None,
        "ns_per_token_head": ms * 1e6 / (case.tokens * case.heads),
    }


def rel_rms(a, b) -> float:
    """||a - b|| / ||b|| over all elements, in fp32 (inf when b is all zeros and a is not)."""
    a = a.float()
    b = b.float()
    num = float((a - b).pow(2).sum().sqrt())
    den = float(b.pow(2).sum().sqrt())
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


# --- device measurements ----------------------------------------------------------------------


class _Timer:
    def __init__(self, torch, device):
        self.torch = torch
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=device)

    def _events(self, n):
        E = self.torch.cuda.Event
        return [E(enable_timing=True) for _ in range(n)], [E(enable_timing=True) for _ in range(n)]

    def _replay(self, launch, reps: int) -> list[float]:
        torch = self.torch
        start, end = self._events(reps)
        torch.cuda.synchronize()
        for i in range(reps):
            self.flush.zero_()
            start[i].record()
            launch()
            end[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(start, end, strict=True)]

    def reps_for(self, est_ms: float, min_reps: int, min_ms: float, max_reps: int) -> int:
        return int(min(max_reps, max(min_reps, math.ceil(min_ms / max(est_ms, 1e-4)))))

    def time(self, impl: Impl, *, min_reps: int, min_ms: float, max_reps: int) -> dict:
        """Median device time of one call: graph replay, or do_bench when capture fails."""
        torch = self.torch
        est = statistics.median(self._replay(impl.run, 3))
        reps = self.reps_for(est, min_reps, min_ms, max_reps)
        note = None
        if impl.graph:
            graph = None
            try:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    impl.run()  # warm-up on the capture stream
                torch.cuda.current_stream().wait_stream(stream)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    impl.run()
                graph.replay()
                torch.cuda.synchronize()
                times = self._replay(graph.replay, reps)
                return {"ms": statistics.median(times), "method": "cuda_graph", "reps": reps,
                        "ms_min": min(times)}  # fmt: skip
            except Exception as e:  # not capturable: fall back to eager timing
                note = f"CUDA graph capture failed ({type(e).__name__}: {_first_line(e)})"
                with contextlib.suppress(Exception):
                    torch.cuda.synchronize()
            finally:
                del graph
        import triton.testing

        ms = triton.testing.do_bench(impl.run, warmup=max(1, int(3 * est)),
                                     rep=max(min_ms, reps * est), return_mode="median")  # fmt: skip
        out = {"ms": float(ms), "method": "do_bench", "reps": reps, "ms_min": None}
        if note:
            out["note"] = note
        return out

    def copy_bandwidth(self, device) -> float:
        """GB/s of a large device-to-device copy_, counting read + write."""
        import triton.testing

        torch = self.torch
        src = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device=device).normal_()
        dst = torch.empty_like(src)
        ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200,
                                     return_mode="median")  # fmt: skip
        return 2 * COPY_BYTES / (ms * 1e-3) / 1e9


def device_ms(fn: Callable[[], Any], *, min_reps: int = 50, min_ms: float = 200.0) -> float:
    """Median device time of ``fn`` (CUDA-graph replay, L2 flushed), for ad-hoc probe scripts."""
    import torch

    timer = _Timer(torch, "cuda")
    return timer.time(Impl("probe", fn), min_reps=min_reps, min_ms=min_ms, max_reps=1000)["ms"]


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""


def _tensors(obj, torch) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x, torch)]
    return []


def _output_bytes(obj, torch) -> int:
    seen: dict[int, int] = {}
    for t in _tensors(obj, torch):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def peak_extra_bytes(torch, fn: Callable[[], Any]) -> int:
    """Peak device memory one call allocates beyond its inputs (already allocated) and outputs."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    extra = peak - base - _output_bytes(out, torch)
    del out
    return max(0, int(extra))


def host_overhead_us(torch, fn: Callable[[], Any], calls: int, budget_s: float) -> dict:
    """Wall clock of the Python call alone (the device is synchronised before, not inside)."""
    times = []
    deadline = time.perf_counter() + budget_s
    for i in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        out = fn()
        t1 = time.perf_counter_ns()
        del out
        times.append((t1 - t0) / 1e3)
        if i >= 9 and time.perf_counter() > deadline:
            break
    torch.cuda.synchronize()
    return {"us": statistics.median(times), "calls": len(times)}


# --- the run ----------------------------------------------------------------------------------


@attrs.frozen
class Budget:
    min_reps: int
    min_ms: float
    max_reps: int
    host_calls: int
    host_budget_s: float


DEFAULT_BUDGET = Budget(min_reps=50, min_ms=200.0, max_reps=1000, host_calls=100, host_budget_s=1.0)
QUICK_BUDGET = Budget(min_reps=10, min_ms=40.0, max_reps=200, host_calls=30, host_budget_s=0.3)


def environment(target) -> dict:
    import torch
    import triton

    dev = torch.cuda.current_device()
    return {
        "target": target.name,
        "device": torch.cuda.get_device_name(dev),
        "triton": triton.__version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda or torch.version.hip,
        "python": platform.python_version(),
        "host": platform.node(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def require_gpu(what: str = "kreg bench"):
    """The detected target, or BenchError with one line saying why there is none."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is a dependency
        raise BenchError(f"{what} needs torch with a GPU: {e}") from e
    if not torch.cuda.is_available():
        raise BenchError(f"{what} needs a GPU (torch.cuda.is_available() is false); "
                         f"`kreg bench --list` shows the cases without one")  # fmt: skip
    from kreg.registry.targets import detect

    target = detect()
    if target is None:
        name = torch.cuda.get_device_name(torch.cuda.current_device())
        raise BenchError(f"{what}: no registered target matches this GPU ({name})")
    return target


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
    timer = _Timer(torch, device)
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
                                f"{_first_line(e)}")  # fmt: skip
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
            problems.append(f"{impl.name}: {type(e).__name__}: {_first_line(e)}")
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
            failed[impl.name] = f"{type(e).__name__}: {_first_line(e)}"
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
            row["error"] = f"{type(e).__name__}: {_first_line(e)}"
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


# --- output: JSON, markdown, plot, summary --------------------------------------------------


def write_json(results: dict, out_dir: str | os.PathLike) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=2, default=_json_default) + "\n")
    tmp.replace(path)
    return path


def write_results(results: dict, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write results.json, RESULTS.md and the sweep plot (when matplotlib is present)."""
    out = Path(out_dir)
    path = write_json(results, out)
    written = {"json": path}
    written.update(render(path, out))
    return written


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return str(x)


def render(json_path: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> dict:
    """Regenerate RESULTS.md (and the plot) from a results JSON."""
    json_path = Path(json_path)
    try:
        results = json.loads(json_path.read_text())
    except json.JSONDecodeError as e:
        raise ResultsError(f"not JSON ({e})") from e
    validate_results(results)
    out = Path(out_dir) if out_dir is not None else json_path.parent
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    plot = out / PLOT_NAME
    plot_ok = plot_sweep(results, plot)
    if plot_ok:
        written["png"] = plot
    md = out / "RESULTS.md"
    md.write_text(markdown(results, plot.name if plot_ok else None))
    written["md"] = md
    return written


def _fmt(x, spec: str, empty: str = "–") -> str:
    if x is None:
        return empty
    if isinstance(x, str):
        return x
    if isinstance(x, float) and not math.isfinite(x):
        return "inf"
    return format(x, spec)


def _err_text(row: dict, ref: str) -> str:
    errs = row.get("rel_err", {}).get(ref)
    if not errs:
        return "–"
    parts = []
    for key, v in errs.items():
        v = float(v) if isinstance(v, str) else v
        mark = " ⚠" if not (v <= FLAG_REL_ERR) else ""
        parts.append(f"{key} {_fmt(v, '.1e')}{mark}")
    return ", ".join(parts)


LEGACY_NOTE = (
    "**Measured before the like-with-like pairing (2026-12-03 audit).** Each case here has one "
    'peer row and every "× peer" is taken against it, whatever promise about the gates each '
    "row made: for `kda`, kreg's rows ran bounded (`gate_lower_bound=-5.0`, the block anchor) "
    "while the `fla` row of the plain cases is fla-core's unbounded default `chunk_kda(...)` "
    "(only the production cases pair bounded with bounded: `safe_gate=True, "
    "lower_bound=-5.0`). Those ratios are not like with like; a rerun of the scenario times "
    "kreg default against fla default and kreg bounded against fla `safe_gate` side by side."
)

TABLE_HEADER = [
    "case", "impl", "ms", "TFLOP/s", "GB/s", "% copy BW", "host µs", "extra MiB",
    "× peer", "peer", "rel err vs ref 1", "rel err vs ref 2", "timing",
]  # fmt: skip
PAIR_HEADER = ["case", "pair", "kreg row", "kreg ms", "peer row", "peer ms", "× peer"]
REGIME = "regime"  # a case param (the gates it fed): a column of the pair table where present


def is_paired(results: dict) -> bool:
    """Whether the results come from the like-with-like runner (cases record their pairs)."""
    cases = results.get("cases") or []
    return any("pairs" in c for c in cases)


def _references(case: dict) -> list[str]:
    refs = case.get("references")
    if refs is None:  # results written before cases recorded them
        refs = ["kreg.split"] + ([case["peer"]] if case.get("peer") else [])
    return list(refs)


def _row_peer(case: dict, row: dict) -> str | None:
    return row["peer"] if "peer" in row else case.get("peer")


def table_rows(results: dict) -> list[list[str]]:
    rows = []
    for case in results.get("cases", []):
        refs = _references(case) + [None, None]
        first = True
        for r in case["rows"]:
            name = case["name"] if first else ""
            first = False
            if "error" in r and "ms" not in r:
                rows.append([name, r["impl"], "failed: " + r["error"]]
                            + [""] * (len(TABLE_HEADER) - 3))  # fmt: skip
                continue
            frac = r.get("bw_fraction")
            ratio = r.get("vs_peer")
            peer = _row_peer(case, r)
            rows.append([
                name, r["impl"] + (" ⚠" if r.get("flagged") else ""), _fmt(r.get("ms"), ".3f"),
                _fmt(r.get("tflops"), ".1f"), _fmt(r.get("gbs"), ".0f"),
                _fmt(None if frac is None else 100 * frac, ".1f"),
                _fmt(r.get("host_us"), ".0f"),
                _fmt(None if r.get("peak_extra_bytes") is None
                     else r["peak_extra_bytes"] / 2**20, ".0f"),
                _fmt(ratio, ".2f"), peer if ratio is not None and peer else "–",
                _err_text(r, refs[0]) if refs[0] else "–",
                _err_text(r, refs[1]) if refs[1] else "–",
                r.get("method", "–"),
            ])  # fmt: skip
    return rows


def _pair_ms(row: dict) -> str:
    """A pair row's ms, marked where it is not a CUDA-graph median (capture failed: events
    around eager calls, host work included; the row's note says why)."""
    ms = _fmt(row.get("ms"), ".3f", "not timed")
    return ms + (" (events)" if row.get("ms") and row.get("method") == "do_bench" else "")


def pair_header(results: dict) -> list[str]:
    return PAIR_HEADER[:1] + [REGIME] * _has_regimes(results) + PAIR_HEADER[1:]


def _has_regimes(results: dict) -> bool:
    return any(REGIME in (c.get("params") or {}) for c in results.get("cases", []))


def pair_rows(results: dict) -> list[list[str]]:
    """One row per case and like-with-like pair: both rows' ms and the ratio within the pair
    (and the case's gate regime, where the cases record one)."""
    regimes = _has_regimes(results)
    rows = []
    for case in results.get("cases", []):
        by = {r["impl"]: r for r in case["rows"]}
        first = True
        for p in case.get("pairs", []):
            a, b = by.get(p["impl"], {}), by.get(p["peer"], {})
            ms_a, ms_b = a.get("ms"), b.get("ms")
            ratio = ms_b / ms_a if ms_a and ms_b else None
            rows.append([
                case["name"] if first else "",
                *([(case.get("params") or {}).get(REGIME, "–") if first else ""] * regimes),
                p["label"],
                p["impl"] + (" ⚠" if a.get("flagged") else ""), _pair_ms(a),
                p["peer"] + (" ⚠" if b.get("flagged") else ""), _pair_ms(b),
                _fmt(ratio, ".2f") + (f" ({p['peer']} / {p['impl']})" if ratio else ""),
            ])  # fmt: skip
            first = False
    return rows


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return out


def markdown(results: dict, plot_name: str | None = None) -> str:
    key = results.get("key", {})
    lines = [results.get("doc", "").rstrip(), ""] if results.get("doc") else []
    lines.append("## Results")
    lines.append("")
    if not results.get("cases"):
        lines += [
            "No results recorded yet: run the command above on a GPU and render its JSON.",
            "",
        ]
        return "\n".join(lines)
    paired = is_paired(results)
    if not paired:
        lines += [LEGACY_NOTE, ""]
    lines.append(
        f"Measured {key.get('date', '?')} on {key.get('device', '?')} (target "
        f"{key.get('target', '?')}), torch {key.get('torch', '?')}, Triton "
        f"{key.get('triton', '?')}, CUDA {key.get('cuda', '?')}"
        + "".join(f", {k} {v}" for k, v in results.get("meta", {}).get("versions", {}).items())
        + (", **quick mode** (fewer repetitions)" if results.get("quick") else "")
        + f". Device-to-device copy bandwidth in this run: "
        f"{_fmt(results.get('copy_gbs'), '.0f')} GB/s (read + write). Whole run: "
        f"{_fmt(results.get('elapsed_s'), '.0f')} s"
        + _precompile_text(results.get("precompile"))
        + "."
    )
    lines.append("")
    if results.get("not_measured"):
        lines += [f"**Deadline reached**: {len(results['not_measured'])} cases not measured "
                  f"({', '.join(results['not_measured'])}).", ""]  # fmt: skip
    if results.get("superseded"):
        lines += ["**Re-measured** (a later run replaced these cases' rows): " + ", ".join(
            f"{s['case']} ({s['measured']} → {s['replaced_by']})" for s in results["superseded"]
        ) + ".", ""]  # fmt: skip
    cases = results["cases"]
    prs = pair_rows(results)
    if prs:
        lines += ["### Like with like", "",
                  "Every ratio is taken within one pair, on the same inputs: the peer row's ms "
                  "over the kreg row's ms (above 1: kreg is faster). The pairs:", ""]  # fmt: skip
        described = [(c["name"], f"**{p['label']}**: `{p['impl']}` against `{p['peer']}`"
                      + (f": {p['text']}" if p.get("text") else ""))
                     for c in cases for p in c.get("pairs", [])]  # fmt: skip
        lines += _grouped(described, len(cases))
        unpaired = [c["name"] for c in cases if not c.get("pairs")]
        if unpaired:
            lines.append(f"- no pair timed: {', '.join(unpaired)}")
        lines.append("")
        lines += _md_table(pair_header(results), prs)
        lines += ["", "### Every row", ""]
    lines += _md_table(TABLE_HEADER, table_rows(results))
    lines.append("")
    lines.append(
        "× peer: the \"peer\" column's ms over the row's ms"
        + (" (the peer of the row's pair; peer rows have none)" if paired else "")
        + ". rel err vs ref 1 / ref 2: against the case's references, "
        + "; ".join(
            f"{', '.join(refs)}" + (f" ({', '.join(names)})" if len(names) < len(cases) else "")
            for refs, names in _refs_by(cases).items()
        )  # fmt: skip
        + "."
    )
    lines.append("")
    lines.append(f"⚠: a relative RMS error above {results.get('flag_rel_err', FLAG_REL_ERR):g} "
                 "against a reference (or a non-finite output).")  # fmt: skip
    lines += _notes(results)
    if plot_name:
        lines += ["", "### Time per token·head against batch × heads", "",
                  f"![time per token·head against B·H]({plot_name})"]  # fmt: skip
    lines.append("")
    return "\n".join(lines)


def _refs_by(cases) -> dict[tuple[str, ...], list[str]]:
    by: dict[tuple[str, ...], list[str]] = {}
    for c in cases:
        by.setdefault(tuple(f"ref {i + 1} = {r}" for i, r in enumerate(_references(c))),
                      []).append(c["name"])  # fmt: skip
    return by


def merge_results(parts: Sequence[dict], supersede: bool = False) -> dict:
    """One results dict from the runs of one scenario's disjoint case subsets (a scenario too
    large for one device call, run in parts on the same machine kind and software): cases in
    the parts' order, ``not_measured`` what no part measured, times summed. Parts of different
    scenarios, devices or software versions are refused: their ratios would not compare.
    ``supersede``: a case in several parts is taken from the last (a re-measurement after a
    change), the replaced runs' dates listed in ``superseded``; otherwise it is refused."""
    if not parts:
        raise ResultsError("nothing to merge")
    parts = [validate_results(p) for p in parts]
    first = parts[0]
    for p in parts[1:]:
        for field in ("scenario", "quick"):
            if p.get(field) != first.get(field):
                raise ResultsError(f"parts differ in {field!r}: {first.get(field)!r} vs "
                                   f"{p.get(field)!r}")  # fmt: skip
        for field in ("target", "device", "triton", "torch", "cuda"):
            if p["key"].get(field) != first["key"].get(field):
                raise ResultsError(f"parts differ in key.{field}: {first['key'].get(field)!r} "
                                   f"vs {p['key'].get(field)!r}")  # fmt: skip
    cases = [c for p in parts for c in p["cases"]]
    names = [c["name"] for c in cases]
    twice = sorted({n for n in names if names.count(n) > 1})
    superseded = []
    if twice and not supersede:
        raise ResultsError(f"cases in more than one part: {twice}")
    if twice:
        last = {c["name"]: i for i, p in enumerate(parts) for c in p["cases"]}
        for i, p in enumerate(parts):
            superseded += [{"case": c["name"], "measured": p["key"].get("date"),
                            "replaced_by": parts[last[c["name"]]]["key"].get("date")}
                           for c in p["cases"] if last[c["name"]] != i]  # fmt: skip
        cases = [c for i, p in enumerate(parts) for c in p["cases"] if last[c["name"]] == i]
        names = [c["name"] for c in cases]
    merged = dict(first, cases=cases)
    merged.pop("superseded", None)
    if superseded:
        merged["superseded"] = superseded
    merged["elapsed_s"] = sum(p.get("elapsed_s") or 0.0 for p in parts)
    merged["parts"] = [{"date": p["key"].get("date"), "elapsed_s": p.get("elapsed_s"),
                        "cases": len(p["cases"]), "precompile": p.get("precompile")}
                       for p in parts]  # fmt: skip
    measured = set(names)
    left = [n for p in parts for n in p.get("not_measured", []) if n not in measured]
    merged.pop("not_measured", None)
    if left:
        merged["not_measured"] = list(dict.fromkeys(left))
    return merged


def validate_results(results: Any) -> dict:
    """``results`` if it has the shape :func:`markdown` reads, else :class:`ResultsError`."""
    if not isinstance(results, dict):
        raise ResultsError(f"expected a JSON object, got {type(results).__name__}")
    if "cases" not in results:
        raise ResultsError(f"no 'cases' (keys: {', '.join(sorted(map(str, results))) or 'none'})")
    cases = results["cases"]
    if not isinstance(cases, list):
        raise ResultsError(f"'cases' must be a list, got {type(cases).__name__}")
    for i, case in enumerate(cases):
        if not isinstance(case, dict):
            raise ResultsError(f"cases[{i}] must be an object, got {type(case).__name__}")
        for field, kind in (("name", str), ("rows", list)):
            if not isinstance(case.get(field), kind):
                raise ResultsError(f"cases[{i}] lacks {field!r} ({kind.__name__})")
        for j, row in enumerate(case["rows"]):
            if not isinstance(row, dict) or not isinstance(row.get("impl"), str):
                raise ResultsError(f"cases[{i}].rows[{j}] must be an object with an 'impl'")
        for field in ("pairs", "skipped", "notes", "tags"):
            if not isinstance(case.get(field, []), list):
                raise ResultsError(f"cases[{i}].{field} must be a list")
        for j, sk in enumerate(case.get("skipped", [])):
            if not isinstance(sk, dict) or not all(isinstance(sk.get(k), str)
                                                   for k in ("impl", "reason")):  # fmt: skip
                raise ResultsError(f"cases[{i}].skipped[{j}] needs 'impl' and 'reason'")
        for j, p in enumerate(case.get("pairs", [])):
            if not isinstance(p, dict) or not all(isinstance(p.get(k), str)
                                                  for k in ("label", "impl", "peer")):  # fmt: skip
                raise ResultsError(f"cases[{i}].pairs[{j}] needs 'label', 'impl' and 'peer'")
    for field in ("key", "meta"):
        if not isinstance(results.get(field, {}), dict):
            raise ResultsError(f"{field!r} must be an object")
    return results


def _precompile_text(pre) -> str:
    if not pre or not pre.get("workers"):
        return ""
    return (
        f" (of which {_fmt(pre.get('seconds'), '.0f')} s compiling in {pre['workers']} processes)"
    )


def _grouped(pairs, n_cases: int) -> list[str]:
    """Lines "- text (cases)", one per distinct text, naming the cases unless it is all."""
    by: dict[str, list[str]] = {}
    for case, text in pairs:
        by.setdefault(text, [])
        if case not in by[text]:
            by[text].append(case)
    return [f"- {text}" + ("" if len(cases) == n_cases else f" ({', '.join(cases)})")
            for text, cases in by.items()]  # fmt: skip


def _notes(results: dict) -> list[str]:
    cases = results["cases"]
    pairs = []
    for case in cases:
        for s in case.get("skipped", []):
            pairs.append((case["name"], f"{s['impl']} skipped: {s['reason']}"))
        for n in case.get("notes", []):
            pairs.append((case["name"], n))
        for r in case["rows"]:
            if r.get("note"):
                pairs.append((case["name"], f"{r['impl']}: {r['note']}"))
    specs = []
    for case in cases:
        for r in case["rows"]:
            spec = r.get("info", {}).get("spec")
            if spec:
                specs.append((case["name"], f"{r['impl']}: {spec}"))
    out = ["", "### Notes", ""] + _grouped(pairs, len(cases)) if pairs else []
    if specs:
        out += ["", "### Specs timed", ""] + _grouped(specs, len(cases))
    return out


def sweep_series(results: dict) -> dict[str, list[tuple[int, float]]]:
    """impl -> [(B·H, ns per token·head)] over the cases tagged "sweep", sorted by B·H."""
    series: dict[str, list[tuple[int, float]]] = {}
    for case in results.get("cases", []):
        if "sweep" not in case.get("tags", []):
            continue
        for r in case["rows"]:
            if r.get("ms") is None:
                continue
            ns = r["ms"] * 1e6 / (case["tokens"] * case["heads"])
            series.setdefault(r["impl"], []).append((case["bh"], ns))
    return {k: sorted(v) for k, v in series.items()}


def plot_sweep(results: dict, path: Path) -> bool:
    series = sweep_series(results)
    if not series:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    peers = {c.get("peer") for c in results.get("cases", [])}
    peers |= {p["peer"] for c in results.get("cases", []) for p in c.get("pairs", [])}
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for name, pts in series.items():
        xs, ys = zip(*pts, strict=True)
        style = "--" if name in peers else "-"
        ax.plot(xs, ys, style, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({x for pts in series.values() for x, _ in pts})
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("batch × heads")
    ax.set_ylabel("ns per token·head")
    key = results.get("key", {})
    ax.set_title(
        f"{results.get('scenario', '')}: {key.get('device', '')} ({key.get('date', '')[:10]})"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def summary(results: dict) -> str:
    """A short text table: ms per case and implementation, and the ratio to the peer."""
    from kreg.text import table

    names: list[str] = []
    for case in results.get("cases", []):
        for r in case["rows"]:
            if r["impl"] not in names:
                names.append(r["impl"])
    rows = []
    for case in results.get("cases", []):
        by = {r["impl"]: r for r in case["rows"]}
        cells = [case["name"]]
        for n in names:
            r = by.get(n)
            if r is None:
                cells.append("")
            elif r.get("ms") is None:
                cells.append("failed")
            else:
                peer = _row_peer(case, r)
                ratio = f" ({r['vs_peer']:.2f}x)" if r.get("vs_peer") and n != peer else ""
                cells.append(f"{r['ms']:.3f}{ratio}{' !' if r.get('flagged') else ''}")
        rows.append(cells)
    head = "ms per call (x = peer ms / impl ms; ! = rel err > "
    head += f"{results.get('flag_rel_err', FLAG_REL_ERR):g})"
    pairs = {(p["label"], p["impl"], p["peer"]) for c in results.get("cases", [])
             for p in c.get("pairs", [])}  # fmt: skip
    if pairs:
        head += "\nratios within like-with-like pairs: " + "; ".join(
            f"{label}: {impl} vs {peer}" for label, impl, peer in sorted(pairs)
        )
    elif results.get("cases"):
        head += "\nmeasured before the like-with-like pairing (2026-12-03 audit): one peer per case"
    return head + "\n" + table(rows, ["case", *names])
