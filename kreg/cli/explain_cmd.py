"""``kreg explain FAMILY --target T key=value...``: the dispatcher's choice among FAMILY's
candidates (another family serving the same problem type never wins here), said in words first;
``--verbose`` adds how the spec was ranked and every candidate's trace."""

from __future__ import annotations

import argparse

from kreg.dispatch.words import summary

from ._util import (
    CliError,
    dump_json,
    get_family,
    get_target,
    jsonable,
    parse_assignments,
    problem_from_options,
    problem_options_help,
    short_repr,
    table,
    wrap,
)


def add_parser(subparsers):
    p = subparsers.add_parser(
        "explain",
        help="show which candidate and spec serve a problem",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=problem_options_help,
    )
    p.add_argument("family", help="family name, e.g. kda")
    p.add_argument(
        "options",
        nargs="*",
        default=[],
        metavar="key=value",
        help="problem options (listed below; none: the family's default problem)",
    )
    p.add_argument("--target", required=True, help="target name, e.g. sm90")
    p.add_argument("--algorithm", default="auto", help="pin a candidate (full or short name)")
    p.add_argument("--allow-opt-in", action="store_true", help="let opt-in candidates win")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="add how the spec was ranked and every candidate's trace")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def run(args) -> int:
    from kreg.dispatch import select

    family = get_family(args.family)
    target = get_target(args.target)
    problem = problem_from_options(family, parse_assignments(args.options, "problem option"))
    try:
        sel = select(
            problem,
            target,
            algorithm=args.algorithm,
            allow_opt_in=args.allow_opt_in,
            family=family.name,
        )
    except ValueError as e:
        raise CliError(str(e)) from e
    print(
        dump_json(as_json(family, problem, args, sel)) if args.json else as_text(problem, args, sel)
    )
    return 0


def as_json(family, problem, args, sel) -> dict:
    return {
        "family": family.name,
        "problem": {"type": type(problem).__name__, "fields": jsonable(problem)},
        "target": sel.target.name,
        "algorithm": args.algorithm,
        "allow_opt_in": args.allow_opt_in,
        "summary": summary(sel, args.algorithm),
        "selected": {
            "candidate": sel.candidate.name,
            "spec_type": type(sel.spec).__name__,
            "spec": jsonable(sel.spec),
            "decided_by": sel.decided_by,
        },
        "trace": [jsonable(e) for e in sel.trace],
        **({"bucket": jsonable(problem.bucket())} if hasattr(problem, "bucket") else {}),
    }


def as_text(problem, args, sel) -> str:
    rows = [
        ["problem", short_repr(problem)],
        ["target", sel.target.name],
        ["algorithm", args.algorithm + (" (opt-in allowed)" if args.allow_opt_in else "")],
        ["selected", sel.candidate.name],
        ["spec", short_repr(sel.spec)],
        *([["decided by", sel.decided_by]] if args.verbose else []),
        # the shape class tuning entries match: what the problem is planned as
        *([["bucket", repr(problem.bucket())]] if hasattr(problem, "bucket") else []),
    ]
    head = wrap(summary(sel, args.algorithm)) + "\n\n" + table(rows, ["", ""]).split("\n", 1)[1]
    if not args.verbose:
        return head + "\n\n(--verbose: how the spec was ranked, and every candidate's trace)"
    rows = [[e.candidate, e.stage, "ok" if e.ok else "no", e.reason] for e in sel.trace]
    return head + "\n\nTrace\n" + table(rows, ["candidate", "stage", "ok", "reason"], "  ")
