"""Generated documentation: the families table of ``docs/index.md`` and each family's page.

Generated parts sit between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``; the
hand-written prose around them is kept as it is. ``kreg docs --write`` regenerates every block
(creating a page from a template when it does not exist yet); ``kreg docs --check`` fails when a
block is stale or missing. Everything generated is derived from the registry: the problem type's
fields, the candidates and their spec types, the rules' own rejection reasons, and the
dispatcher's trace for the family's default problem.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from kreg.checkout import PACKAGE_PARENT
from kreg.registry.model import Candidate, Family

ROOT = PACKAGE_PARENT
INDEX = Path("docs") / "index.md"
WRITE_COMMAND = "kreg docs --write"
END = "<!-- end generated -->"
_BLOCK = re.compile(r"<!-- generated: ([\w.-]+) -->\n(.*?)" + re.escape(END), re.S)
EXPLAIN_TARGET = "sm90"
REJECTED_PER_TARGET = 3


def begin(name: str) -> str:
    return f"<!-- generated: {name} -->"


def block(name: str, body: str) -> str:
    return f"{begin(name)}\n{body.rstrip()}\n{END}"


# --- block contents -----------------------------------------------------------------------------


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _type_name(annotation: Any) -> str:
    if annotation is None:
        return ""
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default(field: attrs.Attribute) -> str:
    default = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return f"{default.factory.__name__}()"
    return f"`{default!r}`"


def fields_table(cls: type) -> str:
    rows = ["| field | type | default |", "| --- | --- | --- |"]
    for f in attrs.fields(cls):
        rows.append(f"| `{f.name}` | `{_md(_type_name(f.type))}` | {_md(_default(f))} |")
    return "\n".join(rows)


def _doc_line(obj: Any) -> str:
    doc = (obj.__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def families_table(registry) -> str:
    rows = [
        "| family | problem type | candidates | targets | description | page |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for family in registry.families.values():
        cands = ", ".join(
            f"`{c.name}`" + (" (opt-in)" if c.opt_in else "")
            for c in sorted(family.candidates, key=lambda c: (-c.priority, c.name))
        )
        targets = sorted(
            {t for c in family.candidates for t in (c.targets or registry.targets)},
            key=list(registry.targets).index,
        )
        page = f"[{family.docs}]({_rel(family.docs, INDEX)})" if family.docs else "—"
        rows.append(
            f"| {family.name} | `{family.problem_type.__name__}` | {cands} | "
            f"{', '.join(targets)} | {_md(family.description)} | {page} |"
        )
    return "\n".join(rows)


def _rel(path: str, base: Path) -> str:
    import os

    return Path(os.path.relpath(Path(path), base.parent)).as_posix()


def problem_block(family: Family) -> str:
    cls = family.problem_type
    return f"`{cls.__module__}.{cls.__name__}`: {_doc_line(cls)}\n\n{fields_table(cls)}\n"


def candidates_block(registry, family: Family) -> str:
    out = []
    for c in family.candidates:
        out.append(f"### `{c.name}`\n")
        status = f"opt-in: {c.opt_in_reason}" if c.opt_in else "selected automatically"
        out.append(
            f"{c.description}. Priority {c.priority}; {status}. Kernels: "
            + ", ".join(f"`{k}`" for k in c.builders)
            + ". Targets: "
            + (", ".join(c.targets) if c.targets is not None else "every registered target")
            + ".\n"
        )
        for spec_type in c.spec_types:
            out.append(f"`{spec_type.__name__}`: {_doc_line(spec_type)}\n")
            out.append(fields_table(spec_type) + "\n")
        enumerated = list(c.enumerate_specs(next(iter(registry.targets.values()))))
        if enumerated:
            composite = type(enumerated[0])
            if composite not in c.spec_types:
                names = ", ".join(f"`{f.name}`" for f in attrs.fields(composite))
                out.append(
                    f"The candidate's specs are `{composite.__name__}` ({names}): "
                    f"{_doc_line(composite)}\n"
                )
    return "\n".join(out)


def _spec_diff(spec: Any, base: Any, prefix: str = "") -> list[str]:
    """``field=value`` for every field of ``spec`` that differs from ``base`` (nested specs)."""
    out = []
    for f in attrs.fields(type(spec)):
        a, b = getattr(spec, f.name), getattr(base, f.name, None)
        if attrs.has(type(a)) and type(a) is type(b):
            out += _spec_diff(a, b, f"{prefix}{f.name}.")
        elif a != b:
            out.append(f"{prefix}{f.name}={a!r}")
    return out


def _spec_text(spec: Any) -> str:
    try:
        base = type(spec)()
    except TypeError:
        return repr(spec)
    diff = _spec_diff(spec, base)
    return f"{type(spec).__name__}({', '.join(diff)})" if diff else f"{type(spec).__name__}()"


def rules_block(registry, family: Family) -> str:
    out = [
        "Validity rules answer with every reason against a spec (`Verdict.reasons`). Hardware "
        "rules take only the target; problem rules (numeric range) also take the problem. "
        f"Below, for each candidate and target, up to {REJECTED_PER_TARGET} enumerated specs "
        "rejected by the hardware rules, each with a different reason (specs shown as their "
        "differences from the spec type's defaults), then the problem rules seen on the "
        "family's probe problems.\n",
    ]
    for c in family.candidates:
        out.append(f"#### `{c.name}`\n")
        for target in registry.targets.values():
            if c.targets is not None and target.name not in c.targets:
                out.append(f"- {target.name}: not a target of this candidate")
                continue
            specs = list(c.enumerate_specs(target))
            shown: dict[str, Any] = {}
            valid = 0
            for spec in specs:
                v = c.is_valid(spec, target)
                valid += v.ok
                key = v.reasons[0] if v.reasons else None
                if key and _template(key) not in {_template(k) for k in shown}:
                    shown[key] = (spec, v)
            out.append(f"- {target.name}: {valid} of {len(specs)} enumerated specs valid")
            for spec, v in list(shown.values())[:REJECTED_PER_TARGET]:
                out.append(f"  - `{_md(_spec_text(spec))}`")
                out += [f"    - {_md(r)}" for r in v.reasons]
        out.append("")
        problem_reasons = _problem_reasons(registry, c)
        if problem_reasons:
            out.append("Problem rules:\n")
            out += [f"- {_md(label)}: {_md(reason)}" for label, reason in problem_reasons]
            out.append("")
    return "\n".join(out)


def _template(reason: str) -> str:
    return re.sub(r"\d+", "N", reason)


def _problem_reasons(registry, c: Candidate) -> list[tuple[str, str]]:
    """(probe, reason) for problem-rule rejections of otherwise valid specs, on the first
    target: each distinct reason once."""
    from kreg.matrix import probe_of

    probe = probe_of(c.problem_type)
    if probe is None or c.specialize is None:
        return []
    target = next(iter(registry.targets.values()))
    base = probe.make(registry.families[c.family], "bf16", 128)
    variations: list[tuple[str, Any]] = [("default problem", base)]
    for option in probe.options:
        try:
            variations.append((option.label, attrs.evolve(base, **option.overrides)))
        except (ValueError, TypeError):
            continue
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    hardware_ok = [s for s in c.enumerate_specs(target) if c.is_valid(s, target).ok]
    for label, problem in variations:
        accept = c.accepts(problem)
        reasons = list(accept.reasons)
        if accept.ok:
            for spec in hardware_ok:
                s = c.specialize(spec, problem)
                if s is None or not c.is_valid(s, target).ok:
                    continue
                reasons += [r for r in c.is_valid(s, target, problem).reasons]
        for reason in dict.fromkeys(reasons):
            if _template(reason) not in seen:
                seen.add(_template(reason))
                out.append((f"{label} on {target.name}", reason))
    return out


def dispatch_block(registry, family: Family, explain: Callable[[list[str]], str]) -> str:
    from kreg.dispatch import NoCandidateError, select

    problem = family.problem()
    rows = ["| target | selected | spec | decided by |", "| --- | --- | --- | --- |"]
    for target in registry.targets.values():
        try:
            sel = select(problem, target, family=family.name)
        except NoCandidateError as e:
            first = str(e).splitlines()[0]
            rows.append(f"| {target.name} | none | — | {_md(first)} |")
            continue
        rows.append(
            f"| {target.name} | `{sel.candidate.name}` | `{_md(_spec_text(sel.spec))}` | "
            f"{_md(sel.decided_by)} |"
        )
    command = ["explain", family.name, "--target", EXPLAIN_TARGET, "--verbose"]
    return (
        f"For the family's default problem (`{family.problem_type.__name__}.from_options("
        f"{dict(family.default_options)})`):\n\n"
        + "\n".join(rows)
        + f"\n\nThe evidence, `kreg {' '.join(command)}`:\n\n```text\n"
        + explain(command).rstrip()
        + "\n```\n"
    )


# --- pages --------------------------------------------------------------------------------------


INDEX_TEMPLATE = """# kreg documentation

