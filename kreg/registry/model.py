"""The registry's value types: frozen, comparable, hashable.

Every family describes itself with these; the host validates them when a plugin registers them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs


@attrs.frozen
class Verdict:
    """The answer of a validity rule: ok, plus every reason against (not only the first)."""

    reasons: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @property
    def ok(self) -> bool:
        return not self.reasons

    def __bool__(self) -> bool:
        return self.ok

    def __and__(self, other: Verdict) -> Verdict:
        return Verdict(self.reasons + other.reasons)

    @classmethod
    def check(cls, *rules: tuple[bool, str]) -> Verdict:
        """Each rule is (condition that must hold, reason given when it does not)."""
        return cls(tuple(reason for holds, reason in rules if not holds))

    @classmethod
    def all(cls, verdicts: Iterable[Verdict]) -> Verdict:
        return cls(tuple(r for v in verdicts for r in v.reasons))


ACCEPT = Verdict()


@attrs.frozen
class Target:
    """A hardware target: the numbers validity rules need, and how Triton names it.

    Rules take a Target as an argument and never probe a device, so every target can be
    validated and compiled for on a CPU-only machine.
    """

    name: str  # "sm90"
    backend: str  # Triton backend: "cuda" or "hip"
    arch: int | str  # Triton arch: 90, "gfx950"
    warp_size: int
    compute_units: int  # SMs or CUs
    shared_mem_per_unit: int  # bytes of shared memory / LDS per SM or CU
    shared_mem_per_block: int  # bytes one program (CTA / workgroup) may allocate
    registers_per_unit: int  # 32-bit registers per SM or CU
    max_registers_per_thread: int
    devices: tuple[str, ...] = attrs.field(converter=tuple)
    # How this project verifies it: "gpu" (numerics run on hardware by the GPU lane) or
    # "compile" (compiled and golden-hashed on CPU, never executed here).
    verification: str = "compile"
    description: str = ""

    def gpu_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


@attrs.frozen
class Artifact:
    """One compiled kernel: its IR stages and the resources the backend reports."""

    kernel: str  # kernel (function) name
    target: str
    stages: Mapping[str, str]  # "ttir", "ttgir", "llir", "ptx" | "amdgcn" -> text
    shared_bytes: int
    num_warps: int
    registers: int | None = None  # per thread, where reported (cuda)
    spills: int | None = None  # where reported (cuda)
    binary: bytes | None = attrs.field(default=None, repr=False, eq=False)
    compiled: Any = attrs.field(default=None, repr=False, eq=False)  # triton CompiledKernel


def _no_problem_rule(problem: Any) -> Verdict:
    return ACCEPT


@attrs.frozen
class Prediction:
    """A cost model's predicted device time of one spec, and the model entry that gave it."""

    spec: Any
    ms: float
    entry: str  # names the entry (and how it was fitted), for ``kreg explain``


@attrs.frozen
class Candidate:
    """One way a family serves a problem: its specs, its rules and its builders.

    ``enumerate_specs(target)`` lists the specs worth considering on a target;
    ``is_valid(spec, target, problem=None)`` says whether one may run there (hardware rules always,
    problem rules such as numeric range when a problem is given); ``specialize(spec, problem)``
    fills in the spec fields a problem fixes (head dims, dtype, options) or returns None when the
    spec cannot serve it; ``builders`` compile each kernel of a spec for a target; a builder may
    take a third argument, the problem, to compile the kernel a launch for that problem runs
    (Triton's JIT specialises on runtime integer values), its family's representative otherwise.
    """

    name: str  # dotted: "kda.split"
    family: str
    problem_type: type
    spec_types: tuple[type, ...] = attrs.field(converter=tuple)
    enumerate_specs: Callable[[Target], Sequence[Any]]
    is_valid: Callable[..., Verdict]
    builders: Mapping[str, Callable[..., Artifact]]  # (spec, target[, problem])
    accepts: Callable[[Any], Verdict] = _no_problem_rule
    specialize: Callable[[Any, Any], Any] | None = None
    # Lower cost ranks first among a candidate's valid specs for a problem (heuristic seam;
    # measured entries of the tuning table take precedence).
    cost: Callable[[Any, Any, Target], float] | None = None
    # Measured cost model seam: ``predict(payload, specs, problem, target)`` reads the payload of
    # a model section (a ``*_model.json`` of the family's ``data``, see ranker.py) and returns
    # Predictions for those of ``specs`` it models; the lowest predicted time wins, after the
    # tuning table and before ``cost``. The payload's format is the family's own.
    predict: Callable[[Mapping, Sequence[Any], Any, Target], Sequence[Prediction]] | None = None
    # ``run(call, spec)``: launch the spec's kernels on a call its family prepared (validated
    # arguments, in whatever form the family's entry points build); returns the outputs. The
    # family's entry runs a selection through it, never by switching on candidate names.
    run: Callable[[Any, Any], Any] | None = None
    priority: int = 0  # higher wins between candidates
    opt_in: bool = False
    opt_in_reason: str = ""
    targets: tuple[str, ...] | None = None  # None: every registered target
    description: str = ""


@attrs.frozen
class Family:
    """A kernel family: a problem type and the candidates that serve it."""

    name: str
    problem_type: type
    candidates: tuple[Candidate, ...] = attrs.field(converter=tuple)
    abi_version: int = 1  # bump when tuning-table entries stop applying
    description: str = ""
    docs: str = ""  # path of the per-family docs page, relative to the repository root
    # the importable package (usually the family's own) whose ``tuning.json`` and
    # ``*_model.json`` files are the family's measured tuning entries and cost models (read by
    # kreg/dispatch/ranker.py); empty: the family ships none
    data: str = ""
    # key=value options every problem of the family starts from where none are given (kreg
    # explain / build, the docs' dispatch table, the matrix's probe problems): a family sharing
    # a problem type states what its problems are (a scalar-gate family: {"gate": "scalar"})
    default_options: tuple[tuple[str, str], ...] = attrs.field(
        default=(), converter=lambda d: tuple(sorted(dict(d).items()))
    )

    def problem(self, options: Mapping[str, str] | None = None):
        """The problem ``problem_type.from_options`` builds from the family's default options,
        then ``options``."""
        return self.problem_type.from_options({**dict(self.default_options), **(options or {})})


@attrs.frozen
class GoldenCase:
    """A (candidate, spec) whose normalised IR is pinned per target in golden/."""

    name: str  # unique; also the kernel-name stem in the golden file
    candidate: str
    spec: Any
    targets: tuple[str, ...] | None = None  # None: every target the candidate supports
    note: str = ""


@attrs.frozen
class Scenario:
    """A benchmark scenario contributed by a family (run by ``kreg bench``)."""

    name: str
    family: str
    description: str
    cases: Callable[[], Sequence[Any]]  # cheap, no GPU needed (``kreg bench --list``)
    run: Callable[..., Any]  # run(cases, **options) -> results; needs a GPU


def short_repr(obj: Any) -> str:
    """``repr`` of an attrs value with only the fields that differ from their defaults (fields
    without a default always), nested values likewise: ``KdaScanSpec(chunk=32, block_v=32)``."""
    if not attrs.has(type(obj)):
        return repr(obj)
    parts = []
    for f in attrs.fields(type(obj)):
        if not f.repr:
            continue
        value = getattr(obj, f.name)
        default = f.default.factory() if isinstance(f.default, attrs.Factory) else f.default
        if f.default is attrs.NOTHING or value != default:
            parts.append(f"{f.name}={short_repr(value)}")
    return f"{type(obj).__name__}({', '.join(parts)})"
