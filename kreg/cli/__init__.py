"""The ``kreg`` command line. Each subcommand is a module of this package exposing
``add_parser(subparsers)`` and ``run(args) -> int | None``; add one by naming it in SUBCOMMANDS.

User mistakes (unknown names, bad values, nothing to select) print one ``kreg: error: ...``
line to stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ._util import CliError

SUBCOMMANDS = (
    "list_cmd",
    "explain_cmd",
    "build_cmd",
    "golden_cmd",
    "matrix_cmd",
    "docs_cmd",
    "bench_cmd",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise CliError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kreg", description="kreg: kernel registry and dispatch")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"{__name__}.{name}")
        module.add_parser(subparsers).set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from kreg.dispatch import NoCandidateError

    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        # key=value options may follow other options (`explain kda --target sm90 T=64`)
        if extra and hasattr(args, "options") and not any(x.startswith("-") for x in extra):
            args.options += extra
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return args.run(args) or 0
    except (CliError, NoCandidateError) as e:
        message = " | ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"kreg: error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `kreg build ... --stage ptx | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
