"""The thin host path (``plans``): a key's second call records a plan, later calls replay it.

Under the interpreter the replay launches through ``fn[grid](...)``; the compiled launchers are
the GPU lane's (``tests/test_kda_hostpath_gpu.py``). What holds here: replays equal the normal
path bit for bit with fresh outputs, they skip validation and selection, what a replay cannot
reproduce (a padded copy) gets no plan, and a call that differs in anything validated misses
the key.
"""

from __future__ import annotations

import pytest
import torch
from bitwise import assert_bitwise_equal  # tests/ is on sys.path (rootdir conftest)
from torch.overrides import TorchFunctionMode

from kreg.compat.fla import chunk_kda, fused_recurrent_kda
from kreg.families.kda import api, plans

FP16 = torch.float16
_EMPTY, _EMPTY_LIKE = torch.empty, torch.empty_like  # at import: before the lane's NaN fill
GATE = dict(use_gate_in_kernel=True, A_log=torch.tensor([0.3, -0.5]),
            dt_bias=torch.linspace(-1, 1, 64), use_qk_l2norm_in_kernel=True)  # fmt: skip


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No plans from other tests; torch.empty unpoisoned (the lane's NaN fill is a torch op
    the recorder would refuse); ``prepared`` counts the normal path's calls."""
    monkeypatch.setattr(torch, "empty", _EMPTY)
    monkeypatch.setattr(torch, "empty_like", _EMPTY_LIKE)
    api.clear_plans()
    calls = []
    original = api._prepare
    monkeypatch.setattr(api, "_prepare", lambda *a, **k: calls.append(1) or original(*a, **k))
    monkeypatch.setattr(api, "_readable_offsets", lambda cu, cu_cpu: cu_cpu)  # device offsets
    yield calls
    api.clear_plans()


