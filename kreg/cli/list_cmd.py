"""``kreg list``: families, candidates, targets, plugin origins, the third-party plugins that
loaded (entry point, distribution and version, as pytest's header lists them), the broken ones
with their error, and warnings about plugins (hook-like functions not marked ``@hookimpl``).

``--json`` prints a coverage manifest: per candidate and target, how many enumerated specs are
valid on that target (hardware rules only, no problem) and why the others are rejected; per
family its docs page (an absolute path in a checkout, null from a wheel, which ships no docs).
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter

from ._util import dump_json, registry, table, wrap


def add_parser(subparsers):
    p = subparsers.add_parser("list", help="list families, candidates, targets and plugins")
    p.add_argument("--json", action="store_true", help="print a coverage manifest as JSON")
    return p


def run(args) -> int:
    reg = registry()
    print(dump_json(manifest(reg)) if args.json else text(reg))
    return 0


def _docs_path(relative: str) -> str | None:
    from kreg.checkout import checkout_root

    root = checkout_root()
    page = root / relative if root and relative else None
    return str(page) if page and page.is_file() else None


def coverage(candidate, target) -> dict:
    if candidate.targets is not None and target.name not in candidate.targets:
        return {"supported": False}
    try:
        with contextlib.redirect_stdout(sys.stderr):  # a plugin's prints never reach --json
            return _coverage(candidate, target)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - a plugin's rules must not take the listing down
        return {"supported": True, "error": f"{type(e).__name__}: {e}"[:300]}


def _coverage(candidate, target) -> dict:
    specs = list(candidate.enumerate_specs(target))
    reasons: Counter[str] = Counter()
    valid = 0
    for spec in specs:
        verdict = candidate.is_valid(spec, target)
        valid += verdict.ok
        reasons.update(verdict.reasons)
    return {
        "supported": True,
        "enumerated": len(specs),
        "valid": valid,
        "rejected": len(specs) - valid,
        "reasons": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def manifest(reg) -> dict:
    return {
        "targets": [
            {
                "name": t.name,
                "backend": t.backend,
                "arch": t.arch,
                "devices": list(t.devices),
                "verification": t.verification,
                "origin": reg.origin[t.name],
            }
            for t in reg.targets.values()
        ],
        "families": [
            {
                "name": f.name,
                "problem_type": f.problem_type.__name__,
                "abi_version": f.abi_version,
                "candidates": [c.name for c in f.candidates],
                # the page, where this kreg is a checkout that has it (a wheel ships no docs)
                "docs": _docs_path(f.docs),
                "docs_repo_path": f.docs or None,
                "description": f.description,
                "origin": reg.origin[f.name],
            }
            for f in reg.families.values()
        ],
        "candidates": [
            {
                "name": c.name,
                "family": c.family,
                "priority": c.priority,
                "opt_in": c.opt_in,
                "opt_in_reason": c.opt_in_reason,
                "spec_types": [t.__name__ for t in c.spec_types],
                "targets": list(c.targets) if c.targets is not None else None,
                "kernels": list(c.builders),
                "description": c.description,
                "origin": reg.origin[c.name],
                "coverage": {t.name: coverage(c, t) for t in reg.targets.values()},
            }
            for c in reg.candidates.values()
        ],
        "golden_cases": [
            {"name": g.name, "candidate": g.candidate, "origin": reg.origin[g.name]}
            for g in reg.golden_cases.values()
        ],
        "scenarios": [
            {"name": s.name, "family": s.family, "origin": reg.origin[s.name]}
            for s in reg.scenarios.values()
        ],
        "plugins": [
            {
                "name": info.name,
                "distribution": info.distribution,
                "version": info.version,
                "entry_point": info.value,
            }
            for info in reg.plugins.values()
        ],
        "broken": [{"plugin": p, "error": e, **_dist(reg, p)} for p, e in reg.broken],
        "warnings": [{"plugin": p, "warning": w} for p, w in reg.warnings],
    }


def _dist(reg, plugin: str) -> dict:
    info = reg.discovered.get(plugin)
    if info is None:  # e.g. named in KREG_PLUGINS but not installed
        return {"distribution": None, "version": None}
    return {"distribution": info.distribution, "version": info.version}


def _broken_label(reg, plugin: str) -> str:
    info = reg.discovered.get(plugin)
    return plugin if info is None or info.distribution is None else f"{plugin} ({info.label})"


def text(reg) -> str:
    out = ["Families"]
    out.append(
        table(
            [
                [
                    f.name,
                    f.problem_type.__name__,
                    f.abi_version,
                    len(f.candidates),
                    reg.origin[f.name],
                ]
                for f in reg.families.values()
            ],
            ["name", "problem", "abi", "candidates", "origin"],
            "  ",
        )
        if reg.families
        else "  (none)"
    )
    out += ["", "Candidates"]
    rows = []
    for c in reg.candidates.values():
        rows.append(
            [
                c.name,
                c.priority,
                "yes (below)" if c.opt_in else "no",
                ", ".join(t.__name__ for t in c.spec_types),
                ", ".join(c.targets) if c.targets is not None else "all",
                reg.origin[c.name],
            ]
        )
    out.append(
        table(rows, ["name", "priority", "opt-in", "spec types", "targets", "origin"], "  ")
        if rows
        else "  (none)"
    )
    opt_in = [c for c in reg.candidates.values() if c.opt_in]
    if opt_in:  # never selected by "auto": why, in full
        out += ["", "Opt-in candidates"]
        out += [wrap(f"  {c.name}: {c.opt_in_reason}", indent="    ") for c in opt_in]
    out += ["", "Targets"]
    out.append(
        table(
            [
                [
                    t.name,
                    t.backend,
                    t.arch,
                    ", ".join(t.devices),
                    t.verification,
                    reg.origin[t.name],
                ]
                for t in reg.targets.values()
            ],
            ["name", "backend", "arch", "devices", "verification", "origin"],
            "  ",
        )
    )
    out += ["", "Plugins"]
    out.append(
        table(
            [
                [i.name, i.distribution or "-", i.version or "-", i.value]
                for i in reg.plugins.values()
            ],
            ["entry point", "distribution", "version", "module"],
            "  ",
        )
        if reg.plugins
        else "  (no third-party plugins loaded)"
    )
    if reg.warnings:
        out += ["", "Plugin warnings"]
        out += [f"  {plugin}: {warning}" for plugin, warning in reg.warnings]
    if reg.broken:
        out += ["", "Broken plugins (skipped)"]
        out += [f"  {_broken_label(reg, plugin)}: {error}" for plugin, error in reg.broken]
    return "\n".join(out)
