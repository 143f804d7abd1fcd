"""Timing one implementation: device time (CUDA graph replays, L2 flushed), host overhead, the
peak memory one call allocates, and the budgets that bound them."""

from __future__ import annotations

import contextlib
import datetime
import math
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .cases import (
    BenchCase,
    BenchError,
    Impl,
)

FLUSH_BYTES = 256 * 1024 * 1024  # L2 flush buffer zeroed before every timed replay (as do_bench)


COPY_BYTES = 1024 * 1024 * 1024  # size of the device-to-device copy that measures bandwidth


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


class Timer:
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
                note = f"CUDA graph capture failed ({type(e).__name__}: {first_line(e)})"
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

    timer = Timer(torch, "cuda")
    return timer.time(Impl("probe", fn), min_reps=min_reps, min_ms=min_ms, max_reps=1000)["ms"]


def first_line(e: BaseException) -> str:
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
