"""Golden IR: the SHA-256 of every golden case's normalised IR, per target, kernel and stage.

Families declare cases with the ``kreg_register_golden_cases`` hook. For every case, every
target the case covers (``case.targets``, else the candidate's targets, else all) and every
kernel of the candidate, ``golden/ir_sha256.json`` pins, per normalised IR stage (ttir, ttgir,
llir, ptx | amdgcn), the SHA-256 and byte count, plus the shared memory the backend allocates.
A case whose spec is invalid on a target is recorded there as skipped, with the reasons.

The file holds one sub-document per Triton version (the IR depends on it)::

    {"format": 1,
     "triton": {"3.6.0": {
        "kda/split_d128_c32/sm90/prep": {"shared_bytes": 49152,
                                         "ttir": {"sha256": "...", "bytes": 40123}, ...},
        "kda/split_d128_c32/gfx942": {"skipped": ["shared memory estimate ..."]},
        ...}}}

The spec itself is deliberately not stored: a spec field added with a default that does not
change the kernels (an inert change) must leave every golden untouched.

kreg installs beside any Triton its torch brings, but the hashes hold for the versions the file
pins only. With another Triton installed, ``check`` skips with a message that names the pinned
versions (``Outcome.skipped``); in CI (``$CI`` or ``$KREG_GOLDEN_STRICT`` set to a true value)
that is a failure, and CI installs a pinned Triton (``scripts/venv.sh``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from kreg.checkout import PACKAGE_PARENT, repo_root
from kreg.registry.compile import normalise_ir
from kreg.registry.model import GoldenCase

FORMAT = 1
ROOT = PACKAGE_PARENT
GOLDEN_FILE = Path("golden") / "ir_sha256.json"
UPDATE_COMMAND = "kreg golden update"
STAGE_ORDER = ("ttir", "ttgir", "llir", "ptx", "amdgcn")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
STRICT_ENV = "KREG_GOLDEN_STRICT"
_TRUE = ("1", "true", "yes", "on")


def strict() -> bool:
    """A Triton the golden file does not pin fails the check (CI) instead of skipping it:
    ``$KREG_GOLDEN_STRICT`` or ``$CI`` set to 1 / true / yes / on."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in (STRICT_ENV, "CI"))


def default_path(root: Path | None = None) -> Path:
    """``golden/ir_sha256.json`` of ``root``, or of the checkout kreg runs from
    (``checkout.NotACheckout`` from an installed kreg)."""
    return repo_root(root) / GOLDEN_FILE


def triton_version() -> str:
    import triton

    return triton.__version__


# --- hashing ------------------------------------------------------------------------------------


def digest(text: str) -> dict[str, Any]:
    data = normalise_ir(text).encode()
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


# --- planning -----------------------------------------------------------------------------------


@attrs.frozen
class Job:
    """One case on one target: compile every kernel of its candidate."""

    key: str  # "<family>/<case>/<target>"
    candidate: str
    spec: Any
    target: str
    kernels: tuple[str, ...]


@attrs.frozen
class Plan:
    jobs: tuple[Job, ...]
    skipped: dict[str, list[str]]  # "<family>/<case>/<target>" -> reasons
    cases: dict[str, str]  # "<family>/<case>" -> candidate
    errors: tuple[str, ...]  # name errors: the plan must not be used

    def kernel_keys(self) -> list[str]:
        """Every kernel a job may build (a builder answering None builds nothing)."""
        return [f"{j.key}/{k}" for j in self.jobs for k in j.kernels]

    def expected_keys(self) -> set[str]:
        return set(self.kernel_keys()) | set(self.skipped)


def name_errors(cases: Sequence[GoldenCase], registry) -> list[str]:
    """Case names are the stems of golden keys: unique (also ignoring case), no ``/``."""
    errors: list[str] = []
    seen: dict[str, GoldenCase] = {}
    for case in cases:
        if not _NAME.match(case.name):
            errors.append(
                f"golden case name {case.name!r} is not a key stem: use letters, digits, '_', "
                "'.' and '-' (no '/')"
            )
        other = seen.get(case.name.lower())
        if other is not None:
            same = "the same name" if other.name == case.name else f"{other.name!r} (ignoring case)"
            errors.append(
                f"golden case {case.name!r} ({case.candidate}) collides with {same} "
                f"({other.candidate}): both would write kernels under the same golden key; "
                "rename one of them"
            )
        else:
            seen[case.name.lower()] = case
        if case.candidate not in registry.candidates:
            errors.append(f"golden case {case.name!r} names unknown candidate {case.candidate!r}")
    return errors


