"""``kreg golden check|update|diff``: the golden IR hashes of every registered golden case.

``check`` compiles every case for every target it covers and compares the normalised IR hashes
with the installed Triton's sub-document of ``golden/ir_sha256.json`` (exit 1 on any difference,
cases added or dropped without regenerating, or colliding case names). A Triton the file does not
pin skips the check (exit 0, the pinned versions named on stderr); in CI (``$CI`` or
``$KREG_GOLDEN_STRICT``) that fails (exit 1).
``update`` regenerates that sub-document (``--case NAME``: only those cases' entries, the rest of
the file kept). ``diff CASE`` prints a case's normalised IR, or with
``--against REV`` the unified diff between the IR built from revision REV and the working tree.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ._util import CliError, dump_json, get_target, registry, repository_registry, wrap

STAGES = ("ttir", "ttgir", "llir", "ptx", "amdgcn")


def add_parser(subparsers):
    p = subparsers.add_parser("golden", help="check, update or diff the golden IR hashes")
    sub = p.add_subparsers(dest="golden_command", required=True, metavar="ACTION")
    for name, text in (
        ("check", "compare the golden IR hashes with freshly compiled IR (exit 1 on mismatch)"),
        ("update", "regenerate the golden IR hashes of the installed Triton version"),
    ):
        q = sub.add_parser(name, help=text)
        q.add_argument("--file", type=Path, help="golden file (default: golden/ir_sha256.json)")
        q.add_argument("--root", type=Path, help="repository root (default: the kreg checkout)")
        q.add_argument("--jobs", "-j", type=int, default=min(2, os.cpu_count() or 1),
                       help="compile processes (default: 2)")  # fmt: skip
        q.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
        q.add_argument("--json", action="store_true", help="print the outcome as JSON")
        if name == "update":
            q.add_argument("--case", action="append", metavar="CASE",
                           help="regenerate only this case (repeatable); the file's other "
                                "entries are kept")  # fmt: skip
    d = sub.add_parser("diff", help="print a case's normalised IR, or diff it against a revision")
    d.add_argument("case", help="golden case name (kreg list --json lists them)")
    d.add_argument("--target", help="only this target")
    d.add_argument("--kernel", help="only this kernel of the candidate")
    d.add_argument("--stage", choices=STAGES, help="only this IR stage")
    d.add_argument("--against", metavar="REV", help="diff against the IR built at git revision REV")
    return p


def run(args) -> int:
    from kreg import golden

    if args.golden_command == "diff":
        return _diff(golden, registry(), args)
    reg, plugins = repository_registry(args)
    quiet = args.quiet or args.json
    progress = None if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    path = args.file or golden.default_path(args.root)  # an installed kreg needs --root or --file
    if args.golden_command == "check":
        if not path.is_file():  # nothing to check against is a mistake, not a pass
            raise CliError(f"{path}: no golden file there (`{golden.UPDATE_COMMAND}` writes one)")
        try:
            outcome = golden.check(reg, path, jobs=args.jobs, plugins=plugins, progress=progress)
        except golden.GoldenFileError as e:
            raise CliError(str(e)) from e
        if args.json:
            print(dump_json({"file": str(path), "triton": golden.triton_version(),
                             "ok": outcome.ok, "skipped": outcome.skipped,
                             "messages": list(outcome.messages)}))  # fmt: skip
            return 0 if outcome.ok else 1
        stream = sys.stdout if outcome.ok and not outcome.skipped else sys.stderr
        for line in outcome.messages:
            print(wrap(line, indent="    "), file=stream)
        return 0 if outcome.ok else 1
    cases = None
    if args.case:
        unknown = [c for c in args.case if c not in reg.golden_cases]
        if unknown:
            known = ", ".join(sorted(reg.golden_cases)) or "(none)"
            raise CliError(f"unknown golden case(s) {', '.join(unknown)}; known: {known}")
        cases = [reg.golden_cases[c] for c in dict.fromkeys(args.case)]
    try:
        _, changes = golden.update(
            reg, path, cases=cases, jobs=args.jobs, plugins=plugins, progress=progress
        )
    except golden.CompileFailed as e:
        print(str(e), file=sys.stderr)
        print(f"{path} not written", file=sys.stderr)
        return 1
    except ValueError as e:  # GoldenFileError included
        raise CliError(str(e)) from e
    if args.json:
        print(dump_json({"file": str(path), "triton": golden.triton_version(),
                         "changes": list(changes)}))  # fmt: skip
        return 0
    for line in changes:
        print(f"changed: {line}")
    print(f"wrote {path} (Triton {golden.triton_version()}): {len(changes)} change(s)")
    return 0


def _diff(golden, reg, args) -> int:
    if args.target is not None:
        get_target(args.target, reg.targets)
    options = dict(target=args.target, kernel=args.kernel, stage=args.stage)
    try:
        current = golden.case_ir(reg, args.case, **options)
    except KeyError as e:
        raise CliError(e.args[0]) from e
    except Exception as e:  # a kernel that does not compile
        raise CliError(f"building {args.case!r}: {golden._error_line(e)}") from e
    if not current:
        raise CliError(f"nothing selected for case {args.case!r} with {options}")
    if args.against is None:
        for key, text in current.items():
            print(f"// ===== {args.case} {key} =====")
            print(text, end="")
        return 0
    try:
        old = golden.case_ir_at_revision(args.against, args.case, **options)
    except ValueError as e:
        raise CliError(str(e)) from e
    text = golden.unified_diff(old, current, args.against, "worktree")
    if text:
        print(text, end="")
        return 1
    print(f"{args.case}: normalised IR identical at {args.against} and in the working tree")
    return 0
