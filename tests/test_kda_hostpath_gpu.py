"""Device-only varlen and the thin host path on a GPU (skipped without one).

- A device-only varlen call never synchronises (``torch.cuda.set_sync_debug_mode("error")``),
  is captured in a CUDA graph and replays on new offsets and values copied into the static
  inputs, matching eager calls on them.
- Replays of a plan (the compiled launchers called directly) equal the normal path bit for
  bit; split == fused bit for bit on device offsets too.
- A planned call replays its plan: validation, selection and ``launch.py`` are not entered
  (host time is the benchmark's, ``benchmarks/kda_host_time.py``, against fla).
"""

from __future__ import annotations

import pytest
import torch
from bitwise import assert_bitwise_equal  # tests/ is on sys.path (rootdir conftest)

from kreg.compat.fla import chunk_kda, fused_recurrent_kda
from kreg.families.kda import api, plans

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
H, K = 4, 128


def inputs(T, seed=0, N=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device="cuda")  # noqa: E731
    k = rnd(1, T, H, K)
    return dict(q=rnd(1, T, H, K).to(BF16), k=(k / k.norm(dim=-1, keepdim=True)).to(BF16),
                v=rnd(1, T, H, K).to(BF16), g=rnd(1, T, H, K).to(BF16),
                beta=torch.rand(1, T, H, generator=gen, device="cuda").to(BF16))  # fmt: skip


def gate():
    return dict(use_gate_in_kernel=True, A_log=torch.linspace(-1, 1, H, device="cuda"),
                dt_bias=torch.linspace(-2, 2, H * K, device="cuda"),
                use_qk_l2norm_in_kernel=True)  # fmt: skip


def cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")


@pytest.fixture(autouse=True)
def fresh():
    api.clear_plans()
    yield
    api.clear_plans()


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_device_offsets_never_synchronise(fn):
    lengths = [1] * 16 if fn == "recurrent" else [0, 300, 17, 1200]
    T = sum(lengths)
    call = fused_recurrent_kda if fn == "recurrent" else chunk_kda
    x, offsets, g = inputs(T), cu(lengths), gate()
    h0 = torch.randn(len(lengths), H, K, K, device="cuda")
    call(**x, cu_seqlens=offsets, initial_state=h0, output_final_state=True, **g)  # compiles
    api.clear_plans()
    for _ in range(3):  # the normal path, the recording, a replay
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = call(**x, cu_seqlens=offsets, initial_state=h0, output_final_state=True, **g)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    want = call(**x, cu_seqlens=offsets, initial_state=h0, output_final_state=True, **g,
                **({"cu_seqlens_cpu": offsets.cpu()} if fn == "chunk" else {}))  # fmt: skip
    # with host offsets the plan knows the longest sequence: perhaps another spec, same maths
    torch.testing.assert_close(out[0].float(), want[0].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("max_seqlen", [None, 2048])
def test_cuda_graph_replays_device_offsets(max_seqlen):
    """Captured on one set of offsets, replayed on others (other lengths, an empty sequence, a
    long one among short ones) and new values: each replay equals an eager call on them."""
    T, N = 2048, 4
    static = inputs(T) | dict(cu_seqlens=cu([512] * N))
    g = gate()
    h0 = torch.randn(N, H, K, K, device="cuda")
    kw = dict(initial_state=h0, output_final_state=True, max_seqlen=max_seqlen, **g)

    def step():
        return chunk_kda(**static, **{k: v for k, v in kw.items() if k != "max_seqlen"}) \
            if max_seqlen is None else api.kda_prefill(
                **static, initial_state=h0, output_final_state=True, max_seqlen=max_seqlen,
                gate_activation="softplus", A_log=g["A_log"], dt_bias=g["dt_bias"],
                use_qk_l2norm=True)  # fmt: skip

    for _ in range(3):  # warm-up: compile, select, record the plan
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed, lengths in ((1, [1, 2000, 0, 47]), (2, [2048, 0, 0, 0]), (3, [512] * 4)):
        new = inputs(T, seed=seed)
        for name, t in new.items():
            static[name].copy_(t)
        static["cu_seqlens"].copy_(cu(lengths))
        graph.replay()
        api.clear_plans()
        eager = step()
        torch.cuda.synchronize()
        assert_bitwise_equal(out, eager)


@pytest.mark.parametrize("lengths", [[4096], [100, 3000, 1, 900]], ids=["one", "mixed"])
def test_replay_equals_normal_path_and_split_equals_fused(lengths):
    """The compiled launchers' replay equals the normal path; split == fused bit for bit on
    device offsets (specs.bitwise_pair, as with host offsets)."""
    import attrs

    from kreg.dispatch import select
    from kreg.families.kda.specs import bitwise_pair

    x, offsets, g = inputs(sum(lengths)), cu(lengths), gate()
    outs = [chunk_kda(**x, cu_seqlens=offsets, output_final_state=True, **g) for _ in range(4)]
    assert any(isinstance(p, plans.Plan) and p.compiled for p in api._plans.values())
    for o in outs[1:]:
        assert_bitwise_equal(o, outs[0])
    opts = dict(cu_seqlens=offsets, output_final_state=True, gate_activation="softplus",
                A_log=g["A_log"], dt_bias=g["dt_bias"], use_qk_l2norm=True)  # fmt: skip
    problem, call = api._prepare(**x, **opts)
    fused = select(problem, "sm90", algorithm="kda.fused", allow_opt_in=True)
    split = select(problem, "sm90", algorithm="kda.split")
    a = api.run_selection(attrs.evolve(split, spec=bitwise_pair(fused.spec)), call, problem)
    b = api.run_selection(fused, call, problem)
    assert_bitwise_equal(a, b)


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_planned_calls_skip_validation_selection_and_launch_py(fn, monkeypatch):
    """Once a key has a plan, back-to-back engine-shaped calls (device offsets, int32 pool slots
    for decode) replay it: validation, selection and launch.py are not entered, and the outputs
    equal the first call's. Its host time is the benchmark's (benchmarks/kda_host_time.py), not
    a timed test's."""
    from kreg.families.kda import launch

    x, g = inputs(64 if fn == "recurrent" else 256), gate()
    lengths = [1] * 64 if fn == "recurrent" else [100, 156]
    offsets = cu(lengths)
    pool = torch.zeros(80, H, K, K, device="cuda")
    slots = torch.arange(len(lengths), dtype=torch.int32, device="cuda")

    def call():
        if fn == "recurrent":
            return fused_recurrent_kda(**x, cu_seqlens=offsets, initial_state=pool.clone(),
                                       ssm_state_indices=slots, **g)[0]  # fmt: skip
        return chunk_kda(**x, cu_seqlens=offsets, output_final_state=True, **g)

    first = call()
    call()  # recorded: a key seen twice gets its plan
    entered = []
    for name in ("_prepare", "select"):
        monkeypatch.setattr(api, name, lambda *a, _n=name, **k: entered.append(_n))
    monkeypatch.setattr(launch, "_launch", lambda *a, **k: entered.append("_launch"))
    for _ in range(3):
        assert_bitwise_equal(call(), first)
    assert entered == []
