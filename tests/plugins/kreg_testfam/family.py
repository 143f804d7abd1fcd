"""testfam: y = 2 * x over a vector, tiled; two candidates, one of them opt-in."""

from __future__ import annotations

import attrs
import triton
import triton.language as tl

from kreg.registry import Candidate, Family, Verdict
from kreg.registry.compile import compile_kernel

DTYPES = ("fp32", "fp16")


@attrs.frozen
class VecProblem:
    n: int = 4096
    dtype: str = "fp32"

    def bucket(self) -> dict:
        return {"dtype": self.dtype, "small": self.n <= 1024}

    @classmethod
    def from_options(cls, options: dict[str, str]) -> VecProblem:
        unknown = sorted(set(options) - {"n", "dtype"})
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; known: n, dtype")
        kwargs: dict = {}
        if "n" in options:
            kwargs["n"] = int(options["n"])
        if "dtype" in options:
            kwargs["dtype"] = options["dtype"]
        return cls(**kwargs)


@attrs.frozen
class Tile:
    block: int
    warps: int


@attrs.frozen
class VecSpec:
    tile: Tile
    dtype: str = "fp32"


def enumerate_specs(target) -> list[VecSpec]:
    return [VecSpec(Tile(b, w)) for b in (32, 64, 256, 1024) for w in (1, 2, 4, 8)]


def is_valid(spec: VecSpec, target, problem: VecProblem | None = None) -> Verdict:
    threads = spec.tile.warps * target.warp_size
    rules = [
        (spec.tile.block >= threads, f"block {spec.tile.block} < {threads} threads"),
        (spec.tile.block * 4 <= target.shared_mem_per_block, "block too large for shared memory"),
        (spec.dtype in DTYPES, f"dtype {spec.dtype} unsupported"),
    ]
    if problem is not None:
        rules.append((problem.n % spec.tile.block == 0, f"n not a multiple of {spec.tile.block}"))
    return Verdict.check(*rules)


def specialize(spec: VecSpec, problem: VecProblem) -> VecSpec | None:
    return attrs.evolve(spec, dtype=problem.dtype) if problem.dtype in DTYPES else None


def accepts(problem: VecProblem) -> Verdict:
    return Verdict.check((problem.n > 0, "n must be positive"))


def accepts_simple(problem: VecProblem) -> Verdict:
    return accepts(problem) & Verdict.check((problem.n <= 1 << 20, "n too large (max 1048576)"))


@triton.jit
def scale2(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def build_scale2(spec: VecSpec, target):
    ptr = "*" + spec.dtype
    signature = {"x_ptr": ptr, "y_ptr": ptr, "n": "i32"}
    return compile_kernel(
        scale2,
        signature,
        {"BLOCK": spec.tile.block},
        target,
        num_warps=spec.tile.warps,
        values={"n": 1 << 20},  # a representative length: the JIT specialises n on its value
    )


def cost(spec: VecSpec, problem: VecProblem, target) -> float:
    # fewer programs is cheaper; more warps costs a little
    return problem.n / spec.tile.block + spec.tile.warps / 10


SIMPLE = Candidate(
    name="testfam.simple",
    family="testfam",
    problem_type=VecProblem,
    spec_types=(VecSpec,),
    enumerate_specs=enumerate_specs,
    is_valid=is_valid,
    builders={"scale2": build_scale2},
    accepts=accepts_simple,
    specialize=specialize,
    priority=0,
    description="plain tiled kernel",
)

FAST = Candidate(
    name="testfam.fast",
    family="testfam",
    problem_type=VecProblem,
    spec_types=(VecSpec,),
    enumerate_specs=lambda target: [s for s in enumerate_specs(target) if s.tile.block >= 256],
    is_valid=is_valid,
    builders={"scale2": build_scale2},
    accepts=accepts,
    specialize=lambda spec, problem: specialize(spec, problem) if problem.dtype == "fp32" else None,
    cost=cost,
    priority=10,
    opt_in=True,
    opt_in_reason="experimental, numerics unverified",
    targets=("sm90", "gfx950"),
    description="large tiles only (opt-in)",
)

FAMILY = Family(name="testfam", problem_type=VecProblem, candidates=(SIMPLE, FAST), abi_version=3)
