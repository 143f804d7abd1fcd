"""Chunk states for prefix caching at the caller's spacing and dtype, under the Triton
interpreter: ``chunk_states_size`` tokens apart (a multiple of the kernel chunk) they are the
full-rate states (one per kernel chunk) subsampled, bit for bit, on every path (split, fused,
segmented scan, varlen with empty and ragged sequences, both layouts); in bf16 or fp16 they are
the fp32 states rounded; the default spacing, 64, is fla's whatever chunk the kernels run; and
fla's ``return_intermediate_states`` returns them in fla's shape and dtype.
"""

from __future__ import annotations

import pytest
import test_kda_numerics as numerics  # same folder: pytest puts it on sys.path
import torch

from kreg.compat.fla import chunk_kda
from kreg.dispatch import select
from kreg.families.kda import api
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

C = 16  # the kernel chunk pinned here: sizes 16..128 are 1..8 chunks apart
HV = 2
CU = [0, 37, 37, 100, 116, 180]  # an empty sequence, lengths not multiples of anything
LENGTHS = [b - a for a, b in zip(CU[:-1], CU[1:], strict=True)]


def _subsampled(full, lengths, every):
    """Every ``every``-th row of each sequence's full-rate (one per chunk) states."""
    rows, at = [], 0
    for n in lengths:
        nc = -(-n // C)
        rows.append(full[at : at + nc : every])
        at += nc
    assert at == full.shape[0]
    return torch.cat(rows)


CASES = {
    "fixed": dict(B=2, varlen=False, fused=False, seg=0, layout="kv"),
    "fixed_vk_fused": dict(B=2, varlen=False, fused=True, seg=0, layout="vk"),
    "varlen": dict(B=1, varlen=True, fused=False, seg=0, layout="kv"),
    "varlen_fused_vk": dict(B=1, varlen=True, fused=True, seg=0, layout="vk"),
    "varlen_segments": dict(B=1, varlen=True, fused=False, seg=3, layout="kv"),
    "fixed_segments": dict(B=2, varlen=False, fused=False, seg=2, layout="vk"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_spaced_states_are_the_full_rate_states_subsampled(name):
    case = CASES[name]
    T = CU[-1] if case["varlen"] else 90
    x = numerics.make(B=case["B"], T=T, H=1, HV=HV, K=32, V=32, dtype=torch.float32, seed=31)
    n = len(CU) - 1 if case["varlen"] else case["B"]
    h0 = numerics.state(n, HV, 32, 32)
    kw = dict(initial_state=h0, output_final_state=True, output_chunk_states=True,
              state_layout=case["layout"], fused=case["fused"], segment_chunks=case["seg"])  # fmt: skip
    if case["varlen"]:
        kw["cu_seqlens"] = torch.tensor(CU)
    lengths = LENGTHS if case["varlen"] else [T] * case["B"]
    o, ht, full = numerics.run(x, chunk=C, chunk_states_size=C, **kw)
    for size in (32, 48, 64, 128):
        o_s, ht_s, hs = numerics.run(x, chunk=C, chunk_states_size=size, **kw)
        want = _subsampled(full, lengths, size // C)
        assert hs.shape[0] == sum(-(-n // size) for n in lengths)
        numerics.assert_equal(hs, want, f"states every {size} tokens")
        numerics.assert_equal(o_s, o, "o")  # the outputs do not depend on the spacing
        numerics.assert_equal(ht_s, ht, "final state")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_dtypes_are_the_fp32_states_rounded(dtype):
    x = numerics.make(T=100, H=1, HV=HV, K=32, V=32, dtype=torch.float32, seed=32)
    kw = dict(output_chunk_states=True, chunk_states_size=32, cu_seqlens=torch.tensor([0, 40, 100]))
    wide = api.kda_prefill(**x, **kw)[2]
    narrow = api.kda_prefill(**x, **kw, chunk_states_dtype=dtype)[2]
    assert narrow.dtype == dtype
    # the fp32 state rounded to the narrow dtype: within one of its ulps (the interpreter's
    # bf16 conversion does not round as torch's does, so not bit for bit against wide.to)
    err = (narrow.double() - wide.double()).abs()
    assert bool((err <= torch.finfo(dtype).eps * wide.double().abs() + 1e-30).all())
    assert not torch.equal(narrow.double(), wide.double())  # rounded, not fp32 in disguise


@pytest.mark.parametrize("chunk", [16, 32, 64])
def test_default_spacing_is_64_tokens_whatever_the_kernel_chunk(chunk):
    """The kernels' chunk does not show: states every 64 tokens, matching the float64
    chunkwise oracle at chunk 64."""
    x = numerics.make(B=2, T=150, H=1, HV=HV, K=32, V=32, dtype=torch.float32, seed=33)
    h0 = numerics.state(2, HV, 32, 32)
    o, ht, hs = numerics.run(x, chunk=chunk, initial_state=h0, output_chunk_states=True)
    _, _, ref = numerics.tile_oracle(**x, initial_state=h0, chunk=64, return_chunk_states=True)
    ref = ref.swapaxes(1, 2).reshape(-1, HV, 32, 32)  # [B, HV, NT, ..] -> [B * NT, HV, ..]
    assert hs.shape == ref.shape == (2 * 3, HV, 32, 32)
    numerics.assert_close(hs, (ref,), numerics.TOL[torch.float32], "chunk states")


@pytest.mark.parametrize("size", [0, 8, 24, 100, -64, 64.0, True])
def test_bad_spacing_is_refused_by_name(size):
    x = numerics.make(T=40, K=32, V=32)
    with pytest.raises(ValueError, match="^chunk_states_size: must be a positive"):
        api.kda_prefill(**x, output_chunk_states=True, chunk_states_size=size)


def test_a_spacing_only_some_chunks_divide_restricts_the_specs():
    """48 tokens: only chunk-16 specs are valid (an error would name the argument, not a
    launch)."""
    x = numerics.make(T=200, K=32, V=32)
    problem, _ = api._prepare(**x, output_chunk_states=True, chunk_states_size=48)
    spec = select(problem, "sm90").spec
    assert spec.tile.chunk == 16 and spec.scan.chunk_states_every == 3


# --- fla's return_intermediate_states ----------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [64, 32])
@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_fla_intermediate_states_shape_dtype_and_values(chunk_size, varlen):
    """fla 0.6.0: h [B, NT, HV, K, V] in k's dtype, the state at the start of every chunk_size
    tokens; with cu_seqlens B = 1 and NT every sequence's chunks in order."""
    B = 1 if varlen else 2
    x = numerics.make(B=B, T=CU[-1], H=1, HV=HV, K=32, V=32, dtype=torch.float16, seed=34)
    extra = dict(cu_seqlens=torch.tensor(CU)) if varlen else {}
    o, ht, h = chunk_kda(**x, return_intermediate_states=True, chunk_size=chunk_size, **extra)
    assert ht is None and h.dtype == torch.float16
    nt = sum(-(-n // chunk_size) for n in LENGTHS) if varlen else -(-CU[-1] // chunk_size)
    assert h.shape == (B, nt, HV, 32, 32)
    want = api.kda_prefill(**x, output_chunk_states=True, chunk_states_size=chunk_size,
                           chunk_states_dtype=torch.float16, **extra)  # fmt: skip
    numerics.assert_equal(h.reshape(-1, HV, 32, 32), want[2], "h")
    numerics.assert_equal(o, want[0], "o")
    _, _, ref = numerics.tile_oracle(**x, chunk=chunk_size, return_chunk_states=True, **extra)
    ref = ref if varlen else ref.swapaxes(1, 2).reshape(-1, HV, 32, 32)
    numerics.assert_close(want[2].float(), (ref,), numerics.TOL[torch.float16], "h vs oracle")


def test_fla_use_graph_returns_the_static_buffer():
    """With use_graph fla sizes h by ceil(T / chunk_size) + N - 1 rows (static chunk indices),
    the written rows first."""
    x = numerics.make(T=CU[-1], H=1, HV=HV, K=32, V=32, dtype=torch.float16, seed=35)
    cu = torch.tensor(CU)
    _, _, h = chunk_kda(**x, cu_seqlens=cu, return_intermediate_states=True, use_graph=True)
    _, _, trimmed = chunk_kda(**x, cu_seqlens=cu, return_intermediate_states=True)
    assert h.shape[1] == -(-CU[-1] // 64) + len(CU) - 2
    numerics.assert_equal(h[:, : trimmed.shape[1]], trimmed, "written rows")
