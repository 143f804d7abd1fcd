"""``kda.recurrent`` on a GPU: CUDA graph capture on a state pool (and the chunked form's
pooled prefill, its gather and scatter), fla's ``fused_recurrent_kda`` on the same inputs (when
fla-core is importable), the float64 oracle at K = V = 128 bf16, and the JIT's kernel against
the AOT build. One short run:

    python -m pytest tests/test_kda_recurrent_gpu.py -q
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

N, H, HV, K = 8, 4, 8, 128


def inputs(T=1, N=N, seed=0, raw=False):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    norm = torch.nn.functional.normalize

    def rnd(*s):
        return torch.randn(s, generator=gen, device="cuda")

    q, k = rnd(N, T, H, K), rnd(N, T, H, K)
    if not raw:
        q, k = norm(q, dim=-1), norm(k, dim=-1)
    g = rnd(N, T, HV, K) if raw else -5 * torch.rand((N, T, HV, K), generator=gen, device="cuda")
    beta = rnd(N, T, HV) if raw else torch.rand((N, T, HV), generator=gen, device="cuda")
    x = dict(q=q, k=k, v=rnd(N, T, HV, K), g=g, beta=beta)
    return {n: t.bfloat16() for n, t in x.items()}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("T", [1, 64])  # 64: the chunked form, its gather and scatter captured
def test_graph_captured_pool_step_equals_eager(T):
    import torch

    from kreg.families.kda import kda_prefill

    x = inputs(T=T)
    pool = 0.1 * torch.randn(3 * N, HV, K, K, device="cuda")
    idx = torch.randperm(3 * N, device="cuda")[:N]  # int64: no conversion kernel
    idx[1] = -1  # a padding slot
    ref_pool = pool.clone()
    ref_o, _ = kda_prefill(**x, initial_state=ref_pool, initial_state_indices=idx.clone())
    kda_prefill(**x, initial_state=pool.clone(), initial_state_indices=idx)  # warm (compile)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, ret = kda_prefill(**x, initial_state=pool, initial_state_indices=idx)
    assert ret is pool
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o, ref_o) and torch.equal(pool, ref_pool)
    # a replay reads the indices captured by address: new slots, new results
    idx.copy_(torch.randperm(3 * N, device="cuda")[:N])
    again = pool.clone()
    ref_o2, _ = kda_prefill(**x, initial_state=again, initial_state_indices=idx.clone())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o, ref_o2) and torch.equal(pool, again)


def test_matches_the_float64_oracle():
    import torch

    from kreg.families.kda import kda_prefill
    from kreg.families.kda.oracles import relative_rms, token_serial_oracle

    x = inputs(T=4, seed=1)
    h0 = 0.1 * torch.randn(N, HV, K, K, device="cuda")
    o, ht = kda_prefill(**x, initial_state=h0, output_final_state=True)
    ro, rh = token_serial_oracle(**x, initial_state=h0)
    assert relative_rms(o, ro) < 1e-2 and relative_rms(ht, rh) < 1e-2


def _fla():
    try:
        from kreg.families.kda.bench.decode import load_fla_recurrent
    except ImportError:
        return None
    fn, _ = load_fla_recurrent()
    return fn


@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("case", ["plain", "gate_norms", "sigmoid_bound", "vk", "varlen"])
def test_equals_fla_fused_recurrent_kda(case, T):
    import torch

    from kreg.compat.fla import fused_recurrent_kda

    fla = _fla()
    if fla is None:
        pytest.skip("fla-core not importable")
    x = inputs(T=T, seed=2, raw=case in ("gate_norms", "sigmoid_bound"))
    kw = dict(output_final_state=True)
    vk = case == "vk"
    h0 = 0.1 * torch.randn(N, HV, K, K, device="cuda")
    kw["initial_state"] = h0.transpose(-1, -2).contiguous() if vk else h0
    if vk:
        kw["state_v_first"] = True
    if case in ("gate_norms", "sigmoid_bound"):
        kw.update(A_log=torch.randn(HV, device="cuda") * 0.5,
                  dt_bias=torch.randn(HV * K, device="cuda"), use_gate_in_kernel=True,
                  use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)  # fmt: skip
        if case == "sigmoid_bound":
            kw["lower_bound"] = -5.0
    if case == "varlen":
        x = {n: t.reshape(1, N * T, *t.shape[2:]) for n, t in x.items()}
        kw["cu_seqlens"] = torch.arange(0, N * T + 1, T, device="cuda", dtype=torch.int32)
    o, ht = fused_recurrent_kda(**x, **kw)
    with torch.inference_mode():
        fo, fh = fla(**x, **kw)
    assert rel(o, fo) < 1e-2 and rel(ht, fh) < 1e-2, (rel(o, fo), rel(ht, fh))


def test_jit_kernel_equals_the_aot_build():
    import torch

    from kreg.dispatch import select
    from kreg.families.kda import api, recurrent_kernels
    from kreg.registry.compile import _ptxas_report, normalise_ir

    x = inputs(seed=3)
    pool = torch.zeros(2 * N, HV, K, K, device="cuda")
    # int32 slots, as engines pass them and as the AOT build assumes (int64 runs the JIT's twin)
    idx = torch.arange(N, device="cuda", dtype=torch.int32)
    args = dict(x, initial_state=pool, initial_state_indices=idx)
    problem, _ = api._prepare(
        x["q"], x["k"], x["v"], x["g"], x["beta"], None, pool, False, None, None, None, None,
        None, "none", False, False, "kv", False, None, idx, None,
    )  # fmt: skip
    target = api._target(x["q"], None)
    sel = select(problem, target)
    assert sel.candidate.name == "kda.recurrent"
    fn = recurrent_kernels.kda_recurrent_kernel
    fn.device_caches.clear()
    api.kda_prefill(**args)
    torch.cuda.synchronize()
    [ck] = [ck for entry in fn.device_caches.values() for ck in entry[0].values()]
    art = sel.candidate.builders["recurrent"](sel.spec, target, problem)
    for stage, text in art.stages.items():
        assert normalise_ir(ck.asm[stage]) == normalise_ir(text), stage
    assert ck.n_regs == art.registers
    assert _ptxas_report(ck.asm["ptx"], target)["spills"] == art.spills


def test_pooled_step_equals_fla_pooled_step():
    """The decode benchmark's pool pair is like with like: kreg's pooled step and fla's
    ``fused_recurrent_kda_fwd(..., ssm_state_indices, inplace_final_state=True)`` on equal
    pools through the same slots give the same outputs and write the same slots."""
    import torch

    from kreg.families.kda import kda_prefill
    from kreg.families.kda.bench.decode import load_fla_pooled

    fla_pooled, reason = load_fla_pooled()
    if fla_pooled is None:
        pytest.skip(reason)
    x = inputs(T=1, seed=3)
    pool = 0.1 * torch.randn(2 * N, HV, K, K, device="cuda")
    slots = torch.randperm(2 * N, device="cuda")[:N].to(torch.int32)
    theirs = pool.clone()
    o, _ = kda_prefill(**x, initial_state=pool, initial_state_indices=slots)
    with torch.inference_mode():
        fo, _ = fla_pooled(**x, scale=K**-0.5, initial_state=theirs, ssm_state_indices=slots,
                           inplace_final_state=True)  # fmt: skip
    assert rel(o, fo) < 1e-2
    written = slots.long()
    assert rel(pool[written], theirs[written]) < 1e-4
    rest = torch.ones(2 * N, dtype=torch.bool, device="cuda")
    rest[written] = False
    assert torch.equal(pool[rest], theirs[rest])
