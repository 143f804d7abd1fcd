"""select(): which candidate and spec serve a problem on a target, and why.

Every candidate of every family whose problem type matches (or of the one family asked for,
``family=``) goes through four stages, each
recorded in the trace: ``problem`` (``accepts``), ``target`` (the candidate's targets),
``spec`` (enumerate, specialize to the problem, validate) and ``ranked`` (priority, opt-in,
then, among one family's candidates of the top priority, the estimated cost of each one's chosen
spec; the ranker picks the specs).
"""

from __future__ import annotations

from typing import Any

import attrs

from kreg.registry import get_registry
from kreg.registry.manager import BUILTIN_PREFIX
from kreg.registry.model import Candidate, Target, short_repr
from kreg.registry.targets import resolve

from . import ranker

MAX_REASONS = 3


@attrs.frozen
class TraceEntry:
    candidate: str
    stage: str  # "problem" | "target" | "spec" | "ranked"
    ok: bool
    reason: str


@attrs.frozen
class Selection:
    candidate: Candidate
    spec: Any
    target: Target
    trace: tuple[TraceEntry, ...]
    decided_by: (
        str  # "tuning table entry ...", "cost model ...", "heuristic cost ..." or "priority"
    )


class NoCandidateError(LookupError):
    """No candidate (or not the pinned one) can serve the problem; lists every reason."""

    def __init__(self, message: str, trace: tuple[TraceEntry, ...] = ()):
        lines = [message] + [f"  {e.candidate}: {e.stage}: {e.reason}" for e in trace if not e.ok]
        super().__init__("\n".join(lines))
        self.trace = trace


_cache: dict = {}
_cache_registry = None
_generation = 0


def clear_cache() -> None:
    """Forget cached selections and re-read the tuning table on next use."""
    global _cache_registry, _generation
    _cache.clear()
    _cache_registry = None
    _generation += 1
    ranker.clear_table()


def _forget(registry) -> None:
    """A new registry: its selections may differ."""
    global _cache_registry, _generation
    _cache.clear()
    _cache_registry = registry
    _generation += 1


def generation() -> int:
    """Changes whenever cached selections are forgotten (``clear_cache``, a new registry): what
    caches built on selections (a family's launch plans) key on."""
    registry = get_registry()
    if registry is not _cache_registry:
        _forget(registry)
    return _generation


def select(
    problem: Any,
    target: Target | str | None = None,
    algorithm: str = "auto",
    allow_opt_in: bool = False,
    family: str | None = None,
) -> Selection:
    """Select the candidate and spec serving ``problem`` on ``target`` (cached, deterministic).

    ``target`` is a Target, a target name, or None for the current GPU's target.
    ``algorithm`` is "auto" or a candidate name (full, or short after the dot) to pin; a pinned
    candidate may be opt-in. ``family`` restricts the candidates to that family's, so another
    family serving the same problem type (at any priority) never takes over a family's entry
    point; None considers every family. Raises NoCandidateError when nothing (or not the pinned
    one) serves, ValueError for an unknown algorithm, target or family.
    """
    if not isinstance(allow_opt_in, bool):  # before the cache, where "no" would be a key
        raise ValueError(f"allow_opt_in: must be a bool, got {allow_opt_in!r}")
    registry = get_registry()
    if registry is not _cache_registry:
        _forget(registry)
    key = (problem, target, algorithm, allow_opt_in, family)
    try:
        return _cache[key]
    except KeyError:
        pass
    except TypeError:  # unhashable problem: no caching
        return _select(registry, problem, target, algorithm, allow_opt_in, family)
    selection = _cache[key] = _select(registry, problem, target, algorithm, allow_opt_in, family)
    return selection


