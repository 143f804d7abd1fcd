"""Results on disk: ``results.json`` written atomically, merged and validated."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .cases import (
    ResultsError,
)


def write_json(results: dict, out_dir: str | os.PathLike) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=2, default=_json_default) + "\n")
    tmp.replace(path)
    return path


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return str(x)


def _references(case: dict) -> list[str]:
    refs = case.get("references")
    if refs is None:  # results written before cases recorded them
        refs = ["kreg.split"] + ([case["peer"]] if case.get("peer") else [])
    return list(refs)


def _refs_by(cases) -> dict[tuple[str, ...], list[str]]:
    by: dict[tuple[str, ...], list[str]] = {}
    for c in cases:
        by.setdefault(tuple(f"ref {i + 1} = {r}" for i, r in enumerate(_references(c))),
                      []).append(c["name"])  # fmt: skip
    return by


def merge_results(parts: Sequence[dict], supersede: bool = False) -> dict:
    """One results dict from the runs of one scenario's disjoint case subsets (a scenario too
    large for one device call, run in parts on the same machine kind and software): cases in
    the parts' order, ``not_measured`` what no part measured, times summed. Parts of different
    scenarios, devices or software versions are refused: their ratios would not compare.
    ``supersede``: a case in several parts is taken from the last (a re-measurement after a
    change), the replaced runs' dates listed in ``superseded``; otherwise it is refused."""
    if not parts:
        raise ResultsError("nothing to merge")
    parts = [validate_results(p) for p in parts]
    first = parts[0]
    for p in parts[1:]:
        for field in ("scenario", "quick"):
            if p.get(field) != first.get(field):
                raise ResultsError(f"parts differ in {field!r}: {first.get(field)!r} vs "
                                   f"{p.get(field)!r}")  # fmt: skip
        for field in ("target", "device", "triton", "torch", "cuda"):
            if p["key"].get(field) != first["key"].get(field):
                raise ResultsError(f"parts differ in key.{field}: {first['key'].get(field)!r} "
                                   f"vs {p['key'].get(field)!r}")  # fmt: skip
    cases = [c for p in parts for c in p["cases"]]
    names = [c["name"] for c in cases]
    twice = sorted({n for n in names if names.count(n) > 1})
    superseded = []
    if twice and not supersede:
        raise ResultsError(f"cases in more than one part: {twice}")
    if twice:
        last = {c["name"]: i for i, p in enumerate(parts) for c in p["cases"]}
        for i, p in enumerate(parts):
            superseded += [{"case": c["name"], "measured": p["key"].get("date"),
                            "replaced_by": parts[last[c["name"]]]["key"].get("date")}
                           for c in p["cases"] if last[c["name"]] != i]  # fmt: skip
        cases = [c for i, p in enumerate(parts) for c in p["cases"] if last[c["name"]] == i]
        names = [c["name"] for c in cases]
    merged = dict(first, cases=cases)
    merged.pop("superseded", None)
    if superseded:
        merged["superseded"] = superseded
    merged["elapsed_s"] = sum(p.get("elapsed_s") or 0.0 for p in parts)
    merged["parts"] = [{"date": p["key"].get("date"), "elapsed_s": p.get("elapsed_s"),
                        "cases": len(p["cases"]), "precompile": p.get("precompile")}
                       for p in parts]  # fmt: skip
    measured = set(names)
    left = [n for p in parts for n in p.get("not_measured", []) if n not in measured]
    merged.pop("not_measured", None)
    if left:
        merged["not_measured"] = list(dict.fromkeys(left))
    return merged


def validate_results(results: Any) -> dict:
    """``results`` if it has the shape :func:`markdown` reads, else :class:`ResultsError`."""
    if not isinstance(results, dict):
        raise ResultsError(f"expected a JSON object, got {type(results).__name__}")
    if "cases" not in results:
        raise ResultsError(f"no 'cases' (keys: {', '.join(sorted(map(str, results))) or 'none'})")
    cases = results["cases"]
    if not isinstance(cases, list):
        raise ResultsError(f"'cases' must be a list, got {type(cases).__name__}")
    for i, case in enumerate(cases):
        if not isinstance(case, dict):
            raise ResultsError(f"cases[{i}] must be an object, got {type(case).__name__}")
        for field, kind in (("name", str), ("rows", list)):
            if not isinstance(case.get(field), kind):
                raise ResultsError(f"cases[{i}] lacks {field!r} ({kind.__name__})")
        for j, row in enumerate(case["rows"]):
            if not isinstance(row, dict) or not isinstance(row.get("impl"), str):
                raise ResultsError(f"cases[{i}].rows[{j}] must be an object with an 'impl'")
        for field in ("pairs", "skipped", "notes", "tags"):
            if not isinstance(case.get(field, []), list):
                raise ResultsError(f"cases[{i}].{field} must be a list")
        for j, sk in enumerate(case.get("skipped", [])):
            if not isinstance(sk, dict) or not all(isinstance(sk.get(k), str)
                                                   for k in ("impl", "reason")):  # fmt: skip
                raise ResultsError(f"cases[{i}].skipped[{j}] needs 'impl' and 'reason'")
        for j, p in enumerate(case.get("pairs", [])):
            if not isinstance(p, dict) or not all(isinstance(p.get(k), str)
                                                  for k in ("label", "impl", "peer")):  # fmt: skip
                raise ResultsError(f"cases[{i}].pairs[{j}] needs 'label', 'impl' and 'peer'")
    for field in ("key", "meta"):
        if not isinstance(results.get(field, {}), dict):
            raise ResultsError(f"{field!r} must be an object")
    return results
