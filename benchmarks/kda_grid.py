"""The KDA grid: plan (CPU), spec sweep (GPU), fit and held-out validation (CPU).

    python benchmarks/kda_grid.py plan                      # shapes, split, compile counts
    python benchmarks/kda_grid.py sweep --out DIR/sweep.json [--deadline-s 540] [--workers 14]
    python benchmarks/kda_grid.py fit SWEEP.json [--out kreg/families/kda/kda_model.json]
    python benchmarks/kda_grid.py validate SWEEP.json [--bench RESULTS.json] [--out docs/kda]
    python benchmarks/kda_grid.py part K N                  # kreg bench --cases of part K of N
    python benchmarks/kda_grid.py merge A.json B.json --out DIR   # one results.json of the parts
                                     [--supersede]  # later parts replace re-measured cases
    python benchmarks/kda_grid.py changed BEFORE_MODEL.json [--after MODEL.json]
                                     # the grid cases whose selection a refit changed

``sweep`` writes SWEEP.json after every shape and stops cleanly before ``--deadline-s`` seconds
from its start (compiling takes at most half of them), and copies Triton's autotuning results
(fla's choices) to DIR/triton_autotune/, which a later call may copy into its Triton cache.
``fit`` fits the fit shapes only; ``validate`` refits the same way and reports the holdout
shapes (docs/kda/GRID.md, grid.png, grid_validation.json). The modules are
kreg/families/kda/{grid,sweep,model,validate}.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

STARTED = time.perf_counter()


def cmd_plan(args) -> int:
    import collections

    from kreg.families.kda import builders
    from kreg.families.kda.bench import grid, sweep
    from kreg.registry import get_registry

    target = get_registry().targets[args.target]
    plans = [sweep.plan_shape(s, target) for s in grid.shapes()]
    keys = set()
    for p in plans:
        for _, spec, _ in p.specs:
            keys |= builders.kernel_keys(p.problem, spec)
    jobs = sweep.compile_jobs(plans)
    print(json.dumps(grid.summary(), default=str))
    print(
        f"specs timed: {sum(len(p.specs) for p in plans)} over {len(plans)} shapes; "
        f"kreg kernels to compile: {len(keys)} "
        f"({dict(collections.Counter(k[0] for k in keys))}); compile jobs: {len(jobs)}"
    )
    if args.verbose:
        for p in plans:
            print(
                f"{p.shape.split:7s} {p.shape.gate:9s} {p.shape.name:42s} "
                f"{len(p.specs):2d} specs; current {p.current} ({p.decided_by[:40]})"
            )
    return 0


def cmd_sweep(args) -> int:
    from kreg.families.kda.bench import sweep

    names = set(args.shapes) if args.shapes else None
    sweep.run(args.out, deadline_s=args.deadline_s, quick=not args.full, workers=args.workers,
              names=names, peer=not args.no_peer, kreg=not args.peer_only,
              started=STARTED)  # fmt: skip
    return 0


def cmd_fit(args) -> int:
    from kreg.families.kda.bench import validate

    sw = validate.load_sweep(args.sweep)
    section = validate.fit_section(sw, source=f"benchmarks/kda_grid.py fit {args.sweep}")
    if not section["model"]["roles"]:  # would replace a working model by one predicting nothing
        print(f"kda_grid fit: {section['model']['unfitted']}; {args.out} left as it is",
              file=sys.stderr)  # fmt: skip
        return 2
    with open(args.out, "w") as f:
        json.dump(section, f, indent=1)
        f.write("\n")
    roles = section["model"]["roles"]
    print(
        f"wrote {args.out}: {len(roles)} roles fitted on "
        f"{sum(e['params']['split'] == 'fit' for e in sw['shapes'])} fit shapes"
    )
    for name, r in roles.items():
        print(f"  {name:24s} {r['shapes']:3d} shapes, rms {r['rms_log2']:.3f} log2")
    return 0


def cmd_validate(args) -> int:
    from kreg.families.kda.bench import validate

    sw = validate.load_sweep(args.sweep)
    bench = json.loads(open(args.bench).read()) if args.bench else None
    written = validate.render(sw, args.out, bench)
    st = json.loads(written["json"].read_text())["stats"]
    h = st["holdout"]
    print(
        f"holdout: {h.get('n', 0)} shapes, selected/best median {h.get('median')}, worst "
        f"{h.get('worst')}; x fla floor {st['fla_floor']}, geomean {st['fla_geomean']}; "
        f"goals {st['goals']}"
    )
    for kind, p in written.items():
        print(f"wrote {p} ({kind})")
    return 0


def cmd_part(args) -> int:
    from kreg.families.kda.bench import grid

    print(" ".join(grid.head_part(args.part, args.parts)))
    return 0


def cmd_merge(args) -> int:
    from pathlib import Path

    from kreg import bench
    from kreg.families.kda.bench import grid

    merged = bench.merge_results([json.loads(Path(p).read_text()) for p in args.results],
                                 supersede=args.supersede)  # fmt: skip
    measured = {c["name"] for c in merged["cases"]}
    missing = [c.name for c in grid.cases() if c.name not in measured]
    merged.pop("not_measured", None)
    if missing:  # the grid's cases no part measured, the parts' cut ones included
        merged["not_measured"] = missing
    bench.write_json(merged, args.out)
    for kind, p in bench.render(Path(args.out) / "results.json").items():
        print(f"wrote {p} ({kind})")
    print(f"{len(measured)} cases measured, {len(missing)} not")
    return 0


def cmd_changed(args) -> int:
    from kreg.families.kda.bench import validate

    before = validate.selections(args.before)
    after = validate.selections(args.after)
    changed = [name for name in before if before[name] != after[name]]
    for name in changed:
        diff = {p: f"{before[name][p]} -> {after[name][p]}"
                for p in before[name] if before[name][p] != after[name][p]}  # fmt: skip
        print(f"{name}: {diff}", file=sys.stderr)
    print(" ".join(changed))  # for `kreg bench kda-grid --cases`
    print(f"{len(changed)} of {len(before)} cases changed", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--target", default="sm90")
    p.add_argument("-v", "--verbose", action="store_true")
    p = sub.add_parser("sweep")
    p.add_argument("--out", required=True, help="the sweep JSON to write")
    p.add_argument("--deadline-s", type=float, default=540.0)
    p.add_argument("--workers", type=int, default=None, help="compiling processes (default "
                   "cores - 2, at most 14)")  # fmt: skip
    p.add_argument("--full", action="store_true", help="the full repetition budget")
    p.add_argument("--no-peer", action="store_true", help="no fla rows")
    p.add_argument(
        "--peer-only",
        action="store_true",
        help="fla rows only (autotune fla on the idle GPU and save its choices for a later call)",
    )
    p.add_argument("--shapes", nargs="+", help="only these grid shapes (names)")
    p = sub.add_parser("fit")
    p.add_argument("sweep")
    p.add_argument("--out", default="kreg/families/kda/kda_model.json")
    p = sub.add_parser("validate")
    p.add_argument("sweep")
    p.add_argument("--bench", help="a `kreg bench kda-grid` results.json to summarise too")
    p.add_argument("--out", default="docs/kda")
    p = sub.add_parser("part")
    p.add_argument("part", type=int)
    p.add_argument("parts", type=int)
    p = sub.add_parser("merge")
    p.add_argument("results", nargs="+", help="`kreg bench kda-grid` results.json of the parts")
    p.add_argument("--out", required=True, help="folder for the merged results.json")
    p.add_argument(
        "--supersede",
        action="store_true",
        help="a case in several parts is taken from the last (a re-measurement)",
    )
    p = sub.add_parser("changed")
    p.add_argument("before", help="the cost model file before the refit")
    p.add_argument("--after", help="the cost model file after it (default: the packaged one)")
    args = ap.parse_args(argv)
    return {"plan": cmd_plan, "sweep": cmd_sweep, "fit": cmd_fit, "validate": cmd_validate,
            "part": cmd_part, "merge": cmd_merge, "changed": cmd_changed}[args.cmd](args)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
