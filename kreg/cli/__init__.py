"""The ``kreg`` command line. Each subcommand is a module of this package exposing
``add_parser(subparsers)`` and ``run(args) -> int | None``; add one by naming it in SUBCOMMANDS.

User mistakes (unknown names, bad values, nothing to select, a path that is missing or not a
file) print one ``kreg: error: ...`` line to stderr and exit 2; Ctrl-C prints ``kreg:
interrupted`` and exits 130 (128 + SIGINT), without a traceback, unless the process was
started with SIGINT ignored, which it then keeps ignoring.
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

    def format_help(self):
        if callable(self.epilog):  # computed when asked for: it may load the registry
            self.epilog = self.epilog()
        return super().format_help()


def version() -> str:
    """``kreg X (Triton Y, Python Z)``, from the installed distributions' metadata."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    def get(name: str) -> str:
        try:
            return dist_version(name)
        except PackageNotFoundError:
            return "not installed"

    python = ".".join(map(str, sys.version_info[:3]))
    return f"kreg {get('kreg')} (Triton {get('triton')}, Python {python})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kreg", description="kreg: kernel registry and dispatch")
    parser.add_argument("--version", action="version", version=version())
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"{__name__}.{name}")
        module.add_parser(subparsers).set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    interrupted = []

    def on_sigint(signum, frame):
        interrupted.append(signum)  # remembered even where native code swallows the exception
        raise KeyboardInterrupt

    previous = _set_sigint(on_sigint)
    try:
        code = _main(argv)
    except KeyboardInterrupt:
        code = None
    finally:
        _set_sigint(previous)
    if code is None or interrupted:
        print("kreg: interrupted", file=sys.stderr)
        return 130
    return code


def _set_sigint(handler):
    """Install ``handler`` for SIGINT and return the one it replaces (None: nothing changed)."""
    import signal

    # a process started with SIGINT ignored (`nohup`, `cmd &` in a script, many CI runners)
    # asked not to be interrupted: it stays so, as Python itself leaves it
    if handler is None or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return None
    try:
        return signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave signals alone
        return None


def _main(argv: list[str] | None) -> int:
    from kreg.checkout import NotACheckout
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
    except (CliError, NoCandidateError, NotACheckout) as e:
        return _error(str(e))
    except BrokenPipeError:  # e.g. `kreg build ... --stage ptx | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # a path given that is missing, a directory, not writable, ...
        where = f": {e.filename}" if e.filename else ""
        return _error(f"{e.strerror or e}{where}")


def _error(message: str) -> int:
    message = " | ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"kreg: error: {message}", file=sys.stderr)
    return 2
