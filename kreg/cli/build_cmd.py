"""``kreg build CANDIDATE --target T``: compile a candidate's kernels for a target (no GPU needed)
and print each kernel's resource use, or one IR stage.

CANDIDATE is a candidate name, or a family name for the candidate the dispatcher selects for
the family's default problem. Without ``--spec`` the spec is the one the dispatcher selects for
the default problem (``family.problem()``), else (no problem options given) the
first valid enumerated spec; problem options the candidate cannot serve are an error;
``--spec field=value`` overrides fields of it (``tile.chunk=32`` for nested specs). The kernels
are the ones a launch for that default problem runs (Triton specialises them on its integer
arguments); without a problem, the family's representative ones (what the goldens hold).
"""

from __future__ import annotations

import argparse
import sys

from ._util import (
    CliError,
    check_spec,
    dump_json,
    get_target,
    jsonable,
    override_spec,
    parse_assignments,
    problem_from_options,
    problem_options_help,
    registry,
    short_repr,
    spec_choice_in_words,
    table,
    wrap,
)

STAGES = ("ttir", "ttgir", "llir", "ptx", "amdgcn")


def add_parser(subparsers):
    p = subparsers.add_parser(
        "build",
        help="compile a candidate's kernels for a target",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=problem_options_help,
    )
    p.add_argument("candidate", help="candidate name (e.g. kda.split) or family name")
    p.add_argument("options", nargs="*", default=[], metavar="key=value",
                   help="problem options, as kreg explain takes them (default: the family's "
                        "default problem)")  # fmt: skip
    p.add_argument("--target", required=True, help="target name, e.g. sm90")
    p.add_argument("--spec", nargs="+", default=[], metavar="field=value", help="spec overrides")
    p.add_argument("--stage", choices=STAGES, help="print this IR stage instead of resources")
    p.add_argument("--kernel", help="build only this kernel of the candidate")
    p.add_argument("--json", action="store_true", help="print resources (or the stage) as JSON")
    return p


def run(args) -> int:
    target = get_target(args.target)
    candidate, spec, how, problem, decided_by = resolve(
        args.candidate, target, parse_assignments(args.options, "problem option")
    )
    if args.spec:
        try:
            spec = override_spec(spec, parse_assignments(args.spec, "spec override"))
        except CliError as e:
            if "unknown spec field" in str(e) and any(
                "." not in x.split("=")[0] for x in args.spec
            ):
                raise CliError(f"{e} (problem options key=value go before --spec)") from e
            raise
        how, decided_by = "with overrides " + " ".join(args.spec), None
    check_spec(candidate, spec, target, args.spec)
    builders = dict(candidate.builders)
    if args.kernel is not None:
        if args.kernel not in builders:
            raise CliError(
                f"unknown kernel {args.kernel!r}; {candidate.name} has: {', '.join(builders)}"
            )
        builders = {args.kernel: builders[args.kernel]}
    try:
        artifacts = compile_all(builders, spec, target, problem)
    except Exception as e:
        if not args.spec:
            raise  # the dispatcher's own spec failing to compile is a bug, not a user error
        from kreg.golden import _error_line

        raise CliError(
            f"{candidate.name} with --spec {' '.join(args.spec)} passes its validity rules but "
            f"does not compile for {target.name}: {_error_line(e)}"
        ) from e
    if not artifacts:
        raise CliError(
            f"{short_repr(spec)} uses none of the kernels asked for ({', '.join(builders)})"
        )

    if args.stage:
        for art in artifacts.values():
            if args.stage not in art.stages:
                have = ", ".join(art.stages)
                raise CliError(f"stage {args.stage} not produced for {target.name}; have: {have}")
        if args.json:
            kernels = [{"kernel": name, "function": art.kernel, "stage": args.stage,
                        "text": art.stages[args.stage]} for name, art in artifacts.items()]  # fmt: skip
            print(dump_json({"candidate": candidate.name, "target": target.name,
                             "spec": jsonable(spec), "spec_source": how, "kernels": kernels}))  # fmt: skip
            return 0
        for name, art in artifacts.items():
            if len(artifacts) > 1:
                print(f"// ===== kernel {name} ({art.kernel}) =====")
            print(art.stages[args.stage], end="" if art.stages[args.stage].endswith("\n") else "\n")
        return 0
    rows = [
        {
            "kernel": name,
            "function": a.kernel,
            "shared_bytes": a.shared_bytes,
            "registers": a.registers,
            "spills": a.spills,
            "num_warps": a.num_warps,
        }
        for name, a in artifacts.items()
    ]
    if args.json:
        out = {"candidate": candidate.name, "target": target.name, "spec": jsonable(spec)}
        print(dump_json({**out, "spec_source": how, "kernels": rows}))
        return 0
    head = [["candidate", candidate.name], ["target", target.name], ["spec", short_repr(spec)],
            ["chosen", how]]  # fmt: skip
    print(wrap(in_words(candidate, target, problem, decided_by, args)) + "\n")
    print(table(head, ["", ""]).split("\n", 1)[1] + "\n")
    print(table([[("-" if v is None else v) for v in r.values()] for r in rows], list(rows[0])))
    spilled = [(r["kernel"], r["spills"]) for r in rows if r["spills"]]
    if spilled:
        print("\n" + wrap(spill_note(spilled, target, decided_by)))
    return 0


