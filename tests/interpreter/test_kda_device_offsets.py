"""Varlen from device offsets alone: no host read, same results as with ``cu_seqlens_cpu``.

On the CPU the offsets are host memory, which ``kda_prefill`` validates as it may; the fixture
``device_offsets`` makes it treat them as a GPU call treats device offsets (``_readable_offsets``
sees only ``cu_seqlens_cpu``), and makes every host read of the offsets tensor raise, so these
tests run exactly the path a device-only call takes.
"""

from __future__ import annotations

import pytest
import torch
import triton
from bitwise import assert_bitwise_equal  # tests/ is on sys.path (rootdir conftest)
from torch.overrides import TorchFunctionMode

from kreg.compat.fla import chunk_kda, fused_recurrent_kda
from kreg.families.kda import api, plans
from kreg.families.kda.builders import tables_launch
from kreg.families.kda.table_kernels import kda_varlen_tables_kernel

FP16, FP32 = torch.float16, torch.float32


class HostRead(AssertionError):
    pass


class _NoReads(TorchFunctionMode):
    """Raises ``HostRead`` when a torch function other than a metadata query (or a dtype
    conversion, a device op on a GPU) is given a watched tensor."""

    def __init__(self):
        super().__init__()
        self.watched: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if plans.in_launch():  # a kernel reads it (the interpreter through host copies)
            return func(*args, **kwargs)
        flat = [*args, *kwargs.values()]
        flat += [y for x in flat if isinstance(x, (list, tuple)) for y in x]
        name = plans._name(func)
        allowed = name in plans._METADATA or name in ("untyped_storage", "contiguous") or (
            name == "to" and not any(isinstance(a, (str, torch.device)) for a in flat)
            and "device" not in kwargs
        )  # fmt: skip
        if not allowed and any(x is w for x in flat for w in self.watched):
            raise HostRead(f"{name} was given the device offsets")
        return func(*args, **kwargs)


@pytest.fixture
def device_offsets(monkeypatch):
    """Returns ``watch(tensor)``: any op reading a watched tensor's values raises ``HostRead``
    (the kernels read it through its pointer); CPU offsets are taken as device ones."""
    monkeypatch.setattr(api, "_readable_offsets", lambda cu, cu_cpu: cu_cpu)
    mode = _NoReads()
    with mode:
        yield lambda t: mode.watched.append(t) or t


