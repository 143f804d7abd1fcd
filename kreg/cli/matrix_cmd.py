"""``kreg matrix [--write | --check]``: the support matrix, derived from the registered rules.

Without an option it prints the matrix; ``--write`` writes ``SUPPORT_MATRIX.md`` at the
repository root; ``--check`` exits 1 when that file is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ._util import dump_json, registry, repository_registry, table


def add_parser(subparsers):
    p = subparsers.add_parser("matrix", help="print, write or check SUPPORT_MATRIX.md")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write SUPPORT_MATRIX.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if SUPPORT_MATRIX.md is stale")
    p.add_argument("--file", type=Path, help="matrix file (default: SUPPORT_MATRIX.md at the root)")
    p.add_argument("--root", type=Path, help="repository root (default: the kreg checkout)")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the rows, or the outcome, as JSON")
    form.add_argument("--markdown", action="store_true",
                   help="print the whole Markdown file (wide) instead of the terminal table")  # fmt: skip
    return p


def run(args) -> int:
    from kreg import matrix

    reg = registry()
    if args.check or args.write:  # an installed kreg needs --root or --file: never site-packages
        reg, _ = repository_registry(args)
        args.file = args.file or matrix.default_path(args.root)
    if args.check:
        ok, message = matrix.check(reg, args.file)
        if args.json:
            print(dump_json({"file": str(args.file), "ok": ok, "message": message}))
        else:
            print(message, file=sys.stdout if ok else sys.stderr)
        return 0 if ok else 1
    if args.write:
        path = matrix.write(reg, args.file)
        print(dump_json({"file": str(path)}) if args.json else f"wrote {path}")
        return 0
    if args.markdown:
        print(matrix.render(reg), end="")
        return 0
    rows = matrix.terminal_rows(reg)
    if args.json:
        print(dump_json(rows))
        return 0
    print(table([list(r.values()) for r in rows], list(rows[0]) if rows else []))
    return 0
