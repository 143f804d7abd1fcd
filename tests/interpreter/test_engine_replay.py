"""vLLM's and SGLang's KDA and GDN call sites (``tests/engine_calls.py``) replayed unchanged
on ``kreg.compat.fla`` (or ``kreg.compat.sglang``) under the Triton interpreter, against the float64 token-serial oracle:
outputs, the slots the call writes, and every other slot of the pool left bit for bit as it
was. fp16 activations (the interpreter's bf16 dot is wrong) and fp32 pools, K = V = 32.
"""

from __future__ import annotations

import engine_calls as ec  # tests/ (the rootdir conftest's folder) is on sys.path
import numpy as np
import pytest
import torch
from test_kda_numerics import TOL, assert_close

from kreg.compat import fla as shim
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

FP16 = torch.float16
CASES = ec.batches(prefill=(5, 1, 40))  # 40 > 16: prefill runs the chunked kernels


def _params() -> list:
    out = []
    for name, batch_id, batch in CASES:
        gap = ec.KNOWN_GAPS.get((name, batch_id))
        marks = [pytest.mark.xfail(raises=gap[0], strict=True, reason=gap[1])] if gap else []
        out.append(pytest.param(name, batch, id=f"{name}-{batch_id}", marks=marks))
    return out


def replay(name, batch, dtype=FP16, seed=0):
    call = ec.CALLS[name]
    t = ec.make_tensors(call, batch, dtype=dtype, seed=seed)
    want_o, want_pool = ec.expected(call, batch, t)
    got = ec.clone(t)
    with torch.no_grad():
        o = call.step(call.shim(), got)
    return call, t, got, o, want_o, want_pool


@pytest.mark.parametrize(("name", "batch"), _params())
def test_call_runs_unchanged_and_matches_the_oracle(name, batch):
    call, before, after, o, want_o, want_pool = replay(name, batch)
    assert isinstance(o, torch.Tensor) and o.shape == before["v"].shape and o.dtype == FP16
    assert_close(o, (want_o,), TOL[FP16], "o")
    n = len(batch.lengths)
    slots = before["slots"][:n].long()
    written = slots[slots >= 0]
    assert_close(after["pool"][written], (want_pool[written.numpy()],), TOL[FP16], "slots")
    untouched = np.setdiff1d(np.arange(batch.pool_size), written.numpy())
    assert untouched.size > 0  # the batches keep spare slots, so this check has teeth
    assert torch.equal(after["pool"][untouched], before["pool"][untouched]), "untouched slots"
    # the caller's inputs are not written (only the pool is, in place)
    for key in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "slots", "cu_seqlens"):
        assert torch.equal(after[key], before[key]), key


def test_call_layouts_are_the_engines():
    """The replayed tensors have the engines' layouts, so the shim is exercised on them: q, k,
    v non-contiguous views of one buffer where the engine splits them, int32 offsets and slots,
    fp32 g from the engines' gates (beta fp32, or in the activations' dtype from
    fused_gdn_gating), A_log fp32 [1, 1, HV, 1] (KDA) or [HV] (GDN)."""
    for name, _, batch in CASES:
        call = ec.CALLS[name]
        t = ec.make_tensors(call, batch, dtype=FP16)
        assert t["cu_seqlens"].dtype == t["slots"].dtype == torch.int32
        a_log = (batch.HV,) if call.family == "gdn" else (1, 1, batch.HV, 1)
        assert tuple(t["A_log"].shape) == a_log and t["A_log"].dtype == torch.float32
        g = (1, sum(batch.lengths), batch.HV, *(() if call.family == "gdn" else (batch.K,)))
        assert tuple(t["g"].shape) == g
        contiguous = [t[n].is_contiguous() for n in ("q", "k", "v")]
        assert not any(contiguous) if call.q_layout != "contiguous" else all(contiguous)
        if call.gate == "activated":
            beta = FP16 if call.beta == "prob_act" else torch.float32
            assert t["g"].dtype == torch.float32 and (t["g"] <= 0).all()
            assert t["beta"].dtype == beta


def test_a_missed_pool_write_is_caught():
    """The comparison fails when the call does not write its slots back (the check can fail):
    vLLM's prefill with the scatter dropped."""
    name, batch = "vllm.prefill", dict((n, b) for n, _, b in CASES)["vllm.prefill"]
    call = ec.CALLS[name]
    t = ec.make_tensors(call, batch, dtype=FP16)
    _, want_pool = ec.expected(call, batch, t)
    got = ec.clone(t)
    with torch.no_grad():
        shim.chunk_kda(q=got["q"], k=got["k"], v=got["v"], g=got["g"], beta=got["beta"],
                             initial_state=got["pool"][got["slots"]].contiguous(),
                             output_final_state=True, use_qk_l2norm_in_kernel=True,
                             cu_seqlens=got["cu_seqlens"])  # fmt: skip
    written = got["slots"].long().numpy()
    with pytest.raises(AssertionError):
        assert_close(got["pool"][written], (want_pool[written],), TOL[FP16], "slots")
