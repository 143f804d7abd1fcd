"""The AOT build (goldens, ``kreg build``, footprint rules) describes the kernel Triton's JIT runs.

The JIT specialises every launch on its arguments: 16-byte aligned pointers and integers
divisible by 16 get ``tt.divisibility = 16``, an integer 1 and a None are folded to constants.
``compile_kernel`` applies the same specialisation from the values a launch passes
(``kreg.families.kda.runtime_args``). The CPU tests check the artifact carries it; the GPU test
runs ``kda_prefill`` and compares the JIT's compiled kernels with the AOT build for the same
spec and problem (normalised IR of every stage, shared bytes, registers, spills).
"""

from __future__ import annotations

import re

import pytest
import triton

from kreg.families.kda import builders, kernels
from kreg.families.kda.runtime_args import REPRESENTATIVE, LaunchShape
from kreg.families.kda.specs import KdaScanSpec, KdaSplitSpec, KdaTileSpec
from kreg.registry import get_registry
from kreg.registry.compile import compile_kernel, normalise_ir

# a cheap scan to compile (seconds): chunk 16, one 32-column V block
SCAN = KdaScanSpec(chunk=16, block_v=32)


@pytest.fixture(scope="module")
def sm90():
    return get_registry().targets["sm90"]


def _func_args(ttir: str) -> dict[str, str]:
    """The kernel's runtime arguments in the ttir: name -> type and attributes."""
    head = next(line for line in ttir.splitlines() if "tt.func public" in line)
    return {
        m.group(1): m.group(2).strip() for m in re.finditer(r"%(\w+): ([^%]*?)\s*loc\(\"\1\"", head)
    }


def test_aot_artifact_carries_the_jit_specialisation(sm90):
    args = _func_args(builders.build_kda_chunk_scan(SCAN, sm90).stages["ttir"])
    # every pointer a launch passes is 16-byte aligned
    for name in ("w_t", "u_t", "gq_t", "aqk_t", "gkt_t", "dec_t", "o"):
        assert "tt.divisibility = 16" in args[name], (name, args[name])
    # the representative T and HV are multiples of 16
    assert REPRESENTATIVE.T % 16 == 0 and REPRESENTATIVE.HV % 16 == 0
    assert "tt.divisibility = 16" in args["T"] and "tt.divisibility = 16" in args["HV"]
    # None pointers (no h0 / ht / hs, no varlen tables, no q and k with a channel gate) and
    # NSEG == 1 are constants, not arguments
    absent = {"h0", "ht", "hs", "seq_chunk", "cu_seqlens", "NSEG", "q", "k"}
    assert not absent & set(args), sorted(args)


def test_aot_artifact_follows_the_launch_values(sm90):
    """A T not divisible by 16 loses its attribute, HV == 1 is folded, a segmented scan takes
    h0 (the segments' start states) and NSEG as arguments."""
    spec = KdaScanSpec(chunk=16, block_v=32, segment_chunks=16)
    art = builders.build_kda_chunk_scan(spec, sm90, LaunchShape(T=8191, H=1, HV=1))
    args = _func_args(art.stages["ttir"])
    assert args["T"] == "i32"
    assert "HV" not in args
    assert "tt.divisibility = 16" in args["h0"]
    assert "tt.divisibility = 16" in args["NSEG"]  # cdiv(cdiv(8191, 16), 16) = 32


def test_compile_kernel_needs_the_integer_values(sm90):
    signature = builders._scan_inputs(SCAN) | builders._states(SCAN) | builders._SEGMENT
    constexprs = dict(K=128, V=128, C=16, SEG=0) | builders._scan_constexprs(SCAN, 32)
    with pytest.raises(ValueError, match="no runtime value for 'T'"):
        compile_kernel(kernels.kda_chunk_scan_kernel, signature, constexprs, sm90)


# --- on a GPU: the JIT's kernels are the AOT build's -------------------------------------------

# every kernel the module defines, so a new one is compared as soon as a builder builds it
_KERNELS = {n: f for n, f in vars(kernels).items() if isinstance(f, triton.runtime.JITFunction)
            and n.endswith("_kernel")}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("lower_bound", [None, -5.0], ids=["unbounded", "lb-5"])
@pytest.mark.parametrize("B,H", [(1, 32), (2, 16)], ids=["B1H32", "B2H16"])
def test_jit_kernels_equal_the_aot_build(B, H, lower_bound):
    import torch

    from kreg.dispatch import select
    from kreg.families.kda import api
    from kreg.registry.compile import _ptxas_report

    T, K = 8192, 128
    dev = "cuda"
    torch.manual_seed(0)
    norm = torch.nn.functional.normalize
    q = norm(torch.randn(B, T, H, K, device=dev), dim=-1).bfloat16()
    k = norm(torch.randn(B, T, H, K, device=dev), dim=-1).bfloat16()
    v = torch.randn(B, T, H, K, device=dev).bfloat16()
    g = (-5 * torch.rand(B, T, H, K, device=dev)).bfloat16()
    beta = torch.rand(B, T, H, device=dev).bfloat16()

    problem, _ = api._prepare(
        q, k, v, g, beta, None, None, False, lower_bound, None, None, None, None, "none",
        False, False, "kv", False,
    )  # fmt: skip
    target = api._target(q, None)
    selection = select(problem, target)
    assert selection.candidate.name == "kda.split"
    for fn in _KERNELS.values():  # only this call's compilations (from Triton's disk cache)
        fn.device_caches.clear()
    api.kda_prefill(q, k, v, g, beta, gate_lower_bound=lower_bound)
    torch.cuda.synchronize()

    compared = []
    for name, build in selection.candidate.builders.items():
        art = build(selection.spec, target, problem)
        if art is None:
            continue
        fn = _KERNELS[art.kernel]
        jit = [ck for entry in fn.device_caches.values() for ck in entry[0].values()]
        assert len(jit) == 1, f"{name}: {len(jit)} JIT compilations"
        ck = jit[0]
        label = f"{name} {selection.spec!r}"
        for stage, text in art.stages.items():
            assert normalise_ir(ck.asm[stage]) == normalise_ir(text), f"{label}: {stage} differs"
        assert ck.metadata.shared == art.shared_bytes, label
        assert ck.n_regs == art.registers, label
        assert _ptxas_report(ck.asm["ptx"], target)["spills"] == art.spills, label
        compared.append(name)
    assert {"prep", "scan"} <= set(compared)
    assert ("pairs" in compared) == (lower_bound is None)  # the safe anchor's pairs kernel


def test_builders_take_the_problem_through_the_candidate(sm90):
    """``kreg build`` hands its problem to the candidate's builders: a problem with T not a
    multiple of 16 builds another prep kernel than the representative one."""
    from kreg.families.kda.plugin import SPLIT
    from kreg.problems import LinearAttentionProblem

    tile = KdaTileSpec(chunk=16, solve_block=16, num_warps=4)
    spec = KdaSplitSpec(tile=tile)
    odd = LinearAttentionProblem(batch=1, seq_len=1000 + 1, heads_qk=16, heads_v=16,
                                 head_dim_k=128, head_dim_v=128)  # fmt: skip
    args = _func_args(SPLIT.builders["prep"](spec, sm90, odd).stages["ttir"])
    assert args["T"] == "i32"
    assert "tt.divisibility = 16" in args["H"]
