"""vLLM's and SGLang's KDA and GDN call sites (``tests/engine_calls.py``) replayed unchanged on
``kreg.compat.fla`` on a GPU, bf16 activations at Kimi-Linear's and Qwen3-Next's head dim
(K = V = 128): against the float64 oracle, and against fla-core itself (``fla.ops.kda``,
``fla.ops.gated_delta_rule``, the engines' pool keywords served by gather / scatter around it:
``engine_calls.pooled_ops``), outputs and written slots within bf16 tolerance, the pool's other
slots untouched. One short run:

    FLA_DISABLE_BACKEND_DISPATCH=1 python -m pytest tests/test_engine_replay_gpu.py -q
"""

from __future__ import annotations

import engine_calls as ec
import pytest

pytestmark = pytest.mark.gpu

TOL = 1e-2  # relative RMS, bf16 inputs and outputs
CASES = ec.batches(K=128, H=2, HV=4, prefill=(100, 1, 300), decode=6)


def _params(pool_dtypes=("float32",)) -> list:
    out = []
    for name, batch_id, batch in CASES:
        gap = ec.KNOWN_GAPS.get((name, batch_id))
        marks = [pytest.mark.xfail(raises=gap[0], strict=True, reason=gap[1])] if gap else []
        for pool in pool_dtypes:
            out.append(pytest.param(name, batch, pool, id=f"{name}-{batch_id}-{pool}",
                                    marks=marks))  # fmt: skip
    return out


def _fla_ops():
    try:
        from fla.ops import gated_delta_rule, kda
    except ImportError:
        return None

    def int64_offsets(fn):  # fla's varlen helpers are written for LongTensor offsets
        def call(*args, cu_seqlens=None, **kw):
            return fn(*args, cu_seqlens=None if cu_seqlens is None else cu_seqlens.long(), **kw)

        return call

    names = {kda: ("chunk_kda", "fused_recurrent_kda"),
             gated_delta_rule: ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")}  # fmt: skip
    return ec.pooled_ops(**{name: int64_offsets(getattr(module, name))
                            for module, functions in names.items() for name in functions})  # fmt: skip


def _run(ops, call, t):
    import torch

    got = ec.clone(t)
    with torch.inference_mode():
        o = call.step(ops, got)
    return o, got["pool"]


def _slots(t, batch):
    import numpy as np

    slots = t["slots"][: len(batch.lengths)].long().cpu()
    written = slots[slots >= 0]
    untouched = np.setdiff1d(np.arange(batch.pool_size), written.numpy())
    return written, untouched


@pytest.mark.parametrize(("name", "batch", "pool"), _params(("float32", "bfloat16")))
def test_shim_matches_the_oracle(name, batch, pool):
    import torch

    from kreg.families.kda.oracles import relative_rms

    call = ec.CALLS[name]
    t = ec.make_tensors(call, batch, dtype=torch.bfloat16, pool_dtype=getattr(torch, pool),
                        device="cuda")  # fmt: skip
    want_o, want_pool = ec.expected(call, batch, t)
    o, after = _run(call.shim(), call, t)
    written, untouched = _slots(t, batch)
    assert o.dtype == torch.bfloat16 and o.shape == t["v"].shape
    errs = (relative_rms(o.float().cpu(), want_o),
            relative_rms(after[written].float().cpu(), want_pool[written.numpy()]))  # fmt: skip
    assert max(errs) < TOL, errs
    assert torch.equal(after[untouched], t["pool"][untouched])


@pytest.mark.parametrize(("name", "batch", "pool"), _params())
def test_shim_agrees_with_fla(name, batch, pool):
    import torch

    from kreg.families.kda.oracles import relative_rms

    call = ec.CALLS[name]
    if call.library != "fla":
        pytest.skip(f"{name} is written against {call.library}'s own signature, which fla has "
                    "not: test_shim_matches_the_oracle covers it")  # fmt: skip
    fla = _fla_ops()
    if fla is None:
        pytest.skip("fla-core not importable")
    t = ec.make_tensors(call, batch, dtype=torch.bfloat16, device="cuda")
    o, after = _run(call.shim(), call, t)  # first: a known gap raises here, before fla runs
    fo, fla_after = _run(fla, call, t)
    written, untouched = _slots(t, batch)
    errs = (relative_rms(o.float().cpu(), fo.float().cpu()),
            relative_rms(after[written].float().cpu(), fla_after[written].float().cpu()))  # fmt: skip
    assert max(errs) < TOL, errs
    assert torch.equal(after[untouched], fla_after[untouched])
