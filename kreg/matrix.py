"""The support matrix: what every candidate claims on every target, derived from its rules.

Nothing here is hand-maintained. Per family × candidate × target the claims come from the
candidate's own enumeration and validity rules: every enumerated spec valid on the target
(hardware rules) is specialised to probe problems (each dtype and head dim, then each option of
the problem type turned on) and validated against the problem; a (dtype, head dim, chunk)
cell, a gate activation or an option is claimed when some specialised spec is valid. Probed
values that nothing serves are listed with the reason. ``kreg matrix --write`` renders it to
``SUPPORT_MATRIX.md``; ``kreg matrix --check`` fails when that file is stale.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from kreg.checkout import PACKAGE_PARENT, repo_root
from kreg.problems.probe import Probe
from kreg.registry.manager import BUILTIN_PREFIX
from kreg.registry.model import Candidate, Target, Verdict

ROOT = PACKAGE_PARENT
MATRIX_FILE = "SUPPORT_MATRIX.md"
WRITE_COMMAND = "kreg matrix --write"

VERIFICATION = {
    "gpu": "GPU-verified (numerics run on hardware by the GPU lane)",
    "compile": "compiled + golden-hashed (never executed here)",
}
# CPU runs select specs with this target's rules (the interpreter has no target of its own), so
# only its row can claim interpreter coverage of the specs it would pick.
INTERPRETER_TARGET = "sm90"
INTERPRETER = "interpreter-verified (CPU, fp16/fp32, on the specs this target selects)"
NOT_INTERPRETED = f"its own specs never run (the interpreter lane runs {INTERPRETER_TARGET}'s)"
# kreg's lanes (GPU, interpreter, goldens in golden/) cover its built-in families only
THIRD_PARTY = "third-party (kreg's lanes run none of it: see its own project)"


def default_path(root: Path | None = None) -> Path:
    """``SUPPORT_MATRIX.md`` of ``root``, or of the checkout kreg runs from."""
    return repo_root(root) / MATRIX_FILE


# --- probes: each problem type declares its own (``matrix_probe``, kreg/problems/probe.py) ----


def probe_of(problem_type: type) -> Probe | None:
    """How the matrix probes ``problem_type`` (its ``matrix_probe()``), or None: a problem type
    without one gets rows without cells."""
    make = getattr(problem_type, "matrix_probe", None)
    return make() if callable(make) else None


# --- spec helpers (family-agnostic: nested attrs specs) -------------------------------------------


def spec_values(spec: Any, name: str) -> list[Any]:
    """Values of every field called ``name`` in ``spec`` and its nested attrs specs."""
    if not attrs.has(type(spec)):
        return []
    out = []
    for f in attrs.fields(type(spec)):
        value = getattr(spec, f.name)
        if f.name == name:
            out.append(value)
        out += spec_values(value, name)
    return out


def spec_value(spec: Any, name: str) -> Any:
    values = list(dict.fromkeys(spec_values(spec, name)))
    return values[0] if len(values) == 1 else None


def evolve_deep(spec: Any, **changes) -> Any:
    """``spec`` with every field named in ``changes`` replaced, at any nesting depth."""
    if not attrs.has(type(spec)):
        return spec
    updates = {}
    for f in attrs.fields(type(spec)):
        value = getattr(spec, f.name)
        if f.name in changes:
            updates[f.name] = changes[f.name]
        elif attrs.has(type(value)):
            updates[f.name] = evolve_deep(value, **changes)
    return attrs.evolve(spec, **updates)


# --- the matrix -------------------------------------------------------------------------------------


@attrs.frozen
class Cell:
    dtype: str
    head_dim_k: int
    head_dim_v: int
    chunk: Any
    spec: Any = attrs.field(eq=False)  # a specialised spec valid for the cell (the witness)
    problem: Any = attrs.field(eq=False)


@attrs.frozen
class Row:
    family: str
    candidate: str
    target: str
    supported: bool
    opt_in: bool = False
    opt_in_reason: str = ""
    enumerated: int = 0
    valid: int = 0
    reasons: tuple[tuple[str, int], ...] = ()  # hardware rejection reasons, most frequent first
    cells: tuple[Cell, ...] = ()
    features: dict = attrs.field(factory=dict)  # column -> claimed labels
    # (dtype, head dim) or option label -> the first reason nothing serves it
    unclaimed: dict = attrs.field(factory=dict)
    verification: str = ""
    golden: int = 0  # golden kernels pinned for this candidate on this target

    @property
    def rejected(self) -> int:
        return self.enumerated - self.valid

    def column(self, name: str) -> list:
        if name == "dtypes":
            return list(dict.fromkeys(c.dtype for c in self.cells))
        if name == "head dims":
            dims = sorted({(c.head_dim_k, c.head_dim_v) for c in self.cells})
            return [str(k) if k == v else f"{k}x{v}" for k, v in dims]
        if name == "chunks":
            return sorted({c.chunk for c in self.cells if c.chunk is not None})
        return list(self.features.get(name, ()))


def _first_valid(c: Candidate, target: Target, specs: Sequence, problem) -> tuple[Any, Verdict]:
    """The first enumerated spec that, specialised to ``problem``, is valid; else the reasons."""
    verdict = c.accepts(problem)
    if not verdict.ok:
        return None, verdict
    reasons: dict[str, None] = {}
    matched = False
    for spec in specs:
        s = c.specialize(spec, problem) if c.specialize is not None else spec
        if s is None:
            continue
        matched = True
        v = c.is_valid(s, target, problem)
        if v.ok:
            return s, v
        reasons.update(dict.fromkeys(v.reasons))
    if not matched:
        return None, Verdict(("no enumerated spec matches the problem's shape",))
    return None, Verdict(tuple(reasons))


def candidate_row(registry, c: Candidate, target: Target, golden_counts: dict) -> Row:
    base = dict(family=c.family, candidate=c.name, target=target.name)
    if c.targets is not None and target.name not in c.targets:
        return Row(**base, supported=False)
    enumerated = list(c.enumerate_specs(target))
    reasons: Counter[str] = Counter()
    valid_specs = []
    for spec in enumerated:
        v = c.is_valid(spec, target)
        if v.ok:
            valid_specs.append(spec)
        reasons.update(v.reasons)
    cells: list[Cell] = []
    features: dict[str, list[str]] = {}
    unclaimed: dict[str, str] = {}
    probe = probe_of(c.problem_type)
    if probe is not None:
        family = registry.families[c.family]
        cells, features, unclaimed = _probe(c, family, target, valid_specs, enumerated, probe)
    verification = "; ".join([
        VERIFICATION.get(target.verification, target.verification),
        INTERPRETER if target.name == INTERPRETER_TARGET else NOT_INTERPRETED,
    ])  # fmt: skip
    if not registry.origin.get(c.name, "").startswith(BUILTIN_PREFIX):
        verification = THIRD_PARTY
    return Row(
        **base, supported=True, opt_in=c.opt_in, opt_in_reason=c.opt_in_reason,
        enumerated=len(enumerated), valid=len(valid_specs),
        reasons=tuple(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        cells=tuple(cells), features=features, unclaimed=unclaimed, verification=verification,
        golden=golden_counts.get((c.name, target.name), 0),
    )  # fmt: skip


def _probe(c: Candidate, family, target: Target, specs: list, enumerated: list, probe: Probe):
    cells: list[Cell] = []
    unclaimed: dict[str, str] = {}
    for dtype in probe.dtypes:
        for d in probe.head_dims:
            problem = probe.make(family, dtype, d)
            seen = set()
            for spec in specs:
                verdict = c.accepts(problem)
                s = c.specialize(spec, problem) if c.specialize is not None else spec
                if not verdict.ok or s is None or not c.is_valid(s, target, problem).ok:
                    continue
                cell = Cell(dtype, d, d, spec_value(s, "chunk"), s, problem)
                if cell not in seen:
                    seen.add(cell)
                    cells.append(cell)
            if not seen:  # the reason: from every enumerated spec, not only the valid ones
                _, verdict = _first_valid(c, target, enumerated, problem)
                unclaimed[(dtype, d)] = verdict.reasons[0] if verdict.reasons else "?"
    features: dict[str, list[str]] = {}
    if cells:
        # options are probed at the most representative claimed cell: bf16 (else the first
        # claimed dtype) at the largest claimed head dim
        dtype = "bf16" if any(x.dtype == "bf16" for x in cells) else cells[0].dtype
        d = max(x.head_dim_k for x in cells if x.dtype == dtype)
        base = probe.make(family, dtype, d)
        for option in probe.options:
            try:
                problem = attrs.evolve(base, **option.overrides)
            except (ValueError, TypeError) as e:
                unclaimed[option.label] = f"problem rejected: {e}"
                continue
            spec, verdict = _first_valid(c, target, specs, problem)
            if spec is not None:
                features.setdefault(option.column, []).append(option.label)
            else:
                unclaimed[option.label] = verdict.reasons[0] if verdict.reasons else "?"
    cells.sort(key=lambda x: (probe.dtypes.index(x.dtype), x.head_dim_k, x.chunk or 0))
    return cells, features, unclaimed


def golden_counts(registry) -> dict[tuple[str, str], int]:
    """Golden kernels per (candidate, target), from the golden plan (no compile)."""
    from kreg import golden

    the_plan = golden.plan(registry)
    counts: Counter = Counter()
    for job in the_plan.jobs:
        counts[(job.candidate, job.target)] += len(job.kernels)
    return dict(counts)


def build(registry) -> list[Row]:
    counts = golden_counts(registry)
    return [
        candidate_row(registry, c, t, counts)
        for family in registry.families.values()
        for c in family.candidates
        for t in registry.targets.values()
    ]


def explain_cell(c: Candidate, target: Target, **fields) -> Verdict:
    """Why a (dtype, head dim, chunk, ...) cell is or is not served: the verdict of the first
    valid enumerated spec of ``c`` on ``target`` with ``fields`` set at every nesting level."""
    specs = [s for s in c.enumerate_specs(target) if c.is_valid(s, target).ok]
    if not specs:
        return Verdict((f"{c.name} has no valid spec on {target.name}",))
    return c.is_valid(evolve_deep(specs[0], **fields), target)


# --- rendering ----------------------------------------------------------------------------------

MAX_REASONS = 3
COLUMNS = ("dtypes", "head dims", "chunks", "gate activations", "options", "states / layouts")


def _join(values) -> str:
    return ", ".join(str(v) for v in values) or "—"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|")


def terminal_rows(registry, rows: list[Row] | None = None) -> list[dict]:
    """The matrix's main table for a terminal (``kreg matrix``), one dict per row; the file's
    every column and section stay in ``render`` (``kreg matrix --markdown``)."""
    rows = build(registry) if rows is None else rows
    out = []
    for r in rows:
        served = r.supported
        out.append({
            "candidate": r.candidate, "target": r.target,
            "opt-in": ("yes" if r.opt_in else "no") if served else "—",
            "dtypes": _join(r.column("dtypes")) if served else "not a target",
            "head dims": _join(r.column("head dims")) if served else "",
            "specs ok / rejected": f"{r.valid} / {r.rejected}" if served else "",
            "golden": str(r.golden) if served else "",
            "verification": _short(r.verification) if served else "",
        })  # fmt: skip
    return out


def _short(verification: str) -> str:
    """ "GPU, interpreter": the verification's kinds without their glosses (the file's legend
    has them)."""
    kinds = (re.sub(r"\s*\(.*", "", part).strip() for part in verification.split("; "))
    return ", ".join(k.removesuffix("-verified") for k in kinds if not k.startswith("its own"))


def render(registry, rows: list[Row] | None = None) -> str:
    rows = build(registry) if rows is None else rows
    out = [
        "# Support matrix",
        "",
        f"<!-- generated by `{WRITE_COMMAND}` from the registered candidates' enumerations and "
        "validity rules; do not edit: `kreg matrix --check` fails when it is stale -->",
        "",
        "One row per family × candidate × target. Every claim is derived: an enumerated spec valid "
        "on the target (hardware rules) is specialised to probe problems (each dtype and head "
        "dim K = V, then each option turned on) and validated against the problem. A claimed "
        "head dim is served, not necessarily native: a family may run it padded (KDA zero-pads "
        "any K, V <= 256 to 32, 64, 128 or 256, exactly). Chunks are "
        "those of the specs serving the claimed cells. *Specs* counts the enumerated specs valid "
        "/ rejected by the hardware rules alone. Verification says how this project checks the "
        "target: GPU-verified (numerics run on hardware by the GPU lane), compiled + "
        "golden-hashed (normalised IR pinned in `golden/ir_sha256.json`, never executed here), "
        f"and interpreter-verified on {INTERPRETER_TARGET} (the kernels' numerics run on CPU "
        f"under the Triton interpreter, fp16/fp32 only, with the specs {INTERPRETER_TARGET}'s "
        "rules select: bf16 and other targets' selections never run there).",
        "",
    ]
    header = ["family", "candidate", "target", "opt-in", *COLUMNS, "specs valid / rejected",
              "golden kernels", "verification"]  # fmt: skip
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + " --- |" * len(header))
    for r in rows:
        if not r.supported:
            cells = (
                [r.family, f"`{r.candidate}`", r.target, "—"]
                + ["not a target"]
                + [""] * (len(header) - 5)
            )
        else:
            cells = [
                r.family, f"`{r.candidate}`", r.target,
                "yes (see below)" if r.opt_in else "no",
                *[_join(r.column(col)) for col in COLUMNS],
                f"{r.valid} / {r.rejected}", str(r.golden), r.verification,
            ]  # fmt: skip
        out.append("| " + " | ".join(_md(x) for x in cells) + " |")
    opt_ins = {r.candidate: r.opt_in_reason for r in rows if r.supported and r.opt_in}
    if opt_ins:
        out += ["", "## Opt-in candidates", ""]
        out += [
            f'- `{name}`: never selected by `algorithm="auto"`; {reason}'
            for name, reason in opt_ins.items()
        ]
    out += ["", "## Claimed cells", "",
            "Per candidate × target: dtype × head dim → the chunks of the specs serving it.", ""]  # fmt: skip
    for r in rows:
        if not r.supported:
            continue
        out.append(f"- `{r.candidate}` on {r.target}: " + (_cells_text(r) or "nothing claimed"))
    probes = [
        probe_of(t) for t in dict.fromkeys(f.problem_type for f in registry.families.values())
    ]
    dtypes = tuple(dict.fromkeys(dt for p in probes if p is not None for dt in p.dtypes))
    out += ["", "## Not claimed", "",
            "Probed values no spec serves, with the first reason the rules give.", ""]  # fmt: skip
    for r in rows:
        if not r.supported or not r.unclaimed:
            continue
        out.append(f"- `{r.candidate}` on {r.target}:")
        for reason, labels in _unclaimed_groups(r.unclaimed, dtypes).items():
            out.append(f"  - {labels}: {_md(reason)}")
    out += ["", "## Rejected enumerated specs", "",
            "Hardware-rule rejection reasons of the enumerated specs (count of specs).", ""]  # fmt: skip
    for r in rows:
        if not r.supported:
            continue
        out.append(f"- `{r.candidate}` on {r.target}: {r.rejected} of {r.enumerated} rejected")
        out += [f"  - {n}× {_md(reason)}" for reason, n in r.reasons[:MAX_REASONS]]
        if len(r.reasons) > MAX_REASONS:
            out.append(f"  - … and {len(r.reasons) - MAX_REASONS} more distinct reasons")
    return "\n".join(out) + "\n"


def _unclaimed_groups(unclaimed: dict, dtypes: tuple[str, ...]) -> dict[str, str]:
    """reason -> "d16, d48 (every dtype); fp32 d128; softplus" for the Not claimed section."""
    by_reason: dict[str, dict] = {}
    for label, reason in unclaimed.items():
        by_reason.setdefault(reason, {})[label] = None
    out = {}
    for reason, labels in by_reason.items():
        dims: dict[int, list[str]] = {}
        names = []
        for label in labels:
            if isinstance(label, tuple):
                dims.setdefault(label[1], []).append(label[0])
            else:
                names.append(label)
        every = [d for d, dts in dims.items() if set(dts) >= set(dtypes)]
        parts = [f"{', '.join(f'd{d}' for d in every)} (every dtype)"] if every else []
        parts += [f"{'/'.join(dts)} d{d}" for d, dts in dims.items() if d not in every]
        out[reason] = "; ".join(parts + names)
    return out


def _cells_text(r: Row) -> str:
    groups: dict[tuple[str, int, int], list] = {}
    for c in r.cells:
        groups.setdefault((c.dtype, c.head_dim_k, c.head_dim_v), []).append(c.chunk)
    return "; ".join(
        f"{dt} d{k if k == v else f'{k}x{v}'} → "
        + (", ".join(str(x) for x in sorted({c for c in chunks if c is not None})) or "—")
        for (dt, k, v), chunks in groups.items()
    )


def check(registry, path: Path | None = None) -> tuple[bool, str]:
    path = Path(path or default_path())
    want = render(registry)
    if not path.exists():
        return False, f"{path} does not exist: run `{WRITE_COMMAND}`"
    if path.read_bytes() != want.encode():
        return False, f"{path} is stale (the registered rules changed): run `{WRITE_COMMAND}`"
    return True, f"{path} is up to date"


def write(registry, path: Path | None = None) -> Path:
    path = Path(path or default_path())
    path.write_text(render(registry))
    return path
