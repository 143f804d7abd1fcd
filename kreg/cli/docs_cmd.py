"""``kreg docs --write | --check``: the generated blocks of docs/index.md and the family pages.

``--write`` regenerates every ``<!-- generated: NAME -->`` block (hand-written prose around them
is kept; a missing page is created from a template); ``--check`` exits 1 when one is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ._util import dump_json, repository_registry


def add_parser(subparsers):
    p = subparsers.add_parser("docs", help="write or check the generated documentation")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the generated blocks")
    mode.add_argument("--check", action="store_true", help="exit 1 if a generated block is stale")
    p.add_argument("--root", type=Path,
                   help="repository root holding docs/ (default: the kreg checkout)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    return p


def run(args) -> int:
    from kreg import docsgen
    from kreg.checkout import repo_root

    root = repo_root(args.root)  # an installed kreg needs --root: never writes site-packages
    reg, _ = repository_registry(args)
    if args.check:
        problems = docsgen.stale(reg, explain_output, root)
        if args.json:
            print(dump_json({"root": str(root), "ok": not problems, "stale": list(problems)}))
            return 1 if problems else 0
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print(f"run `{docsgen.WRITE_COMMAND}`", file=sys.stderr)
            return 1
        print("docs are up to date")
        return 0
    written = docsgen.write(reg, explain_output, root)
    if args.json:
        print(
            dump_json({"root": str(root), "written": [str(p.relative_to(root)) for p in written]})
        )
        return 0
    for path in written:
        print(f"wrote {path.relative_to(root)}")
    if not written:
        print("docs are up to date")
    return 0


def explain_output(argv: list[str]) -> str:
    """What ``kreg ARGV`` prints (the docs quote ``kreg explain``'s output as evidence): the
    producers below the CLI are handed this, they never import the CLI."""
    import contextlib
    import io

    from kreg.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    if rc:
        raise RuntimeError(f"kreg {' '.join(argv)} exited {rc}")
    return buf.getvalue()
