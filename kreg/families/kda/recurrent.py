"""Candidate ``kda.recurrent``: the token-serial KDA recurrence for decode-shaped problems.

Its spec, enumeration per target and validity rules; the one derivation of its launch from a
spec (``recurrent_launch``), which both the launcher (``launch.run_recurrent``) and the AOT builder
(``build_kda_recurrent``) use, so the golden artifact is the kernel that runs; and the latency
model the dispatcher compares against the chunked form's (``plugin.py``).
"""

from __future__ import annotations

import functools
import math

import attrs

from kreg.problems.linear_attention import STATE_LAYOUTS
from kreg.registry.model import Artifact, Target, Verdict

from . import kernels, recurrent_kernels
from .builders import KernelLaunch, _compile, _inputs, _launch_values
from .runtime_args import REPRESENTATIVE, LaunchShape
from .specs import DTYPE_BYTES, HEAD_DIMS, _matches, _pow2, padded_head_dim

BLOCK_VS = (16, 32, 64)
WARPS = (1, 2, 4, 8)
# Software pipelining of the token loop's loads (they never depend on the state). AMD's was never
# measured: its scan enumerates one stage, here two at most.
STAGES_BY_BACKEND = {"cuda": (1, 2, 3), "hip": (1, 2)}
# The [K, block_v] fp32 state lives in registers: below half of a thread's registers, the rest
# for the token's vectors, addresses and the reductions. 128 x 32 at one warp (128 of sm90's
# 255) compiles to 219 without spilling, but ran 5-8% slower than 128 x 16 on every decode shape
# past 64 sequences x 16 heads and never more than 1% faster (docs/kda/decode/specs.json).
STATE_REGISTER_SHARE = 0.5


@attrs.frozen
class KdaRecurrentSpec:
    """The recurrence kernel: one program per (sequence, value head, V block), tokens in order."""

    head_dim_k: int = 128
    head_dim_v: int = 128
    dtype: str = "bf16"
    block_v: int = 32
    num_warps: int = 4
    num_stages: int = 2
    gate_activation: str = "none"
    scalar_gate: bool = False  # one gate per token and value head (GDN)
    qk_l2norm: bool = False
    beta_sigmoid: bool = False
    initial_state: bool = False
    state_dtype: str = "fp32"
    output_final_state: bool = False
    # states in a pool [P, HV, K, V], read and written in place through per-sequence slots
    state_pool: bool = False
    state_layout: str = "kv"
    varlen: bool = False

    def state_registers(self, warp_size: int) -> float:
        """fp32 registers per thread the state block takes."""
        return self.head_dim_k * self.block_v / (self.num_warps * warp_size)


def enumerate_recurrent_specs(target: Target) -> list[KdaRecurrentSpec]:
    return [
        KdaRecurrentSpec(d, d, block_v=bv, num_warps=w, num_stages=st)
        for d in HEAD_DIMS
        for bv in BLOCK_VS
        if bv <= d
        for w in WARPS
        for st in STAGES_BY_BACKEND[target.backend]
    ]


def is_valid_recurrent_spec(spec: KdaRecurrentSpec, target: Target, problem=None) -> Verdict:
    regs = spec.state_registers(target.warp_size)
    budget = STATE_REGISTER_SHARE * target.max_registers_per_thread
    return Verdict.check(
        (spec.head_dim_k in HEAD_DIMS, f"head_dim_k={spec.head_dim_k} not in supported {HEAD_DIMS}"),
        (spec.head_dim_v in HEAD_DIMS, f"head_dim_v={spec.head_dim_v} not in supported {HEAD_DIMS}"),
        (spec.dtype in DTYPE_BYTES, f"dtype={spec.dtype!r} not in {tuple(DTYPE_BYTES)}"),
        (_pow2(spec.block_v) and 16 <= spec.block_v <= spec.head_dim_v
         and spec.head_dim_v % spec.block_v == 0,
         f"block_v={spec.block_v} must be a power of 2 in [16, head_dim_v={spec.head_dim_v}]"),
        (spec.num_warps in WARPS, f"num_warps={spec.num_warps} not in {WARPS}"),
        (spec.num_stages >= 1, f"num_stages={spec.num_stages} must be >= 1"),
        (spec.gate_activation in kernels.GATE_ACT,
         f"gate_activation={spec.gate_activation!r} not in {tuple(kernels.GATE_ACT)}"),
        (spec.state_layout in STATE_LAYOUTS, f"state_layout={spec.state_layout!r} not one of {STATE_LAYOUTS}"),
        (spec.state_dtype in ("fp32", "bf16"), f"state_dtype={spec.state_dtype!r} not fp32/bf16"),
        (not spec.state_pool or spec.initial_state,
         "state_pool needs initial_state (the pool holds the states)"),
        (regs <= budget,
         f"state block {spec.head_dim_k} x {spec.block_v} fp32 takes {regs:g} registers per "
         f"thread at {spec.num_warps} warps > {budget:g} ({STATE_REGISTER_SHARE:g} of "
         f"{target.name}'s {target.max_registers_per_thread}): it would spill"),
    )  # fmt: skip


