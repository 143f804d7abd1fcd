"""Ranking a candidate's valid specs: measured tuning-table entries first, then a fitted cost
model, then a cost heuristic.

Each family ships its own measurements in the package its ``Family.data`` names (KDA:
``kreg/families/kda/``): a tuning table ``tuning.json`` and cost models ``*_model.json``. A
third party's family does the same in its own package; the core reads them through the family
and knows no family's files. ``$KREG_TUNING`` names one tuning file and ``$KREG_MODELS`` cost
model files (separated by ``os.pathsep``; empty or ``os.devnull``: none) used instead of every
family's packaged ones.

A tuning table is one section or a list of sections, one per (target, Triton version)::

    {"header": {"target": "sm90", "triton": "3.6.0", "abi": {"kda": 1}},
     "entries": [{"candidate": "kda.split", "bucket": {...}, "spec": {"field": value}}]}

A section applies to a family only when its target is the current one, its Triton version is
the installed one and its ``abi`` names the family's current ``abi_version``; a stale section is
ignored whole with a warning, never half-used. An entry matches a problem when its ``bucket``
items are a subset of ``problem.bucket()`` and its ``spec`` items (nested for nested attrs
specs) a subset of a valid spec's fields; the first matching entry wins.

A cost model file is one section or a list of them::

    {"header": {"target": "sm90", "triton": "3.6.0", "abi": {"kda": 1},
                "candidate": "kda.split", "device": ..., "date": ..., "kind": ...},
     "model": {...}}

A section applies under the tuning table's rules (target, Triton version, abi) to the candidate
it names, which must have a ``predict`` hook: the family reads its own ``model`` payload and
predicts the device time of the valid specs it models; the lowest prediction wins. The core
knows nothing of the payload.
"""

from __future__ import annotations

import json
import os
import warnings
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from kreg.registry.model import Candidate, Family, Target

# family data package ("" for the environment's files) -> sections, read once
_sections: dict[str, list[dict]] = {}
_models: dict[str, list[tuple[str, dict]]] = {}


class TuningWarning(UserWarning):
    """A tuning-table section or entry was ignored."""


def clear_table() -> None:
    """Re-read the tuning table and cost models on next use (after changing them or
    ``$KREG_TUNING`` / ``$KREG_MODELS``)."""
    _sections.clear()
    _models.clear()


def _packaged(family: Family, match) -> list:
    """The files of the family's data package whose names ``match``, by name (none for a family
    that ships no data)."""
    if not family.data:
        return []
    return sorted((f for f in resources.files(family.data).iterdir() if match(f.name)),
                  key=lambda f: f.name)  # fmt: skip


def tuning_sections(family: Family) -> list[dict]:
    """The tuning sections that apply to ``family``'s candidates: ``$KREG_TUNING``'s or the
    family's own packaged ``tuning.json``."""
    env = os.environ.get("KREG_TUNING")
    key = "" if env else family.data
    if key not in _sections:
        files = [Path(env)] if env else _packaged(family, lambda name: name == "tuning.json")
        _sections[key] = _load(_read(files[0], "tuning table") if files else None)
    return _sections[key]


def _read(source, what: str):
    """The JSON of a file: a path, or a packaged file (``importlib.resources``)."""
    try:
        return json.loads(source.read_text())
    except (OSError, ValueError) as e:
        warnings.warn(f"{what} {source} unreadable, ignored: {e}", TuningWarning, stacklevel=3)
        return None


def _well_formed(data, what: str, ok) -> list[dict]:
    if data is None:
        return []
    sections = data if isinstance(data, list) else [data]
    good = []
    for i, s in enumerate(sections):
        if isinstance(s, dict) and isinstance(s.get("header"), dict) and ok(s):
            good.append(s)
        else:
            warnings.warn(f"{what} section {i} malformed, ignored", TuningWarning, stacklevel=3)
    return good


def _load(data) -> list[dict]:
    return _well_formed(
        data,
        "tuning table",
        lambda s: (
            isinstance(s.get("entries"), list)
            and all(isinstance(e, dict) and "candidate" in e for e in s["entries"])
        ),
    )


def _model_ok(section: dict) -> bool:
    return isinstance(section["header"].get("candidate"), str) and isinstance(
        section.get("model"), dict
    )


