"""Measure the KDA split path's kernels spec by spec on this GPU; write the fastest split spec per
shape bucket as tuning-table entries (``kreg/families/kda/tuning.json`` format) and the raw timings.

    python benchmarks/kda_tune.py [--out DIR] [--shapes B,T,H ...] [--chunks 32 ...]

The prep and scan kernels are separate launches with nothing shared but the tiles, so they are
timed apart: every valid tile spec's prep, and every valid scan spec's scan (with its segment
passes) over the tiles of its chunk. The best split spec of a chunk pairs its fastest prep with
its fastest scan; that pair is then timed whole, as the dispatcher would run it, and its output
checked against the dispatcher's current choice. Kernels are compiled first in parallel worker
processes (filling Triton's cache). Timings are medians of CUDA-graph replays with the L2
flushed (kreg.bench.device_ms); inputs as in the KDA scenario (bf16, K = V = 128, gates bounded
at -5). Writes DIR/tuning_sm90.json (a tuning section) and DIR/tune.json (every timing).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor

import attrs
import torch
import triton

from kreg.bench import device_ms
from kreg.dispatch import select
from kreg.families.kda import api, launch, specs
from kreg.registry import get_registry
from kreg.registry.targets import detect

SHAPES = ((1, 2048, 32), (1, 8192, 32), (4, 8192, 32), (16, 8192, 32), (1, 65536, 4),
          (1, 65536, 32), (1, 8192, 4), (1, 8192, 8), (1, 8192, 16), (2, 8192, 32),
          (8, 8192, 32))  # fmt: skip
# the fields a tuning entry pins; the rest follow from the problem
TUNING_FIELDS = {
    "tile": ("chunk", "solve_block", "num_warps", "fp32_dot"),  # the anchor follows the problem
    "scan": ("chunk", "block_v", "num_warps", "num_stages", "segment_chunks"),
}


def make_call(B, T, H, K=128):
    gen = torch.Generator(device="cuda").manual_seed(B * 1000 + H)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q = torch.nn.functional.normalize(r(B, T, H, K), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(r(B, T, H, K), dim=-1).bfloat16()
    v = r(B, T, H, K).bfloat16()
    g = (-5.0 * torch.sigmoid(r(B, T, H, K) + 1.0)).bfloat16()
    beta = torch.sigmoid(r(B, T, H)).bfloat16()
    return api._prepare(q, k, v, g, beta, None, None, True, -5.0, None, None, None, None, "none",
                        False, False, "kv", False)  # fmt: skip


def spec_fields(spec) -> dict:
    return {part: {f: getattr(getattr(spec, part), f) for f in fields}
            for part, fields in TUNING_FIELDS.items()}  # fmt: skip


def valid_splits(problem, target, chunks) -> list:
    return [s for s in specs.valid_split_specs(target, problem) if s.tile.chunk in chunks]


def _compile(shapes, chunks):
    """Worker: run every valid prep and scan spec once on small calls (one per head count, as
    Triton specialises integer arguments), so the measuring process finds them compiled."""
    target = detect()
    for B, T, H in shapes:
        problem, call = make_call(B, T, H)
        for s in valid_splits(problem, target, chunks):
            api.run_selection(attrs.evolve(select(problem, target=target), spec=s), call, problem)
    torch.cuda.synchronize()
    return True


def precompile(shapes, chunks, workers: int) -> float:
    import multiprocessing

    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")
    # Triton specialises integers divisible by 16 (and equal to 1): one head count of each kind,
    # and 4096 tokens, so every segment length gives several segments. Workers split the work
    # by head count and chunk, compiling disjoint kernels.
    heads = {32 if h % 16 == 0 else 4 for _, _, h in shapes}
    jobs = [([(1, 4096, h)], [c]) for h in sorted(heads) for c in chunks]
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
        list(pool.map(_compile, *zip(*jobs, strict=True)))
    return time.time() - t0


def _best_of_chunk(call, of_chunk, reps, rows, shape) -> tuple[float, object]:
    """Time every prep and every scan of one chunk's specs alone; the fastest pair."""
    tile0 = of_chunk[0].tile
    tables = launch.chunk_tables(call, tile0.chunk)
    tiles = launch.run_prep(call, tile0, tables)
    times = {}
    for kernel, part in (("prep", "tile"), ("scan", "scan")):
        for spec in dict.fromkeys(getattr(s, part) for s in of_chunk):
            if kernel == "prep":
                fn = lambda t=spec: launch.run_prep(call, t, tables)  # noqa: E731
            else:
                fn = lambda s=spec: launch.run_scan(call, tile0, s, tables, tiles)  # noqa: E731
            times[spec] = device_ms(fn, **reps)
            rows.append(dict(shape, kernel=kernel, spec=attrs.asdict(spec), ms=times[spec]))
    pair = min(of_chunk, key=lambda s: times[s.tile] + times[s.scan])
    return times[pair.tile] + times[pair.scan], pair