def inputs(T, H=2, K=32, dtype=FP16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    k = rnd(1, T, H, K)
    return dict(q=rnd(1, T, H, K).to(dtype), k=(k / k.norm(dim=-1, keepdim=True)).to(dtype),
                v=rnd(1, T, H, K).to(dtype), g=rnd(1, T, H, K).to(dtype),
                beta=torch.rand(1, T, H, generator=gen).to(dtype))  # fmt: skip


GATE = dict(use_gate_in_kernel=True, A_log=torch.tensor([0.3, -0.5]),
            dt_bias=torch.linspace(-1, 1, 64), use_qk_l2norm_in_kernel=True)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("chunk_size", [64, 32])
def test_chunk_kda_device_offsets_equal_host_offsets(device_offsets, dtype, chunk_size):
    """Mixed lengths (an empty sequence, one under a chunk, one over several), with states in
    and out and the chunk states: bit for bit the host-offset call's, whose chunk states are
    the first rows of the device call's (the device call cannot know how many are written)."""
    T = 150
    x = inputs(T)
    cu = torch.tensor([0, 0, 9, 150], dtype=dtype)
    h0 = torch.randn(3, 2, 32, 32)
    kw = dict(GATE, initial_state=h0, output_final_state=True, return_intermediate_states=True,
              chunk_size=chunk_size)  # fmt: skip
    want = chunk_kda(**x, cu_seqlens=cu, cu_seqlens_cpu=cu.clone(), **kw)
    got = chunk_kda(**x, cu_seqlens=device_offsets(cu), **kw)
    assert_bitwise_equal(got[:2], want[:2])
    rows = want[2].shape[1]
    assert got[2].shape[1] == triton.cdiv(T, chunk_size) + 2  # the bound: a part chunk each
    assert_bitwise_equal((got[2][:, :rows],), (want[2],))


def test_max_seqlen_hint_plans_as_the_host_offsets_do(device_offsets):
    """With the engines' max_seqlen the device call's problem is the host call's (same
    selection, same NSEG); without it the mean plans it. Results agree bit for bit either
    way (the plan never changes what a sequence computes)."""
    T = 200
    x = inputs(T)
    cu = torch.tensor([0, 3, 190, 200])
    host = cu.clone()
    host_problem, _ = api._prepare(**x, cu_seqlens=host, cu_seqlens_cpu=host)
    hinted, _ = api._prepare(**x, cu_seqlens=device_offsets(cu), max_seqlen=187)
    plain, _ = api._prepare(**x, cu_seqlens=cu)
    assert hinted == host_problem and hinted.longest_seq == 187
    assert plain.max_seqlen is None and plain.longest_seq == 67  # ceil(200 / 3)
    want = api.kda_prefill(**x, cu_seqlens=host, cu_seqlens_cpu=host, output_final_state=True)
    for hint in (None, 187):
        got = api.kda_prefill(**x, cu_seqlens=cu, max_seqlen=hint, output_final_state=True)
        assert_bitwise_equal(got, want)


@pytest.mark.parametrize("segment_chunks", [0, 2])
def test_segmented_scan_on_device_offsets(device_offsets, segment_chunks):
    """The sequence-parallel scan planned for the mean (a long sequence's last segment runs its
    extra chunks) equals the serial scan on host offsets."""
    from test_kda_numerics import run

    x = inputs(160, dtype=FP32)
    cu = torch.tensor([0, 10, 20, 160])
    want = run(x, chunk=16, cu_seqlens=cu, cu_seqlens_cpu=cu, output_final_state=True)
    got = run(x, chunk=16, segment_chunks=segment_chunks, cu_seqlens=device_offsets(cu),
              output_final_state=True)  # fmt: skip
    torch.testing.assert_close(got[0], want[0], rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(got[1], want[1], rtol=2e-3, atol=2e-3)


def test_decode_on_device_offsets_and_device_pool(device_offsets, monkeypatch):
    """fused_recurrent_kda with device offsets and device pool slots (int32, a padding slot):
    no host read of either, the recurrence selected (the mean is 1 token), the pool written as
    with host offsets."""
    x = inputs(4)
    cu = torch.arange(5)
    slots = torch.tensor([5, -1, 0, 2], dtype=torch.int32)
    pool = torch.randn(6, 2, 32, 32)
    pools = [pool, pool.clone()]
    want = fused_recurrent_kda(**x, initial_state=pools[0], cu_seqlens=cu, ssm_state_indices=slots,
                               **GATE)  # fmt: skip
    # the slots on the device: the pool check reads no host copy
    monkeypatch.setattr(api, "_pool_slots", _device_pool_slots)
    got = fused_recurrent_kda(**x, initial_state=pools[1], cu_seqlens=device_offsets(cu),
                              ssm_state_indices=device_offsets(slots), **GATE)  # fmt: skip
    assert_bitwise_equal(got, want)
    assert_bitwise_equal((pools[1],), (pools[0],))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_decode_clamps_each_sequence_of_bad_device_offsets(device_offsets, dtype):
    """The decode step reads the caller's offsets in one launch (no cleaning kernel before it),
    clamping each sequence's start and end into [0, T] itself: offsets past either end of the
    batch give the call on the clamped offsets, bit for bit, int32 or int64 alike."""
    x = inputs(12)
    h0 = torch.randn(4, 2, 32, 32)
    bad = torch.tensor([-3, 4, 4, 9, 30], dtype=dtype)
    safe = torch.tensor([0, 4, 4, 9, 12])
    want = fused_recurrent_kda(**x, initial_state=h0, output_final_state=True, cu_seqlens=safe,
                               **GATE)  # fmt: skip
    got = fused_recurrent_kda(**x, initial_state=h0, output_final_state=True,
                              cu_seqlens=device_offsets(bad), **GATE)  # fmt: skip
    assert_bitwise_equal(got, want)


def _device_pool_slots(indices, indices_cpu, pool):
    return None if indices is None else api._device_slots(indices)


def test_bad_device_offsets_are_made_safe(device_offsets):
    """Offsets that break the contract are not refused (nothing reads them on the host) but
    clamped into [0, T] and made non-decreasing before any kernel reads them: the call equals
    one on those offsets, and no kernel reads out of bounds."""
    x = inputs(50)
    bad = torch.tensor([-7, 5, 3, 40, 99])
    safe = torch.tensor([0, 5, 5, 40, 50])
    got = api.kda_prefill(**x, cu_seqlens=device_offsets(bad), output_final_state=True)
    want = api.kda_prefill(**x, cu_seqlens=safe, cu_seqlens_cpu=safe, output_final_state=True)
    assert_bitwise_equal(got, want)


def _tables_reference(cu, T, C, HS):
    """The tables as the torch ops made them before the kernel (and as they still define it)."""
    cu = torch.cummax(cu.to(torch.int64).clamp(0, T), 0).values
    n = cu.numel() - 1

    def prefix(size):
        out = torch.zeros(n + 1, dtype=torch.int32)
        out[1:] = torch.cumsum(
            torch.div(cu[1:] - cu[:-1] + size - 1, size, rounding_mode="floor"), 0
        )
        return out

    seq_chunk = prefix(C)
    nc = triton.cdiv(T, C) + n
    ids = torch.arange(nc, dtype=torch.int32)
    chunk_seq = torch.searchsorted(seq_chunk[1:], ids, right=True).to(torch.int32).clamp(max=n - 1)
    return cu, seq_chunk, chunk_seq, prefix(HS), nc


@pytest.mark.parametrize("seed", range(8))
def test_tables_kernel_equals_the_torch_tables(seed):
    """Random offsets, valid or not, int32 or int64, N across a few blocks of the kernel."""
    gen = torch.Generator().manual_seed(seed)
    N = int(torch.randint(1, 600, (1,), generator=gen))
    T = int(torch.randint(1, 4000, (1,), generator=gen))
    if seed % 2:
        cu = torch.randint(-50, T + 80, (N + 1,), generator=gen)
    else:
        cu = torch.sort(torch.randint(0, T + 1, (N + 1,), generator=gen)).values
        cu[0], cu[-1] = 0, T
    cu = cu.to(torch.int32 if seed % 4 < 2 else torch.int64)
    C, HS = (16, 32, 64, 128)[seed % 4], 64
    clean, seq_chunk, chunk_seq, hs_seq, nc = _tables_reference(cu, T, C, HS)
    got = [torch.empty_like(t) for t in (clean, seq_chunk, chunk_seq, hs_seq)]
    lc = tables_launch(C, HS)
    kda_varlen_tables_kernel[(1,)](cu, *got, N=N, T=T, NC=nc, STEPS=N.bit_length(),
                                   **lc.constexprs)  # fmt: skip
    for g, w in zip(got, (clean, seq_chunk, chunk_seq, hs_seq), strict=True):
        assert torch.equal(g, w)