def _select(registry, problem, target, algorithm, allow_opt_in, family=None) -> Selection:
    target = resolve(registry.targets, target)
    candidates = sorted(registry.candidates_for(problem), key=lambda c: (-c.priority, c.name))
    if family is not None:
        if family not in registry.families:
            known = ", ".join(registry.families) or "(none)"
            raise ValueError(f"unknown family {family!r}; known: {known}")
        own = {id(c) for c in registry.families[family].candidates}  # the family's own objects
        candidates = [c for c in candidates if id(c) in own]
        if not candidates:
            raise NoCandidateError(
                f"family {family!r} does not serve {type(problem).__name__} "
                f"(its problem type is {registry.families[family].problem_type.__name__})"
            )
    if not candidates:
        raise NoCandidateError(f"no registered family serves {type(problem).__name__}")
    pinned = None
    if algorithm != "auto":
        matches = [c for c in candidates if algorithm in (c.name, c.name.partition(".")[2])]
        if len(matches) > 1 and algorithm not in {c.name for c in matches}:
            # a short name several families share ("split"): the one that takes this problem
            matches = [c for c in matches
                       if _guarded(registry, c, "a rule", [], _takes, c, problem)]  # fmt: skip
        if len(matches) != 1:
            known = ", ".join(["auto"] + sorted(c.name for c in candidates))
            why = "ambiguous" if matches else "unknown"
            raise ValueError(f"{why} algorithm {algorithm!r}; known: {known}")
        pinned = matches[0]

    trace: list[TraceEntry] = []
    passed: list[tuple[Candidate, list]] = []
    for c in candidates:
        if pinned is not None and c is not pinned:
            continue
        specs = _guarded(registry, c, "a rule", trace, _evaluate, c, problem, target, trace)
        if specs:
            passed.append((c, specs))

    eligible = []
    for c, specs in passed:
        if c.opt_in and not allow_opt_in and pinned is None:
            # said first: an opt-in candidate never wins under "auto", whatever it ranks
            trace.append(TraceEntry(c.name, "ranked", False, f"opt-in: {c.opt_in_reason}"))
        else:
            eligible.append((c, specs))
    # The highest priority ranks first. Several candidates of one family at that priority are
    # ranked by the estimated cost of each one's chosen spec (a family's costs share one unit),
    # then by name; the families tied there by the name of each one's best candidate (so a
    # foreign family at the same priority never reorders a family's own candidates).
    groups: dict[str, list] = {}
    while eligible and not groups:  # a third party whose ranking raises drops out
        top = eligible[0][0].priority
        for c, specs in [(c, specs) for c, specs in eligible if c.priority == top]:
            ranked = _guarded(registry, c, "its ranking", trace, _rank, registry, c, specs,
                              problem, target)  # fmt: skip
            if ranked is None:
                eligible.remove((c, specs))
            else:
                groups.setdefault(c.family, []).append((c, *ranked))
    costed = set()
    for fam, members in groups.items():
        if len(members) > 1 and all(_is_cost(x[3]) for x in members):
            members.sort(key=lambda x: x[3])  # stable: equal costs keep the name order
            costed.add(fam)
    chosen = [x for fam in sorted(groups, key=lambda f: groups[f][0][0].name) for x in groups[fam]]
    winner = chosen[0][:3] if chosen else None
    by_cost = winner is not None and winner[0].family in costed
    tied_cost = {x[0].name: x[3] for x in chosen}
    for c, _ in eligible:
        if c is winner[0]:
            why = f"selected (priority {c.priority}); {winner[2]}"
            if by_cost:
                rivals = ", ".join(f"{x[0].name} {x[3]:.4g}" for x in groups[c.family]
                                   if x[0] is not c)  # fmt: skip
                why += f"; cost {tied_cost[c.name]:.4g} beats {rivals} at the same priority"
            trace.append(TraceEntry(c.name, "ranked", True, why))
        elif c.name in tied_cost:
            same = c.family == winner[0].family
            why = (f"estimated cost {tied_cost[c.name]:.4g} > {tied_cost[winner[0].name]:.4g}"
                   if by_cost and same else "by name")  # fmt: skip
            trace.append(TraceEntry(c.name, "ranked", False, f"outranked by {winner[0].name} "
                                    f"(same priority {c.priority}, {why})"))  # fmt: skip
        else:
            trace.append(TraceEntry(c.name, "ranked", False, f"outranked by {winner[0].name} "
                                    f"(priority {c.priority} < {winner[0].priority})"))  # fmt: skip
    trace_t = tuple(trace)
    if winner is None:
        what = f"candidate {pinned.name}" if pinned else "no candidate"
        raise NoCandidateError(
            f"{what} cannot serve {short_repr(problem)} on {target.name}"
            if pinned
            else f"{what} serves {short_repr(problem)} on {target.name}",
            trace_t,
        )
    return Selection(winner[0], winner[1], target, trace_t, winner[2])


def _guarded(registry, c: Candidate, what: str, trace: list, fn, *args):
    """``fn(*args)``; where a third-party candidate's code raises (even SystemExit), a trace
    entry and None instead. A built-in family's error is a bug, never hidden."""
    try:
        return fn(*args)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - a third-party rule may even sys.exit()
        if registry.origin.get(c.name, "").startswith(BUILTIN_PREFIX):
            raise
        why = f"{what} of this third-party candidate raised {type(e).__name__}: {e}"
        trace.append(TraceEntry(c.name, "spec" if what == "a rule" else "ranked", False,
                                why[:300]))  # fmt: skip
        return None


def _takes(c: Candidate, problem) -> bool:
    return bool(c.accepts(problem).ok)


def _rank(registry, c: Candidate, specs: list, problem, target: Target) -> tuple:
    """(spec, why it was chosen, estimated cost or None) of candidate ``c``."""
    spec, decided_by = ranker.choose_spec(c, registry.families[c.family], specs, problem, target)
    cost = c.cost(spec, problem, target) if c.cost is not None else None
    return spec, decided_by, cost


def _is_cost(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # not NaN


def _evaluate(c: Candidate, problem, target: Target, trace: list) -> list:
    """Run the problem, target and spec stages; returns the valid specialised specs."""
    verdict = c.accepts(problem)
    trace.append(
        TraceEntry(c.name, "problem", verdict.ok, "; ".join(verdict.reasons) or "accepted")
    )
    if not verdict.ok:
        return []
    if c.targets is not None and target.name not in c.targets:
        trace.append(
            TraceEntry(c.name, "target", False, f"{target.name} not in {', '.join(c.targets)}")
        )
        return []
    trace.append(TraceEntry(c.name, "target", True, f"{target.name} supported"))

    enumerated = list(c.enumerate_specs(target))
    matched = valid = 0
    specs: list = []
    reasons: dict[str, None] = {}
    for spec in enumerated:
        if c.specialize is not None:
            spec = c.specialize(spec, problem)
            if spec is None:
                continue
        matched += 1
        v = c.is_valid(spec, target, problem)
        if v.ok:
            valid += 1
            if spec not in specs:
                specs.append(spec)
        else:
            reasons.update(dict.fromkeys(v.reasons))
    text = f"{len(enumerated)} enumerated, {matched} match the problem, {valid} valid"
    if reasons:
        shown = list(reasons)[:MAX_REASONS]
        more = len(reasons) - len(shown)
        text += "; rejected: " + "; ".join(shown) + (f" (+{more} more)" if more else "")
    trace.append(TraceEntry(c.name, "spec", bool(specs), text))
    return specs
