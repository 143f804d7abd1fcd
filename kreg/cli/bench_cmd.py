"""``kreg bench``: run a registered benchmark scenario, list scenarios, or render results.

kreg bench --list [SCENARIO] [--json]        scenarios, their cases and implementations (CPU)
kreg bench SCENARIO [--cases SUBSTR...] [--impls NAME...] [--out DIR] [--quick]   (GPU)
kreg bench --render results.json [--out DIR] RESULTS.md and the plot from a results JSON
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

from ._util import CliError, dump_json, jsonable, registry, table, wrap


def add_parser(subparsers):
    p = subparsers.add_parser("bench", help="run, list or render benchmark scenarios")
    p.add_argument("scenario", nargs="?", help="scenario name, e.g. kda")
    p.add_argument("--list", action="store_true", help="list scenarios, cases, implementations")
    p.add_argument("--json", action="store_true", help="with --list: print JSON")
    p.add_argument(
        "--cases",
        nargs="+",
        metavar="SUBSTR",
        help="only cases whose name contains one, or tagged one (e.g. quick)",
    )
    p.add_argument("--impls", nargs="+", metavar="NAME",
                   help="only implementations named (or whose name contains) these")  # fmt: skip
    p.add_argument("--out", metavar="DIR", help="output folder (default bench_out/<scenario>-"
                                                "<target>-<time>; with --render: the JSON's)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--workers", type=int, metavar="N",
                   help="processes compiling kernels before measuring (default: half the cores, "
                        "at most 8; 0: compile while measuring)")  # fmt: skip
    p.add_argument("--deadline-s", type=float, metavar="S",
                   help="begin no case after S seconds (compiling stops at S/2); what was "
                        "measured is written, the rest listed as not measured")  # fmt: skip
    p.add_argument("--render", metavar="JSON", help="regenerate RESULTS.md and the plot")
    return p


def _scenario(name: str):
    scenarios = registry().scenarios
    if name not in scenarios:
        raise CliError(f"unknown scenario {name!r}; known: {', '.join(scenarios) or '(none)'}")
    return scenarios[name]


def _cases(scenario, substrings, *, allow_empty: bool = False):
    from kreg.bench import filter_cases

    cases = filter_cases(list(scenario.cases() or ()), substrings)
    if not cases and not allow_empty:
        if substrings:
            raise CliError(f"no case of scenario {scenario.name!r} matches "
                           f"{' '.join(substrings)!r}; see `kreg bench --list {scenario.name}`")  # fmt: skip
        raise CliError(f"scenario {scenario.name!r} has no cases")
    return cases


def run(args) -> int:
    if args.json and not args.list:
        raise CliError("--json goes with --list")
    if args.render:
        return _render(args)
    if args.list:
        return _list(args)
    if not args.scenario:
        raise CliError("name a scenario to run (see `kreg bench --list`), or use --render JSON")
    return _run(args)


def _list(args) -> int:
    named = bool(args.scenario)
    scenarios = [_scenario(args.scenario)] if named else list(registry().scenarios.values())
    # a named scenario must match --cases; listing them all shows which ones match nothing
    listed = [(s, _cases(s, args.cases, allow_empty=not (named and args.cases)))
              for s in scenarios]  # fmt: skip
    if args.json:
        print(dump_json([_scenario_json(s, cases) for s, cases in listed]))
        return 0
    if not scenarios:
        print("no scenarios registered")
        return 0
    out = []
    for s, cases in listed:
        out.append(wrap(f"{s.name} (family {s.family}): {s.description}", indent="  "))
        if not cases:
            out.append("  (no cases" + (f" match {' '.join(args.cases)!r})" if args.cases
                                        else ")"))  # fmt: skip
        else:
            rows = [[c.name, c.bh, c.tokens, ",".join(c.tags or ()), ", ".join(c.impls or ())]
                    for c in cases]  # fmt: skip
            out.append(table(rows, ["case", "B·H", "tokens", "tags", "implementations"], "  "))
        out.append("")
    print("\n".join(out).rstrip())
    return 0


def _scenario_json(scenario, cases) -> dict:
    return {
        "name": scenario.name, "family": scenario.family, "description": scenario.description,
        "cases": [{"name": c.name, "description": c.description, "params": jsonable(dict(c.params)),
                   "tags": list(c.tags or ()), "impls": list(c.impls or ()), "bh": c.bh,
                   "tokens": c.tokens, "heads": c.heads, "flops": c.flops, "bytes": c.bytes}
                  for c in cases],
    }  # fmt: skip


def _render(args) -> int:
    from kreg.bench import render

    path = Path(args.render)
    if not path.is_file():
        raise CliError(f"--render: no such file {str(path)!r}")
    try:
        written = render(path, args.out)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # ResultsError is a ValueError
        raise CliError(f"--render: {path} is not a kreg bench results file ({e})") from e
    for kind, p in written.items():
        print(f"wrote {p} ({kind})")
    return 0


def _run(args) -> int:
    from kreg.bench import BenchError, require_gpu, summary, write_json, write_results

    scenario = _scenario(args.scenario)
    cases = _cases(scenario, args.cases)
    try:
        target = require_gpu(f"kreg bench {scenario.name}")
    except BenchError as e:
        raise CliError(str(e)) from e
    out = args.out or (f"bench_out/{scenario.name}-{target.name}-"
                       f"{datetime.datetime.now():%Y%m%d-%H%M%S}")  # fmt: skip
    print(f"kreg bench {scenario.name}: {len(cases)} cases on {target.name}"
          f"{' (quick)' if args.quick else ''}; writing {out}", file=sys.stderr)  # fmt: skip
    results = scenario.run(cases, target=target, impls=args.impls, quick=args.quick,
                           progress=not args.no_progress, workers=args.workers,
                           on_case=lambda partial: write_json(partial, out),
                           **({} if args.deadline_s is None
                              else {"deadline_s": args.deadline_s}))  # fmt: skip
    written = write_results(results, out)
    print(summary(results))
    print(f"\n{len(cases)} cases in {results.get('elapsed_s', 0):.0f} s; "
          + ", ".join(f"{k}: {p}" for k, p in written.items()))  # fmt: skip
    flagged = [f"{c['name']}/{r['impl']}" for c in results["cases"] for r in c["rows"]
               if r.get("flagged") or "error" in r]  # fmt: skip
    if flagged:
        print(f"flagged (rel err > {results['flag_rel_err']:g} or failed): {', '.join(flagged)}",
              file=sys.stderr)  # fmt: skip
    return 0