def model_sections(family: Family) -> list[tuple[str, dict]]:
    """(file name, section) of the cost model sections for ``family``'s candidates: the files
    ``$KREG_MODELS`` names, or the family's own packaged ``*_model.json``."""
    env = os.environ.get("KREG_MODELS")
    key = "" if env is not None else family.data
    if key not in _models:
        if env is not None:
            files = [Path(p) for p in env.split(os.pathsep) if p and p != os.devnull]
        else:
            files = _packaged(family, lambda name: name.endswith("_model.json"))
        _models[key] = [(f.name, s) for f in files
                        for s in _well_formed(_read(f, "cost model"), f"cost model {f.name}",
                                              _model_ok)]  # fmt: skip
    return _models[key]


def _applies(header: dict, family: Family, target: Target, where: str) -> bool:
    """Whether a section measured on ``header``'s target applies here; a stale one (other Triton
    version or family abi) is ignored whole, with a warning."""
    if header.get("target") != target.name:
        return False
    if header.get("triton") != _triton_version():
        warnings.warn(
            f"{where} ignored: measured with Triton {header.get('triton')}, "
            f"installed is {_triton_version()}",
            TuningWarning,
            stacklevel=3,
        )
        return False
    abi = header.get("abi", {}).get(family.name)
    if abi != family.abi_version:
        warnings.warn(
            f"{where} ignored for family {family.name}: abi {abi}, "
            f"family is at abi {family.abi_version}",
            TuningWarning,
            stacklevel=3,
        )
        return False
    return True


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
    for s_index, section in enumerate(tuning_sections(family)):
        try:
            found = _tuned_in_section(candidate, family, specs, bucket, target, s_index, section)
        except (AttributeError, KeyError, TypeError, ValueError) as e:  # well-formed JSON, but
            warnings.warn(f"tuning table section {s_index} malformed, ignored: "  # not a table
                          f"{type(e).__name__}: {e}", TuningWarning, stacklevel=2)  # fmt: skip
            continue
        if found is not None:
            return found
    return None


def _tuned_in_section(candidate, family, specs, bucket, target, s_index, section):
    """``tuned_spec`` for one section (None where it has no matching entry)."""
    header = section["header"]
    entries = [e for e in section["entries"] if e["candidate"] == candidate.name]
    if not entries:
        return None
    where = f"section {s_index} (target {target.name}, triton {header.get('triton')})"
    if not _applies(header, family, target, f"tuning {where}"):
        return None
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


def modelled_spec(
    candidate: Candidate, family: Family, specs: list, problem: Any, target: Target
) -> tuple[Any, str] | None:
    """The spec of lowest predicted time under the first applying cost model section that
    models any of ``specs``, with a description naming the model and entry; None without one."""
    if candidate.predict is None:
        return None
    for name, section in model_sections(family):
        header = section["header"]
        if header.get("candidate") != candidate.name:
            continue
        try:
            if not _applies(header, family, target, f"cost model {name}"):
                continue
            preds = [p for p in candidate.predict(section["model"], specs, problem, target)
                     if p.spec in specs and isinstance(p.ms, (int, float)) and p.ms == p.ms]  # fmt: skip
        except (AttributeError, KeyError, TypeError, ValueError) as e:  # a malformed payload
            warnings.warn(f"cost model {name} malformed for {candidate.name}, ignored: "
                          f"{type(e).__name__}: {e}", TuningWarning, stacklevel=2)  # fmt: skip
            continue
        if not preds:
            continue
        ranked = sorted(preds, key=lambda p: p.ms)
        best = ranked[0]
        runner_up = f"; next {ranked[1].entry} {ranked[1].ms:.4g} ms" if len(ranked) > 1 else ""
        return best.spec, (
            f"cost model {name} ({header.get('kind', 'fitted')}; {header.get('device', '?')}, "
            f"{header.get('date', '?')}, triton {header.get('triton')}): {best.entry} predicted "
            f"{best.ms:.4g} ms, lowest of {len(preds)} modelled of {len(specs)} valid specs"
            f"{runner_up}"
        )
    return None


def choose_spec(
    candidate: Candidate, family: Family, specs: list, problem: Any, target: Target
) -> tuple[Any, str]:
    """The spec to run among ``specs`` (valid, in enumeration order) and why it was chosen."""
    tuned = tuned_spec(candidate, family, specs, problem, target)
    if tuned is not None:
        return tuned
    modelled = modelled_spec(candidate, family, specs, problem, target)
    if modelled is not None:
        return modelled
    if candidate.cost is not None:
        costs = [candidate.cost(spec, problem, target) for spec in specs]
        best = min(range(len(specs)), key=costs.__getitem__)
        return specs[best], f"heuristic cost {costs[best]:.4g} (lowest of {len(specs)} valid specs)"
    return specs[0], "priority"