def plan(registry, cases: Iterable[GoldenCase] | None = None) -> Plan:
    """What the golden file must hold for ``cases`` (default: every registered case)."""
    cases = list(registry.golden_cases.values() if cases is None else cases)
    errors = name_errors(cases, registry)
    jobs: list[Job] = []
    skipped: dict[str, list[str]] = {}
    stems: dict[str, str] = {}
    for case in sorted(cases, key=lambda c: c.name):
        candidate = registry.candidates.get(case.candidate)
        if candidate is None:
            continue
        stem = f"{candidate.family}/{case.name}"
        stems[stem] = candidate.name
        names = case.targets or candidate.targets or tuple(registry.targets)
        for name in names:
            target = registry.targets[name]
            key = f"{stem}/{name}"
            verdict = candidate.is_valid(case.spec, target)
            if not verdict.ok:
                skipped[key] = list(verdict.reasons)
                continue
            jobs.append(Job(key, candidate.name, case.spec, name, tuple(candidate.builders)))
    return Plan(tuple(jobs), skipped, stems, tuple(errors))


# --- compiling ----------------------------------------------------------------------------------

_worker_registry = None


def _init_worker(plugins: str | None) -> None:
    global _worker_registry
    from kreg.registry import load_registry

    _worker_registry = load_registry(plugins)


class CompileFailed(Exception):
    """Some golden kernels failed to compile; ``failures`` holds one line per kernel."""

    def __init__(self, failures: list[str]):
        super().__init__(
            f"{len(failures)} golden kernel(s) failed to compile:\n" + "\n".join(failures)
        )
        self.failures = failures


def _error_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    cause = e.__cause__ or e.__context__
    tail = f" (caused by {type(cause).__name__}: {str(cause).strip()[:200]})" if cause else ""
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300] + tail


def _run_job(job: Job, registry=None) -> tuple[str, dict[str, dict], float, list[str]]:
    """Compile one job's kernels: (job key, {kernel key: entry}, seconds, failures)."""
    registry = registry or _worker_registry
    candidate = registry.candidates[job.candidate]
    target = registry.targets[job.target]
    start = time.perf_counter()
    out: dict[str, dict] = {}
    failures: list[str] = []
    for kernel in job.kernels:
        key = f"{job.key}/{kernel}"
        try:
            artifact = candidate.builders[kernel](job.spec, target)
        except Exception as e:  # reported per kernel, after every job ran
            failures.append(f"{key}: compile failed: {_error_line(e)}")
            continue
        if artifact is None:  # a builder may answer None: the spec does not use this kernel
            continue
        entry: dict[str, Any] = {"shared_bytes": int(artifact.shared_bytes)}
        for stage, text in artifact.stages.items():
            entry[stage] = digest(text)
        out[key] = entry
    return job.key, out, time.perf_counter() - start, failures


def compute(
    registry,
    the_plan: Plan,
    *,
    jobs: int = 2,
    plugins: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, dict]:
    """The sub-document (for the installed Triton) that ``the_plan`` describes.

    With ``jobs > 1`` the compiles run in a pool of spawned processes (Triton's compile is
    CPU-bound); each worker loads its own registry with ``plugins`` (a ``KREG_PLUGINS`` value).
    """
    doc: dict[str, dict] = {k: {"skipped": v} for k, v in the_plan.skipped.items()}
    total = len(the_plan.jobs)
    say = progress or (lambda _msg: None)
    started = time.perf_counter()

    failures: list[str] = []

    def record(i: int, key: str, entries: dict, seconds: float, failed: list[str]) -> None:
        doc.update(entries)
        failures.extend(failed)
        note = f", {len(failed)} FAILED" if failed else ""
        say(f"[{i}/{total}] {key}: {len(entries)} kernel(s) in {seconds:.1f}s{note}")

    workers = max(1, min(jobs, total))
    if workers == 1:
        for i, job in enumerate(the_plan.jobs, 1):
            record(i, *_run_job(job, registry))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(plugins,),
        )
        try:
            # slowest first (bigger head dims) so the pool's tail is short
            order = sorted(the_plan.jobs, key=_job_weight, reverse=True)
            futures = [pool.submit(_run_job, job) for job in order]
            for i, future in enumerate(as_completed(futures), 1):
                record(i, *future.result())
        except BaseException:  # Ctrl-C (or a failure): stop the workers, run no queued job
            for worker in list((getattr(pool, "_processes", None) or {}).values()):
                worker.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    say(f"compiled {total} case x target jobs in {time.perf_counter() - started:.1f}s")
    if failures:
        raise CompileFailed(sorted(failures))
    return dict(sorted(doc.items()))