kreg is a kernel registry and dispatch framework: kernel families register, through plugins,
a problem type and candidates whose specs are enumerated, validated (with reasons) and compiled
per hardware target, and `kreg.dispatch.select` picks one for a problem (`kreg explain`).

## Families

{families}

## Reference

- [Dispatch](dispatch.md): how a candidate and spec are selected, the trace, opt-in.
- [Support matrix](../SUPPORT_MATRIX.md): what every candidate claims on every target
  (generated by `kreg matrix --write`).
- Golden IR: `golden/ir_sha256.json`, checked by `kreg golden check`.
"""

FAMILY_TEMPLATE = """# {name}: {description}

## Problem (generated)

{problem}

## Candidates (generated)

{candidates}

## Rules (generated)

{rules}

## Dispatch default (generated)

{dispatch}
"""


def index_blocks(registry) -> dict[str, str]:
    return {"families": families_table(registry)}


def family_blocks(registry, family: Family, explain) -> dict[str, str]:
    return {
        "problem": problem_block(family),
        "candidates": candidates_block(registry, family),
        "rules": rules_block(registry, family),
        "dispatch": dispatch_block(registry, family, explain),
    }


def pages(registry, explain, root: Path = ROOT) -> list[tuple[Path, dict, str]]:
    """(path, generated blocks, template) of every generated page."""
    out = [(root / INDEX, index_blocks(registry), INDEX_TEMPLATE)]
    for family in registry.families.values():
        if not family.docs:
            continue
        template = FAMILY_TEMPLATE.replace("{name}", family.name).replace(
            "{description}", family.description or family.name
        )
        out.append((root / family.docs, family_blocks(registry, family, explain), template))
    return out


def fill(text: str | None, blocks: dict[str, str], template: str) -> str:
    """``text`` (or ``template`` when None) with every generated block replaced; blocks missing
    from an existing page are appended at its end."""
    if text is None:
        return template.format(**{k: block(k, v) for k, v in blocks.items()})
    present = {m.group(1) for m in _BLOCK.finditer(text)}

    def sub(m: re.Match) -> str:
        name = m.group(1)
        return block(name, blocks[name]) if name in blocks else m.group(0)

    text = _BLOCK.sub(sub, text)
    for name, body in blocks.items():
        if name not in present:
            text = text.rstrip("\n") + "\n\n" + block(name, body) + "\n"
    return text


def stale(registry, explain, root: Path = ROOT) -> list[str]:
    """One message per page that ``kreg docs --write`` would change."""
    out = []
    for path, blocks, template in pages(registry, explain, root):
        if not path.exists():
            out.append(f"{path.relative_to(root)} does not exist")
            continue
        text = path.read_text()
        names = [m.group(1) for m in _BLOCK.finditer(text)]
        missing = [n for n in blocks if n not in names]
        if missing:
            out.append(f"{path.relative_to(root)} lacks the generated block(s) {missing}")
        elif fill(text, blocks, template) != text:
            changed = [
                m.group(1) for m in _BLOCK.finditer(text)
                if m.group(1) in blocks and m.group(0) != block(m.group(1), blocks[m.group(1)])
            ]  # fmt: skip
            out.append(f"{path.relative_to(root)}: generated block(s) {changed} are stale")
    return out


def write(registry, explain, root: Path = ROOT) -> list[Path]:
    written = []
    for path, blocks, template in pages(registry, explain, root):
        text = path.read_text() if path.exists() else None
        new = fill(text, blocks, template)
        if new != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(new)
            written.append(path)
    return written
