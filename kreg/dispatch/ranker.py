"""Ranking a candidate's valid specs: measured tuning-table entries first, then a cost heuristic.

The tuning table is JSON, packaged as ``kreg/dispatch/tuning.json`` (``$KREG_TUNING`` names
another file). It is one section or a list of sections, one per (target, Triton version)::

    {"header": {"target": "sm90", "triton": "3.6.0", "abi": {"kda": 1}},
     "entries": [{"candidate": "kda.split", "bucket": {...}, "spec": {"field": value}}]}

A section applies to a family only when its target is the current one, its Triton version is
the installed one and its ``abi`` names the family's current ``abi_version``; a stale section is
ignored whole with a warning, never half-used. An entry matches a problem when its ``bucket``
items are a subset of ``problem.bucket()`` and its ``spec`` items (nested for nested attrs
specs) a subset of a valid spec's fields; the first matching entry wins.
"""

from __future__ import annotations

import json
import os
import warnings
from importlib import resources
from typing import Any

import attrs

from kreg.registry.model import Candidate, Family, Target

_sections: list[dict] | None = None


class TuningWarning(UserWarning):
    """A tuning-table section or entry was ignored."""


def clear_table() -> None:
    """Re-read the tuning table on next use (after changing it or ``$KREG_TUNING``)."""
    global _sections
    _sections = None


def tuning_sections() -> list[dict]:
    global _sections
    if _sections is None:
        _sections = _load(os.environ.get("KREG_TUNING"))
    return _sections


def _load(path: str | None) -> list[dict]:
    try:
        if path:
            with open(path) as f:
                data = json.load(f)
        else:
            data = json.loads(resources.files("kreg.dispatch").joinpath("tuning.json").read_text())
    except (OSError, ValueError) as e:
        warnings.warn(
            f"tuning table {path or 'tuning.json'} unreadable, ignored: {e}",
            TuningWarning,
            stacklevel=2,
        )
        return []
    sections = data if isinstance(data, list) else [data]
    good = []
    for i, s in enumerate(sections):
        if (
            isinstance(s, dict)
            and isinstance(s.get("header"), dict)
            and isinstance(s.get("entries"), list)
            and all(isinstance(e, dict) and "candidate" in e for e in s["entries"])
        ):
            good.append(s)
        else:
            warnings.warn(
                f"tuning table section {i} malformed, ignored", TuningWarning, stacklevel=2
            )
    return good


def _triton_version() -> str:
    import triton

    return triton.__version__


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _subset(want: dict, have: dict) -> bool:
    for k, v in want.items():
        if k not in have:
            return False
        if isinstance(v, dict) and isinstance(have[k], dict):
            if not _subset(v, have[k]):
                return False
        elif _jsonable(v) != _jsonable(have[k]):
            return False
    return True


def _spec_fields(spec: Any) -> dict:
    return attrs.asdict(spec) if attrs.has(type(spec)) else {}


def tuned_spec(
    candidate: Candidate, family: Family, specs: list, problem: Any, target: Target
) -> tuple[Any, str] | None:
    """The spec of the first matching tuning entry, with a description; None without one."""
    bucket = problem.bucket() if hasattr(problem, "bucket") else {}
    for s_index, section in enumerate(tuning_sections()):
        header = section["header"]
        entries = [e for e in section["entries"] if e["candidate"] == candidate.name]
        if header.get("target") != target.name or not entries:
            continue
        where = f"section {s_index} (target {target.name}, triton {header.get('triton')})"
        if header.get("triton") != _triton_version():
            warnings.warn(
                f"tuning {where} ignored: measured with Triton {header.get('triton')}, "
                f"installed is {_triton_version()}",
                TuningWarning,
                stacklevel=2,
            )
            continue
        abi = header.get("abi", {}).get(family.name)
        if abi != family.abi_version:
            warnings.warn(
                f"tuning {where} ignored for family {family.name}: abi {abi}, "
                f"family is at abi {family.abi_version}",
                TuningWarning,
                stacklevel=2,
            )
            continue
        for entry in entries:
            if not _subset(entry.get("bucket", {}), bucket):
                continue
            for spec in specs:
                if _subset(entry.get("spec", {}), _spec_fields(spec)):
                    return spec, f"tuning table entry {entry.get('spec', {})} for bucket " + (
                        f"{entry.get('bucket', {})} ({where})"
                    )
            # An entry whose specs are all invalid for this problem (say, a block-anchor entry
            # for unbounded gates) simply does not apply; one that names no spec of the
            # enumeration at all is stale.
            if not any(
                _subset(entry.get("spec", {}), _spec_fields(spec))
                for spec in candidate.enumerate_specs(target)
            ):
                warnings.warn(
                    f"tuning {where}: entry {entry} for {candidate.name} matches no spec of the "
                    f"{target.name} enumeration, ignored",
                    TuningWarning,
                    stacklevel=2,
                )
    return None


def choose_spec(
    candidate: Candidate, family: Family, specs: list, problem: Any, target: Target
) -> tuple[Any, str]:
    """The spec to run among ``specs`` (valid, in enumeration order) and why it was chosen."""
    tuned = tuned_spec(candidate, family, specs, problem, target)
    if tuned is not None:
        return tuned
    if candidate.cost is not None:
        costs = [candidate.cost(spec, problem, target) for spec in specs]
        best = min(range(len(specs)), key=costs.__getitem__)
        return specs[best], f"heuristic cost {costs[best]:.4g} (lowest of {len(specs)} valid specs)"
    return specs[0], "priority"
