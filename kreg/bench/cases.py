"""What a family hands the runner: its cases, the implementations one case times, and the
errors the runner raises."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

FLAG_REL_ERR = 1e-2  # rows whose relative RMS error against a reference exceeds this are flagged


@attrs.frozen(eq=False)
class BenchCase:
    """One benchmark case: its parameters and the work it represents (no tensors)."""

    name: str
    params: Mapping[str, Any]  # JSON-able; what the family's prepare() reads
    flops: float  # the nominal FLOP count (the family documents its formula)
    bytes: float  # compulsory device-memory bytes: inputs read once, outputs written once
    tokens: int  # total tokens of the case (all sequences)
    heads: int  # heads the per token·head time divides by
    bh: int  # batch (or sequences) x heads: the sweep plot's x axis
    tags: tuple[str, ...] = attrs.field(default=(), converter=tuple)  # "sweep" is plotted
    impls: tuple[str, ...] = attrs.field(default=(), converter=tuple)  # planned, for --list
    description: str = ""


@attrs.frozen(eq=False)
class Impl:
    """One implementation of a case, ready to run on prepared inputs."""

    name: str
    run: Callable[[], Any]  # the device work only; returns the outputs
    call: Callable[[], Any] | None = None  # the public call for host overhead (default: run)
    info: Mapping[str, Any] = attrs.field(factory=dict)  # JSON-able (spec, arguments, ...)
    graph: bool = True  # try CUDA-graph capture for the timing
    peer: str | None = None  # the row this one's ratio is taken against (None: Prepared.peer)


@attrs.frozen
class Skip:
    """An implementation that cannot run here, and why (reported in the results)."""

    name: str
    reason: str


@attrs.frozen
class Pair:
    """A like-with-like pair: a kreg row and the peer row that makes the same promise about
    its inputs; the kreg row's "× peer" is the peer's ms over its ms."""

    label: str  # e.g. "default", "bounded"
    impl: str  # the kreg row
    peer: str  # the peer row
    text: str = ""  # what the two rows call, for the rendered page


@attrs.frozen(eq=False)
class Prepared:
    impls: Sequence[Impl | Skip]
    outputs: Callable[[Any], Mapping[str, Any]]  # named output tensors of a return value
    references: tuple[str, ...] = ()  # impl names the others are compared against
    peer: str | None = None  # impl name of the peer: ratio = peer ms / impl ms
    notes: tuple[str, ...] = ()
    pairs: tuple[Pair, ...] = attrs.field(default=(), converter=tuple)


class ResultsError(ValueError):
    """A file that is not a kreg bench results file (what is wrong, in one line)."""


class BenchError(RuntimeError):
    """The benchmark cannot run here (no GPU, no target): one line for the user."""


def filter_cases(cases: Sequence[BenchCase], substrings: Sequence[str] | None):
    """The cases whose name contains one of ``substrings`` or that carry one as a tag (a
    family's named selection, e.g. ``kda``'s ``quick``)."""
    if not substrings:
        return list(cases)
    return [c for c in cases if any(s in c.name or s in c.tags for s in substrings)]


def impl_selected(name: str, patterns: Sequence[str] | None) -> bool:
    """An implementation is kept if a pattern equals its name or is a substring of it."""
    return not patterns or any(p == name or p in name for p in patterns)