def specialize_recurrent(spec: KdaRecurrentSpec, problem) -> KdaRecurrentSpec | None:
    """Problem fields filled in; a spec of another (padded) K does not match, V is the problem's
    padded V, as in the split enumeration (a K or V the kernels lack runs zero-padded)."""
    if not _matches(spec, problem):
        return None
    return attrs.evolve(
        spec, head_dim_v=padded_head_dim(problem.head_dim_v), dtype=problem.dtype,
        gate_activation=problem.gate_activation, scalar_gate=problem.gate == "scalar",
        qk_l2norm=problem.qk_l2norm,
        beta_sigmoid=problem.beta_sigmoid, initial_state=problem.initial_state,
        state_dtype=problem.state_dtype, output_final_state=problem.output_final_state,
        state_pool=problem.state_pool, state_layout=problem.state_layout, varlen=problem.varlen,
    )  # fmt: skip


def accepts_recurrent(problem) -> Verdict:
    """What the recurrence adds to the family's problem rules (``plugin.accepts``)."""
    return Verdict.check(
        (not problem.output_chunk_states,
         "output_chunk_states: chunk states belong to the chunked form (kda.split serves them)"),
    )  # fmt: skip


# --- latency model (microseconds on the H200) -------------------------------------------------
# A chain is one program's serial walk; a wave is the programs resident on every SM at once. Per
# wave, each token step waits on its loads (q, k, v, g, beta: latency, not bandwidth), plus a
# round trip through shared memory when the state block spans warps; beside the waves, the
# state's compulsory traffic (read and written once, fp32) at the device's bandwidth. Constants:
# least squares, relative error, on the fit shapes of ``benchmarks/kda_decode_specs.py`` (the 27
# valid specs x 18 shapes, H200, 2026-12-03, docs/kda/decode/specs.json); on its 17 held-out
# shapes the cheapest estimate's spec is within 1.00x (median) / 1.02x (worst) of the fastest.
TOKEN_STEP_US = 1.74  # one token step of a wave
CROSS_WARP_US = 0.69  # the reduction's barrier once the block spans warps
LAUNCH_US = 5.5  # one kernel node of a CUDA graph, launch to first wave
STATE_US_PER_MB = 0.23  # ~4.3 TB/s: state bytes read or written
# Registers a thread takes, from the state block's: sm90 AOT builds (K = 128) compile to
# 64 (16 x 8 warps) ... 123 (16 x 1) ... 219 (32 x 1): about 1.5 per state register (the decay,
# the update and the reduction each hold a copy in flight) plus the chain's vectors and
# addresses, never below 64.
REGISTERS_PER_STATE_REGISTER = 1.5
CHAIN_REGISTERS = 28
MIN_REGISTERS = 64
MAX_THREADS_PER_UNIT = 2048


def token_step_us(spec: KdaRecurrentSpec) -> float:
    return TOKEN_STEP_US + (CROSS_WARP_US if spec.num_warps > 1 else 0.0)