def _job_weight(job: Job) -> int:
    spec = job.spec
    tile = getattr(spec, "tile", spec)
    dims = getattr(tile, "head_dim_k", 1) * getattr(tile, "chunk", 1)
    return dims * len(job.kernels) * (2 if job.target.startswith("sm") else 1)


# --- the file -----------------------------------------------------------------------------------


class GoldenFileError(ValueError):
    """The golden file is not one kreg wrote."""


def load(path: Path) -> dict:
    path = Path(path)
    if not path.exists():
        return {"format": FORMAT, "triton": {}}
    try:
        doc = json.loads(path.read_bytes())
    except ValueError as e:  # not UTF-8, or not JSON
        raise GoldenFileError(f"{path}: not a golden IR file ({type(e).__name__}: {e})") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("triton", {}), dict):
        raise GoldenFileError(f"{path}: not a golden IR file (expected an object with 'triton')")
    return doc


def dumps(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, indent=1) + "\n"


def save(path: Path, doc: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(doc))


def with_version(doc: dict, version: str, sub: dict) -> dict:
    out = {"format": FORMAT, "triton": dict(doc.get("triton", {}))}
    out["triton"][version] = sub
    return out


# --- checking -----------------------------------------------------------------------------------


@attrs.frozen
class Outcome:
    ok: bool
    messages: tuple[str, ...]
    # ok without checking anything: the installed Triton is not pinned (outside CI)
    skipped: bool = False


def _stems(keys: Iterable[str]) -> set[str]:
    return {"/".join(k.split("/")[:2]) for k in keys}


def _fail(messages: list[str], hint: str | None = None) -> Outcome:
    hint = hint or f"run `{UPDATE_COMMAND}` if the change is intended, and commit {GOLDEN_FILE}"
    return Outcome(False, (*messages, hint))


def check_structure(stored: dict | None, the_plan: Plan, version: str, path: Path,
                    pinned: Sequence[str] = ()) -> Outcome:  # fmt: skip
    """The checks that need no compile: names, the Triton sub-document, added/dropped cases.
    ``pinned``: the Triton versions the file holds (named when the installed one is not)."""
    if the_plan.errors:
        return _fail(list(the_plan.errors), "fix the golden case names, then run "
                     f"`{UPDATE_COMMAND}`")  # fmt: skip
    if stored is None:
        have = ", ".join(sorted(pinned)) or "none"
        first = f"{path} has no golden IR for the installed Triton {version} (it pins: {have})"
        install = f"install a pinned Triton (pip install triton=={max(pinned)}) to check, or " \
            if pinned else ""  # fmt: skip
        if not strict():
            return Outcome(True, (
                f"golden IR check skipped: {first}; {install}run `{UPDATE_COMMAND}` to pin "
                f"{version}. In CI (${STRICT_ENV} or $CI set) this fails.",
            ), skipped=True)  # fmt: skip
        return _fail([first], f"{install}run `{UPDATE_COMMAND}` to pin Triton {version}, and "
                     f"commit {GOLDEN_FILE}")  # fmt: skip
    have, want = _stems(stored), set(the_plan.cases)
    messages = [
        f"golden case {stem!r} was added without regenerating the golden IR"
        for stem in sorted(want - have)
    ] + [
        f"golden case {stem!r} was dropped (or renamed) without regenerating the golden IR"
        for stem in sorted(have - want)
    ]
    return _fail(messages) if messages else Outcome(True, ())


