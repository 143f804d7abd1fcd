"""Each KDA candidate launches exactly the kernels its builds (and so its goldens) describe.

Nothing is compiled or run: the launch path runs on CPU tensors with Triton's launcher replaced
by a recorder, the builders run with ``compile_kernel`` replaced by a recorder, and the two
records must agree kernel by kernel: function, constexprs, warps, stages and the integer
arguments the JIT specialises on (T, H, HV, NSEG).
"""

from __future__ import annotations

import attrs
import pytest
import torch
import triton

from kreg.dispatch import select
from kreg.families.kda import builders, launch
from kreg.families.kda.plugin import FUSED, SPLIT
from kreg.problems import LinearAttentionProblem

INTS = ("T", "H", "HV", "NSEG")
# every (cached) builder, so a cached artifact from another test cannot hide a build
BUILDS = tuple(getattr(builders, n) for n in dir(builders) if n.startswith("build_kda_"))


def _key(name, constexprs, num_warps, num_stages, ints):
    return (name, tuple(sorted(constexprs.items())), num_warps, num_stages, tuple(sorted(ints)))


@pytest.fixture
def launched(monkeypatch):
    record = []

    def getitem(self, grid):
        def run(*args, num_warps, num_stages, **kw):
            constexpr = {p.name for p in self.params if p.is_constexpr}
            consts = {n: v for n, v in kw.items() if n in constexpr}
            ints = {(n, kw[n]) for n in INTS if n in kw}
            record.append(_key(self.fn.__name__, consts, num_warps, num_stages, ints))

        return run

    monkeypatch.setattr(triton.runtime.jit.JITFunction, "__getitem__", getitem)
    return record


@pytest.fixture
def built(monkeypatch):
    record = []

    def compile_kernel(fn, signature, constexprs, target, *, num_warps, num_stages, values):
        ints = {(n, v) for n, v in values.items() if n in INTS}
        record.append(_key(fn.fn.__name__, dict(constexprs), num_warps, num_stages, ints))

    monkeypatch.setattr(builders, "compile_kernel", compile_kernel)
    for f in BUILDS:
        f.cache_clear()
    yield record
    for f in BUILDS:
        f.cache_clear()


def _call(problem: LinearAttentionProblem) -> launch.Call:
    B, T, H, HV = problem.batch, problem.seq_len, problem.heads_qk, problem.heads_v
    K, V = problem.head_dim_k, problem.head_dim_v
    t = lambda *s: torch.zeros(*s, dtype=torch.float16)  # noqa: E731
    cu = torch.tensor([0, 20, T], dtype=torch.int64) if problem.varlen else None
    n = problem.num_seqs
    return launch.Call(
        q=t(B, T, H, K), k=t(B, T, H, K), v=t(B, T, HV, V), g=t(B, T, HV, K), beta=t(B, T, HV),
        scale=0.5, A_log=None, dt_bias=None, lower_bound=problem.gate_lower_bound or 0.0,
        gate_activation="none", qk_l2norm=False, beta_sigmoid=False,
        initial_state=torch.zeros(n, HV, K, V) if problem.initial_state else None,
        output_final_state=problem.output_final_state, output_chunk_states=False,
        state_layout="kv", cu_seqlens=cu, cu_seqlens_host=cu,
        longest=problem.longest_seq if problem.varlen else None,
    )  # fmt: skip


PROBLEMS = {
    "plain-safe": dict(),
    "bounded": dict(gate_lower_bound=-5.0),
    "states": dict(initial_state=True, output_final_state=True),
    # max_seqlen: the longest of _call's offsets, as kda_prefill reads it from the host copy
    "varlen": dict(batch=1, varlen=True, num_seqs=2, output_final_state=True, max_seqlen=180),
}


@pytest.mark.parametrize("segments", [0, 4], ids=["serial", "segmented"])
@pytest.mark.parametrize("name", list(PROBLEMS))
@pytest.mark.parametrize("candidate", [SPLIT, FUSED], ids=lambda c: c.name)
def test_launch_is_the_build(candidate, name, segments, launched, built):
    base = dict(batch=2, seq_len=200, heads_qk=2, heads_v=4, head_dim_k=32, head_dim_v=32,
                dtype="fp16")  # fmt: skip
    problem = LinearAttentionProblem(**{**base, **PROBLEMS[name]})
    if candidate is FUSED and segments:
        pytest.skip("fused runs one serial chain (segment_chunks must be 0)")
    sel = select(problem, "sm90", algorithm=candidate.name, allow_opt_in=True, family="kda")
    spec = sel.spec
    # warps and stages off every default, so a launch that drops one is seen
    tile = attrs.evolve(spec.tile, num_warps=2)
    scan = attrs.evolve(spec.scan, segment_chunks=segments)
    if candidate is SPLIT:
        scan = attrs.evolve(scan, num_warps=8, num_stages=3)
    else:
        scan = attrs.evolve(scan, num_warps=2)
    spec = attrs.evolve(spec, tile=tile, scan=scan)
    assert candidate.is_valid(spec, sel.target, problem).ok
    from kreg.families.kda.api import run_selection

    run_selection(attrs.evolve(sel, spec=spec), _call(problem), problem)
    for build in candidate.builders.values():
        build(spec, sel.target, problem)
    assert launched, "nothing launched"
    # the varlen tables kernel is every packed batch's, no spec's: test_tables_kernel_builds
    tables = [k for k in launched if k[0] == "kda_varlen_tables_kernel"]
    assert len(tables) == (1 if problem.varlen else 0)
    launched = [k for k in launched if k not in tables]
    assert sorted(launched) == sorted(built)
    kinds = {k[0] for k in launched}
    expected = {"kda.split": {"kda_chunk_prep_kernel", "kda_chunk_scan_kernel"},
                "kda.fused": {"kda_chunk_fused_kernel"}}[candidate.name]  # fmt: skip
    if segments:
        expected |= {"kda_segment_map_kernel", "kda_segment_combine_kernel"}
    if problem.gate_lower_bound is None:  # the safe anchor: its pairs kernel first
        expected |= {"kda_chunk_pairs_kernel"}
    assert kinds == expected


@pytest.mark.parametrize("chunk,hs_size", [(64, 0), (0, 0), (32, 128)])
def test_tables_kernel_builds(chunk, hs_size):
    """The varlen tables kernel compiles for sm90 in each of its forms (offsets alone, with the
    chunk tables, with the chunk-state rows): a compile error shows up without a GPU."""
    from kreg.registry import get_registry

    art = builders.build_kda_varlen_tables(get_registry().targets["sm90"], chunk, hs_size)
    assert art.kernel == "kda_varlen_tables_kernel"