def in_words(candidate, target, problem, decided_by, args) -> str:
    """What was built, and from which spec, in a sentence."""
    if args.spec:
        source = f"the spec as your --spec {' '.join(args.spec)} changed it"
    elif problem is None:
        source = "its first valid spec (no problem to select one for)"
    else:
        whose = "this problem" if args.options else "the family's default problem"
        source = f"the spec kreg selects for {whose} (below)"
    text = f"Compiled {candidate.name}'s kernels for {target.name} with {source}."
    if decided_by is not None:
        text += " " + spec_choice_in_words(decided_by, target.name)
    return text


def spill_note(spilled: list, target, decided_by: str | None) -> str:
    """What the spill counts mean, and whether they were measured, from the build's numbers."""
    unit = "registers" if target.backend == "hip" else "bytes"  # the AMD assembler counts VGPRs
    counts = ", ".join(f"{name} {n}" for name, n in spilled)
    text = (f"spills: {unit} per thread spilled to local memory because the kernel needed more "
            f"registers than it had ({counts}). Results are unchanged; each spilled value costs a "
            f"trip through the cache, which matters only on a kernel that bounds the run time, "
            f"so small counts elsewhere are harmless.")  # fmt: skip
    if decided_by is not None and decided_by.startswith(("tuning table entry", "cost model")):
        return text + (" This spec was chosen from GPU timings, spills included (kreg bench "
                       "times it again after a kernel change).")  # fmt: skip
    return text + (f" No timing on {target.name} chose this spec: one on the device (kreg bench) "
                   f"says what these spills cost.")  # fmt: skip


def resolve(name: str, target, options: dict | None = None):
    """(candidate, spec, how the spec was chosen, the problem it was selected for or None, the
    selection's ``decided_by`` or None) for a candidate or family name; ``options`` build the
    problem as ``kreg explain`` does."""
    from kreg.dispatch import NoCandidateError, select

    reg = registry()
    if name in reg.families:
        problem = _problem(reg.families[name], options)
        if problem is None:
            raise CliError(f"family {name!r} has no default problem: name a candidate")
        sel = select(problem, target, family=name)  # NoCandidateError: a user error
        return (
            sel.candidate,
            sel.spec,
            f"selected for {short_repr(problem)}: {sel.decided_by}",
            problem,
            sel.decided_by,
        )
    if name not in reg.candidates:
        known = ", ".join([*reg.families, *reg.candidates])
        raise CliError(f"unknown candidate or family {name!r}; known: {known}")
    candidate = reg.candidates[name]
    if candidate.targets is not None and target.name not in candidate.targets:
        raise CliError(
            f"{name} does not support {target.name} (only {', '.join(candidate.targets)})"
        )
    problem = _problem(reg.families[candidate.family], options)
    if problem is not None:
        try:
            sel = select(
                problem, target, algorithm=name, allow_opt_in=True, family=candidate.family
            )
            return (
                candidate,
                sel.spec,
                f"selected for {short_repr(problem)}: {sel.decided_by}",
                problem,
                sel.decided_by,
            )
        except NoCandidateError:
            if options:  # the user's problem: building something else would mislead
                raise
    for spec in candidate.enumerate_specs(target):
        if candidate.is_valid(spec, target).ok:
            return candidate, spec, "first valid enumerated spec", None, None
    raise CliError(f"{name} has no valid spec on {target.name}")


def _problem(family, options: dict | None):
    return problem_from_options(family, options) if options else _default_problem(family)


def _default_problem(family):
    from_options = getattr(family.problem_type, "from_options", None)
    if from_options is None:
        return None
    try:
        return family.problem()
    except (ValueError, TypeError, KeyError):
        return None


def compile_all(builders: dict, spec, target, problem=None) -> dict:
    """Compile each builder, with a progress bar on stderr when it is a terminal. A builder
    returns None for a kernel the spec does not use; those are left out. With a ``problem`` the
    builders compile the kernel a launch for it runs (its integer arguments specialised as the
    JIT specialises them), else their representative one."""
    from tqdm import tqdm

    out = {}
    bar = tqdm(
        builders.items(),
        desc=f"compiling for {target.name}",
        unit="kernel",
        file=sys.stderr,
        disable=None,
        leave=False,
    )
    for name, build in bar:
        bar.set_postfix_str(name)
        with_problem = problem is not None and _takes_problem(build)
        artifact = build(spec, target, problem) if with_problem else build(spec, target)
        if artifact is not None:
            out[name] = artifact
    return out


def _takes_problem(build) -> bool:
    """Whether a builder takes the optional third argument, the problem."""
    import inspect

    try:
        inspect.signature(build).bind(None, None, None)
    except (TypeError, ValueError):
        return False
    return True