def compare(stored: dict, current: dict) -> list[str]:
    """Every difference, one line each: case/target/kernel and stage."""
    out: list[str] = []
    for key in sorted(set(stored) | set(current)):
        old, new = stored.get(key), current.get(key)
        if old == new:
            continue
        if old is None:
            what = "skipped" if "skipped" in new else "compiled"
            out.append(f"{key}: new entry ({what}) not in the golden file")
        elif new is None:
            was = "skipped" if "skipped" in old else "compiled"
            out.append(f"{key}: golden entry ({was}) no longer produced")
        elif "skipped" in old or "skipped" in new:
            if "skipped" in old and "skipped" in new:
                out.append(f"{key}: skip reasons changed: {new['skipped']}")
            elif "skipped" in new:
                out.append(f"{key}: now rejected on this target: {'; '.join(new['skipped'])}")
            else:
                out.append(f"{key}: was skipped, now valid and compiled")
        else:
            for field in _ordered(set(old) | set(new)):
                a, b = old.get(field), new.get(field)
                if a == b:
                    continue
                if field == "shared_bytes":
                    out.append(f"{key}: shared_bytes {a} -> {b}")
                elif a is None or b is None:
                    out.append(f"{key} [{field}]: stage {'added' if a is None else 'removed'}")
                else:
                    out.append(
                        f"{key} [{field}]: sha256 {a['sha256'][:12]} -> {b['sha256'][:12]}, "
                        f"{a['bytes']} -> {b['bytes']} bytes"
                    )
    return out


def _ordered(fields: set[str]) -> list[str]:
    rank = {s: i for i, s in enumerate(STAGE_ORDER)}
    return sorted(fields, key=lambda f: (rank.get(f, len(rank)), f))