def tune_shape(B, T, H, target, chunks, reps) -> tuple[list, dict | None]:
    problem, call = make_call(B, T, H)
    base = select(problem, target=target)
    ref, _ = api.run_selection(base, call, problem)
    specs = valid_splits(problem, target, chunks)
    rows, best = [], {}
    for chunk in chunks:
        of_chunk = [s for s in specs if s.tile.chunk == chunk]
        if of_chunk:
            best[chunk] = _best_of_chunk(call, of_chunk, reps, rows, dict(B=B, T=T, H=H))
    if not best:
        return rows, None
    _, spec = min(best.values(), key=lambda b: b[0])
    sel = attrs.evolve(base, spec=spec)
    o, _ = api.run_selection(sel, call, problem)
    err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
    ms = device_ms(lambda: api.run_selection(sel, call, problem), **reps)
    base_ms = device_ms(lambda: api.run_selection(base, call, problem), **reps)
    entry = {"candidate": "kda.split", "bucket": problem.bucket(), "spec": spec_fields(spec),
             "measured": f"B={B} T={T} H={H}: {ms:.3f} ms (prep + scan alone "
                         f"{best[spec.tile.chunk][0]:.3f}) against {base_ms:.3f} ms for the "
                         f"untuned choice; benchmarks/kda_tune.py, "
                         f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}",
             "rel_err_vs_untuned": err}  # fmt: skip
    print(f"B={B} T={T} H={H}: {ms:.3f} ms vs {base_ms:.3f} untuned; {spec_fields(spec)}; "
          f"rel err {err:.1e}", flush=True)  # fmt: skip
    return rows, entry


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "tune_out"))
    ap.add_argument("--shapes", nargs="*")
    ap.add_argument("--chunks", nargs="*", type=int, default=[16, 32])
    ap.add_argument("--workers", type=int, default=min(8, (os.cpu_count() or 2) // 2))
    ap.add_argument("--budget-s", type=float, default=300.0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes] if args.shapes else SHAPES
    # the untuned choice is the baseline: measure without the packaged table
    os.environ["KREG_TUNING"] = os.devnull
    target = detect()
    compile_s = precompile(shapes, args.chunks, args.workers)
    print(f"compiled in {compile_s:.0f} s", flush=True)
    rows, entries, t0 = [], [], time.time()
    reps = dict(min_reps=20, min_ms=60.0)
    for B, T, H in shapes:
        if time.time() - t0 > args.budget_s:
            print(f"budget spent: B={B} T={T} H={H} and later not tuned", flush=True)
            break
        shape_rows, entry = tune_shape(B, T, H, target, args.chunks, reps)
        rows += shape_rows
        if entry is not None:
            entries.append(entry)
        torch.cuda.empty_cache()
    section = {"header": {"target": target.name, "triton": triton.__version__,
                          "abi": {"kda": get_registry().families["kda"].abi_version},
                          "device": torch.cuda.get_device_name(),
                          "date": time.strftime("%Y-%m-%d")},
               "entries": entries}  # fmt: skip
    with open(os.path.join(args.out, f"tuning_{target.name}.json"), "w") as f:
        json.dump(section, f, indent=1)
    with open(os.path.join(args.out, "tune.json"), "w") as f:
        json.dump({"compile_s": compile_s, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