def resident_programs(spec: KdaRecurrentSpec, target: Target) -> int:
    """Programs that fit on one SM / CU at once, by registers and threads."""
    threads = spec.num_warps * target.warp_size
    state = spec.state_registers(target.warp_size)
    regs = max(MIN_REGISTERS, REGISTERS_PER_STATE_REGISTER * state + CHAIN_REGISTERS)
    by_regs = int(target.registers_per_unit // (regs * threads))
    return max(1, min(by_regs, MAX_THREADS_PER_UNIT // threads))


# The longest sequence the estimate below is trusted for: the kda-decode scenario measures 1 and
# 4 tokens per sequence. Past it the estimate is an extrapolation of uncalibrated constants (it
# chose the recurrence for 3,936-token prefills, and flipped back and forth between the forms
# from 46 to 64 tokens), so a longer problem goes to the chunked form (a pool too: it gathers
# and scatters the slots); a pinned call is unaffected.
TRUSTED_MAX_TOKENS = 16


def recurrent_cost(spec: KdaRecurrentSpec, problem, target: Target) -> float:
    """Estimated microseconds: one launch, waves of chains as long as the longest sequence in
    tokens (``problem.longest_seq``), the state traffic; infinite past ``TRUSTED_MAX_TOKENS``."""
    if problem.longest_seq > TRUSTED_MAX_TOKENS:
        return math.inf
    programs = problem.num_seqs * problem.heads_v * (problem.head_dim_v // spec.block_v)
    waves = -(-programs // (resident_programs(spec, target) * target.compute_units))
    return LAUNCH_US + waves * problem.longest_seq * token_step_us(spec) + state_traffic_us(problem)


def state_traffic_us(problem) -> float:
    """The fp32 states' compulsory read and write (with an initial state and a final one), which
    every form pays alike: the split path's estimate adds it too, so the two compare."""
    passes = problem.initial_state + (problem.output_final_state or problem.state_pool)
    state_mb = problem.num_seqs * problem.heads_v * problem.head_dim_k * problem.head_dim_v * 4e-6
    return passes * state_mb * STATE_US_PER_MB


# --- launch derivation and AOT build -------------------------------------------------------------

_SCALARS = {"T": "i32", "H": "i32", "HV": "i32", "P": "i32", "scale": "fp32",
            "lower_bound": "fp32"}  # fmt: skip


def recurrent_launch(spec: KdaRecurrentSpec) -> KernelLaunch:
    constexprs = dict(
        K=spec.head_dim_k, V=spec.head_dim_v, BV=spec.block_v,
        GATE_ACT=kernels.GATE_ACT[spec.gate_activation], QK_L2=spec.qk_l2norm,
        BETA_SIG=spec.beta_sigmoid, USE_H0=spec.initial_state,
        STORE_HT=spec.output_final_state, POOL=spec.state_pool,
        STATE_VK=spec.state_layout == "vk", VARLEN=spec.varlen, SCALAR_GATE=spec.scalar_gate,
    )  # fmt: skip
    return KernelLaunch(recurrent_kernels.kda_recurrent_kernel, constexprs, spec.num_warps,
                        spec.num_stages)  # fmt: skip


def recurrent_absent(spec: KdaRecurrentSpec) -> dict:
    """Pointers a launch passes as None for this spec."""
    out = dict.fromkeys(("alog", "dtb")) if spec.gate_activation == "none" else {}
    if not spec.varlen:
        out["cu_seqlens"] = None
    if not spec.state_pool:
        out["state_idx"] = None
        if not spec.initial_state:
            out["h0"] = None
    if spec.state_pool or not spec.output_final_state:
        out["ht"] = None  # a pool is written through h0
    return out


def recurrent_scalars(T: int, H: int, HV: int, pool_size: int, scale: float,
                      lower_bound: float) -> dict:  # fmt: skip
    """Runtime scalars; ``pool_size`` is 1 without a pool (the JIT then folds it)."""
    return dict(T=T, H=H, HV=HV, P=pool_size, scale=scale, lower_bound=lower_bound)


# The representative pool of a problem-less build: as many slots as a serving batch holds, a
# multiple of 16 as a real pool's size usually is.
REPRESENTATIVE_POOL = 1024


@functools.cache
def build_kda_recurrent(
    spec: KdaRecurrentSpec, target: Target, shape: LaunchShape = REPRESENTATIVE
) -> Artifact:
    """The kernel a launch of ``shape`` runs (decode launches pass T = the packed token count
    with varlen, the tokens per sequence otherwise)."""
    signature = _inputs(spec.dtype) | {
        "o": f"*{spec.dtype}", "h0": f"*{spec.state_dtype}", "ht": "*fp32",
        # int32, as engines pass slots and offsets (int64 ones run the JIT's int64 twin)
        "state_idx": "*i32", "cu_seqlens": "*i32",
    } | _SCALARS  # fmt: skip
    pool = REPRESENTATIVE_POOL if spec.state_pool else 1
    scalars = recurrent_scalars(shape.T, shape.H, shape.HV, pool, 1.0, -5.0)
    values = _launch_values(signature, scalars, recurrent_absent(spec))
    return _compile(recurrent_launch(spec), signature, target, values)
