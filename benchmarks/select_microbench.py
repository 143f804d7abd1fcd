"""Microbenchmark: the cost of a cached ``kreg.dispatch.select`` (and of a cold one).

For every registered family whose problem type has ``from_options``, select the default
problem on each target. Usage: ``python benchmarks/select_microbench.py [--number N]``.
"""

from __future__ import annotations

import argparse
import platform
import time
import timeit

from kreg.dispatch import NoCandidateError, clear_cache, select
from kreg.registry import get_registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000, help="cached calls per timing")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    reg = get_registry()
    print(
        f"# {time.strftime('%Y-%m-%d')} {platform.processor() or platform.machine()} "
        f"python {platform.python_version()}, best of {args.repeat}"
    )
    for family in reg.families.values():
        if not hasattr(family.problem_type, "from_options"):
            continue
        problem = family.problem_type.from_options({})
        for target in reg.targets.values():
            clear_cache()
            t0 = time.perf_counter()
            try:
                select(problem, target)
            except NoCandidateError:
                print(f"{family.name:10} {target.name:8} no candidate")
                continue
            cold = time.perf_counter() - t0
            timer = timeit.Timer(lambda p=problem, t=target: select(p, t))
            cached = min(timer.repeat(repeat=args.repeat, number=args.number)) / args.number
            print(
                f"{family.name:10} {target.name:8} cached {cached * 1e6:7.3f} us   "
                f"cold {cold * 1e3:8.3f} ms"
            )


if __name__ == "__main__":
    main()