def check(
    registry,
    path: Path | None = None,
    *,
    cases: Iterable[GoldenCase] | None = None,
    jobs: int = 2,
    plugins: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Outcome:
    """Compare the installed Triton's sub-document of the golden file with freshly built IR."""
    path = Path(path or default_path())
    version = triton_version()
    the_plan = plan(registry, cases)
    pinned = load(path).get("triton", {})
    outcome = check_structure(pinned.get(version), the_plan, version, path, tuple(pinned))
    if not outcome.ok or outcome.skipped:
        return outcome
    stored = pinned[version]
    try:
        current = compute(registry, the_plan, jobs=jobs, plugins=plugins, progress=progress)
    except CompileFailed as e:
        return _fail(e.failures, "fix the kernels or builders: golden kernels must compile")
    diffs = compare(stored, current)
    if diffs:
        return _fail([f"golden IR mismatch for Triton {version} ({len(diffs)}):", *diffs])
    n = len(the_plan.kernel_keys())
    return Outcome(True, (f"golden IR ok: {len(the_plan.cases)} cases, {n} kernels, "
                          f"{len(the_plan.skipped)} skipped case x target (Triton {version})",))  # fmt: skip


def update(
    registry,
    path: Path | None = None,
    *,
    cases: Iterable[GoldenCase] | None = None,
    jobs: int = 2,
    plugins: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict, list[str]]:
    """Regenerate the installed Triton's sub-document; returns (document, changes).

    Without ``cases`` the sub-document is rewritten from every registered case (entries of cases
    no longer registered go). With ``cases`` only those cases' entries are replaced and every
    other entry of the file is kept: regenerating three cases never drops the other seventy.
    """
    path = Path(path or default_path())
    version = triton_version()
    the_plan = plan(registry, cases)
    if the_plan.errors:
        raise ValueError("; ".join(the_plan.errors))
    doc = load(path)
    stored = doc.get("triton", {}).get(version, {})
    current = compute(registry, the_plan, jobs=jobs, plugins=plugins, progress=progress)
    if cases is not None:
        redone = set(the_plan.cases)
        stored = {k: v for k, v in stored.items() if _stems([k]) <= redone}
        kept = {k: v for k, v in doc.get("triton", {}).get(version, {}).items() if k not in stored}
        merged = dict(sorted({**kept, **current}.items()))
    else:
        merged = current
    changes = compare(stored, current)
    save(path, with_version(doc, version, merged))
    return doc, changes


# --- normalised IR of a case (``kreg golden diff``) -----------------------------------------------


def case_ir(
    registry,
    case_name: str,
    *,
    target: str | None = None,
    kernel: str | None = None,
    stage: str | None = None,
) -> dict[str, str]:
    """``{"<target>/<kernel>/<stage>": normalised IR}`` of a registered case."""
    case = registry.golden_cases.get(case_name)
    if case is None:
        known = ", ".join(sorted(registry.golden_cases)) or "(none)"
        raise KeyError(f"unknown golden case {case_name!r}; known: {known}")
    candidate = registry.candidates[case.candidate]
    out: dict[str, str] = {}
    for name in case.targets or candidate.targets or tuple(registry.targets):
        if target is not None and name != target:
            continue
        t = registry.targets[name]
        verdict = candidate.is_valid(case.spec, t)
        if not verdict.ok:
            out[f"{name}/-/skipped"] = "skipped: " + "; ".join(verdict.reasons) + "\n"
            continue
        for kname, build in candidate.builders.items():
            if kernel is not None and kname != kernel:
                continue
            artifact = build(case.spec, t)
            if artifact is None:
                continue
            for sname in _ordered(set(artifact.stages)):
                if stage is None or sname == stage:
                    out[f"{name}/{kname}/{sname}"] = normalise_ir(artifact.stages[sname])
    return out


# Run by ``python -c`` in a checkout of another revision: the raw IR of one case, as JSON.
_REV_SCRIPT = r"""
import json, sys
from kreg.registry import get_registry
case_name, target, kernel, stage, out = sys.argv[1:6]
import kreg
reg = get_registry()
case = reg.golden_cases.get(case_name)
if case is None:
    sys.exit(f"golden case {case_name!r} does not exist at this revision")
cand = reg.candidates[case.candidate]
res = {"kreg": kreg.__file__, "ir": {}}
for name in case.targets or cand.targets or tuple(reg.targets):
    if target and name != target:
        continue
    t = reg.targets[name]
    v = cand.is_valid(case.spec, t)
    if not v.ok:
        res["ir"][name + "/-/skipped"] = "skipped: " + "; ".join(v.reasons) + "\n"
        continue
    for kname, build in cand.builders.items():
        if kernel and kname != kernel:
            continue
        art = build(case.spec, t)
        if art is None:
            continue
        for sname, text in art.stages.items():
            if not stage or sname == stage:
                res["ir"][name + "/" + kname + "/" + sname] = text
json.dump(res, open(out, "w"))
"""


def case_ir_at_revision(
    revision: str,
    case_name: str,
    *,
    target: str | None = None,
    kernel: str | None = None,
    stage: str | None = None,
    repo: Path = ROOT,
) -> dict[str, str]:
    """The case's normalised IR built from ``revision``'s tree (``git archive`` into a temp dir,
    compiled in a subprocess that imports kreg from there)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kreg-golden-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", revision],
            capture_output=True,
        )
        if archive.returncode != 0:
            raise ValueError(f"git archive {revision}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        out = Path(tmp) / "ir.json"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(tree)
        run = subprocess.run(
            [sys.executable, "-c", _REV_SCRIPT, case_name, target or "", kernel or "",
             stage or "", str(out)],
            cwd=tree, env=env, capture_output=True, text=True,
        )  # fmt: skip
        if run.returncode != 0:
            tail = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise ValueError(f"building {case_name!r} at {revision} failed: {tail}")
        result = json.loads(out.read_text())
        if not Path(result["kreg"]).resolve().is_relative_to(tree.resolve()):
            raise ValueError(f"the {revision} build imported kreg from {result['kreg']}")
    return {
        key: text if key.endswith("/skipped") else normalise_ir(text)
        for key, text in result["ir"].items()
    }


def unified_diff(old: dict[str, str], new: dict[str, str], old_label: str, new_label: str) -> str:
    import difflib

    chunks: list[str] = []
    for key in sorted(set(old) | set(new), key=_ir_key_order):
        a, b = old.get(key, ""), new.get(key, "")
        if a == b:
            continue
        chunks.extend(
            difflib.unified_diff(
                a.splitlines(keepends=True), b.splitlines(keepends=True),
                f"{old_label}/{key}", f"{new_label}/{key}",
            )
        )  # fmt: skip
    return "".join(chunks)


def _ir_key_order(key: str) -> tuple:
    target, kernel, stage = key.split("/")
    rank = {s: i for i, s in enumerate(STAGE_ORDER)}
    return (target, kernel, rank.get(stage, len(rank)))
