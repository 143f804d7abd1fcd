"""Where a prefill's GPU time goes: kreg's kernels one by one beside the call's total, on a
scenario's own cases (the engines' inputs and keywords, from the scenario's ``prepare``), with
fla-core's total in the same run (``--fla``). ``kreg bench`` says how fast a path is; this says
which kernel to work on, and times a change against its baseline on the same machine.

    PYTHONPATH=. python3 benchmarks/prefill_kernels.py gdn [--cases SUBSTR ...] [--fla] \
        [--label L] [--out DIR]

Per case and row (kreg's rows; fla-core's with ``--fla``): the median device time
(``kreg.bench.device_ms``: CUDA-graph replays, L2 flushed) and, for kreg's rows, each kernel's
mean device time over five replays of one captured call (torch.profiler; the L2 is not flushed
between them, so they can sum to less than the median). Appends one JSON line per row to
``DIR/prefill_kernels.jsonl`` with ``--label``: run it once per tree (swap the kernels in
between) and compare the labels.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # before fla is imported

SCENARIOS = {"kda": "kreg.families.kda.bench.scenario", "gdn": "kreg.families.gdn.bench.scenario"}
PROFILED_REPLAYS = 5


def kernel_ms(fn) -> dict[str, float]:
    """Mean device ms of each kernel of one captured call of ``fn``."""
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    cuda = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[cuda]) as prof:
        for _ in range(PROFILED_REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    return {
        e.key: round(e.device_time_total / PROFILED_REPLAYS / 1e3, 4)
        for e in prof.key_averages()
        if e.device_type == torch.autograd.DeviceType.CUDA
    }


def measure(scenario: str, substrings, with_fla: bool, label: str, device="cuda"):
    """One row dict per (case, implementation) of ``scenario``'s cases matching ``substrings``."""
    import torch

    from kreg.bench import Impl, filter_cases

    module = importlib.import_module(SCENARIOS[scenario])
    device = torch.device(device)
    for case in filter_cases(list(module.cases()), substrings):
        prepared = module.prepare(case, "sm90", device)
        for impl in prepared.impls:
            if not isinstance(impl, Impl):
                continue  # a peer that cannot run here (a Skip says why in kreg bench)
            peer = impl.name == prepared.peer
            if peer and not with_fla:
                continue
            row = {"label": label, "case": case.name, "impl": impl.name,
                   "ms": round(total_ms(impl.run), 4)}  # fmt: skip
            if not peer:
                row["kernels"] = kernel_ms(impl.run)
            yield row
        del prepared
        if device.type == "cuda":
            torch.cuda.empty_cache()


def total_ms(fn) -> float:
    """The call's median device ms, as the benchmarks time it."""
    from kreg.bench import device_ms

    return device_ms(fn)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--cases", nargs="+", metavar="SUBSTR", help="cases whose name contains one")
    ap.add_argument("--fla", action="store_true", help="fla-core's rows too (it autotunes first)")
    ap.add_argument("--label", default="tree", help="tags the rows (the tree measured)")
    ap.add_argument("--out", default=os.environ.get("OUT", "prefill_kernels_out"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "prefill_kernels.jsonl", "a") as f:
        for row in measure(args.scenario, args.cases, args.fla, args.label):
            print(json.dumps(row), file=f, flush=True)
            kernels = " ".join(f"{k[:24]} {v}" for k, v in row.get("kernels", {}).items())
            print(f"{row['label']:8} {row['case'][:40]:40} {row['impl'][:16]:16} "
                  f"{row['ms']:8.4f} ms  {kernels}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