def inputs(T, H=2, K=32, dtype=FP16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(dtype)  # noqa: E731
    return dict(q=rnd(1, T, H, K), k=rnd(1, T, H, K), v=rnd(1, T, H, K), g=rnd(1, T, H, K),
                beta=torch.rand(1, T, H, generator=gen).to(dtype))  # fmt: skip


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_replay_equals_the_normal_path(fresh, fn):
    T = 40 if fn == "chunk" else 3
    cu = torch.tensor([0, 1, 1, T]) if fn == "chunk" else torch.arange(T + 1)
    call = chunk_kda if fn == "chunk" else fused_recurrent_kda
    kw = dict(GATE, cu_seqlens=cu, output_final_state=True)
    x = inputs(T)
    first = call(**x, **kw)
    second = call(**x, **kw)  # recorded
    assert len(fresh) == 2
    assert isinstance(next(iter(api._plans.values())), plans.Plan)
    other = inputs(T, seed=1)  # new values in tensors of the same key
    replays = [call(**x, **kw), call(**other, **kw)]
    assert len(fresh) == 2, "a replay ran the normal path"
    assert_bitwise_equal(replays[0], first)
    assert_bitwise_equal(second, first)
    api.clear_plans()
    assert_bitwise_equal(replays[1], call(**other, **kw))
    assert replays[0][0].data_ptr() != first[0].data_ptr()  # outputs are fresh tensors


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_a_head_dim_the_kernels_lack(fresh, fn):
    """K = 20 (kernels at 32): the chunked form reads it through masked tiles, so its calls
    are planned and replayed; the decode step runs on zero-padded copies made per call, which a
    replay cannot reproduce: no plan, every call the normal path. Right results either way."""
    T = 20 if fn == "chunk" else 1
    call = chunk_kda if fn == "chunk" else fused_recurrent_kda
    x = inputs(T, K=20)
    gate = dict(GATE, dt_bias=torch.zeros(40))
    outs = [call(**x, output_final_state=True, **gate) for _ in range(3)]
    if fn == "chunk":
        assert [type(p) for p in api._plans.values()] == [plans.Plan]
        assert len(fresh) == 2  # the third call replayed
    else:
        assert list(api._plans.values()) == [False]
        assert len(fresh) == 3
    assert_bitwise_equal(outs[2], outs[0])


def test_a_call_differing_in_anything_validated_misses(fresh):
    """After a plan exists, a bad argument of the same shapes still gets its named error (it is
    another key: the normal path validates it)."""
    x = inputs(32)
    for _ in range(3):
        api.kda_prefill(**x)
    assert len(fresh) == 2
    bad = {**x, "k": x["k"].clone().requires_grad_()}
    with pytest.raises(ValueError, match="^k: requires grad"):
        api.kda_prefill(**bad)
    with pytest.raises(ValueError, match="^g: "):
        api.kda_prefill(**{**x, "g": x["g"][..., :16]})
    with pytest.raises(ValueError, match="^scale: "):
        api.kda_prefill(**x, scale=float("nan"))
    with pytest.raises(ValueError, match="^use_qk_l2norm: must be a bool"):
        api.kda_prefill(**x, use_qk_l2norm=0)  # == False, the planned call's value
    with torch.no_grad():  # grad off: a tensor requiring grad is served (another key)
        api.kda_prefill(**bad)


class _TorchWork(TorchFunctionMode):
    """Records the torch functions a call runs outside kernel launches, metadata reads aside."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not plans.in_launch() and plans._name(func) not in plans._METADATA:
            self.ops.append(plans._name(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_a_decode_step_as_engines_call_it_is_one_planned_launch(fresh, monkeypatch, index_dtype):
    """vLLM's and SGLang's decode step (device offsets, pool slots, the pool written in place)
    replays as one launch that reads the caller's slots and offsets as given: no cleaning
    kernel, no dtype conversion (each a launch and an allocation on every token's host path)."""
    N, P = 3, 5
    x = inputs(N)
    monkeypatch.setattr(api, "_readable_slots", lambda i, i_cpu: i_cpu)  # device slots
    kw = dict(GATE, cu_seqlens=torch.arange(N + 1, dtype=index_dtype),
              ssm_state_indices=torch.tensor([4, 0, 2], dtype=index_dtype),
              inplace_final_state=True)  # fmt: skip
    pools = [torch.randn(P, 2, 32, 32)]
    pools.append(pools[0].clone())
    for _ in range(2):  # the key's second call records its plan
        fused_recurrent_kda(**x, initial_state=pools[1], **kw)
    (plan,) = api._plans.values()
    assert isinstance(plan, plans.Plan)
    assert [L.lc.name for L in plan.launches] == ["kda_recurrent_kernel"]
    with _TorchWork() as work:  # a replay: the output's allocation, then the launch
        fused_recurrent_kda(**x, initial_state=pools[1], **kw)
    assert work.ops == ["empty_like"] or work.ops == ["empty"], work.ops
    as64 = {n: kw[n].to(torch.int64) for n in ("cu_seqlens", "ssm_state_indices")}
    for _ in range(3):  # as pools[1]: two calls and the replay, int64 slots and offsets
        fused_recurrent_kda(**x, initial_state=pools[0], **{**kw, **as64})
    assert_bitwise_equal((pools[1],), (pools[0],))


def test_a_compiled_replay_launches_the_interpreted_replays_arguments_as_addresses(fresh):
    """On a GPU a replay passes every tensor as its address (``_Launch.pointers``, the
    buffers' and inputs' ``data_ptr``) to the launcher's C entry. Replayed here as a compiled
    plan does, with the C entry recording what it gets: each argument is the interpreted
    replay's, a tensor as its address; the intermediates share one workspace at aligned,
    disjoint offsets."""
    import types

    T = 40
    x = inputs(T)
    kw = dict(GATE, cu_seqlens=torch.tensor([0, 7, T]), output_final_state=True)
    for _ in range(2):
        chunk_kda(**x, **kw)
    (plan,) = api._plans.values()
    interpreted = []
    for L in plan.launches:  # the interpreted replay's arguments, launch by launch
        L.lc = types.SimpleNamespace(
            fn={L.grid: lambda _L=L, **a: interpreted.append([a[n] for n in _L.names])},
            num_warps=4, num_stages=1)  # fmt: skip
    chunk_kda(**x, **kw)
    compiled = []
    for L in plan.launches:  # as a CompiledKernel's launch (plans._Launch.__init__)
        L.run, L.function, L.packed = object(), 0, None
        L.pointers = [t.data_ptr() if isinstance(t, torch.Tensor) else t for t in L.template]
        L.direct = lambda stream, packed, *args: compiled.append(list(args))
    device = plan.device
    returned = {s[1] for s in plan.returns if s is not None and s[0] == "buf"}
    plans.Plan.__init__(plan, plan.buffers, plan.launches, plan.returns, returned,
                        types.SimpleNamespace(type="cuda", index=0))  # fmt: skip
    plan.device = device
    real = torch._C.__dict__.get("_cuda_getCurrentRawStream")
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    try:
        chunk_kda(**x, **kw)
    finally:
        if real is None:
            del torch._C._cuda_getCurrentRawStream
        else:
            torch._C._cuda_getCurrentRawStream = real
    assert len(compiled) == len(interpreted) == len(plan.launches)
    inputs_by_address = {t.data_ptr() for t in (*x.values(), kw["A_log"], kw["dt_bias"],
                                                 kw["cu_seqlens"])}  # fmt: skip
    spans = set()
    for L, ints, tensors in zip(plan.launches, compiled, interpreted, strict=True):
        for pos, (a, t) in enumerate(zip(ints, tensors, strict=True)):
            if not isinstance(t, torch.Tensor):
                assert a == t, (L.names[pos], a, t)
                continue
            assert isinstance(a, int) and a % 16 == 0, L.names[pos]
            slot = next((s for s in L.slots if s[0] == pos), None)
            if slot is not None and slot[1] == "in":
                assert a in inputs_by_address and a == t.data_ptr(), L.names[pos]
            elif slot is not None and plan.buffers[slot[2]] is not None:
                shape, dtype, _, _ = plan.buffers[slot[2]]
                spans.add((a, a + dtype.itemsize * max(1, int(torch.Size(shape).numel()))))
    ordered = sorted(spans)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(ordered, ordered[1:], strict=False))
