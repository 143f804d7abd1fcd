"""KDA token-serial recurrence (Triton): the decode kernel, one token after another.

One program per (sequence, value head, V block) holds its [K, BV] block of the fp32 state in
registers and walks the sequence's tokens, exactly the recurrence of docs/kda/ALGORITHM.md §1::

    S <- diag(exp(g_t)) S                 decay first (exp(-inf) = 0: a hard reset, exact)
    S <- S + beta_t k_t (v_t - S^T k_t)^T delta-rule write on the decayed state
    o_t = S^T (scale q_t)                 read after the update

Every decay is exp(g_t) of one token, never a product of partial sums, so any gate g <= 0 is
exact without anchoring. Gate activation, L2 norm and beta sigmoid are the prefill's, through the
same helpers (``kernels._gates``). Containment is the prefill's promise: a non-finite k, v (any
column of the head, not only this block's), g other than -inf, or beta at token t turns the
state NaN from t on (so outputs from t on are NaN, earlier ones untouched); q reaches its row.

With ``POOL`` the states live in a pool [P, HV, K, V] (or [P, HV, V, K]); sequence n reads slot
``state_idx[n]`` and writes its final state back there, through the same index (no gather or
scatter copies). A negative slot means no initial state (zeros) and no write-back, the padding
convention of SGLang's decode kernels; a slot >= P (never read or written) makes the sequence's
outputs NaN, so an index the host could not check is never a silent out-of-bounds access.
"""

import triton
import triton.language as tl

from kreg.registry.interpreter import interpreting, patch_interpreter

from .kernels import _gates, _state_ptrs

if interpreting():
    patch_interpreter()


@triton.jit
def _finite0(x):
    """0.0 where every element of the 1-d ``x`` is finite, NaN otherwise."""
    return tl.sum(x * 0.0, axis=0)


# T (the packed token count changes every decode step) and P (the pool size) are not specialised:
# one compiled kernel serves every step, and the AOT build is it whatever values a build assumes.
@triton.jit(do_not_specialize=["T", "P"])
def kda_recurrent_kernel(
    q, k, v, g, beta, alog, dtb,
    o, h0, ht, state_idx, cu_seqlens,
    T, H, HV, P, scale, lower_bound,
    K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    GATE_ACT: tl.constexpr, QK_L2: tl.constexpr, BETA_SIG: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, POOL: tl.constexpr,
    STATE_VK: tl.constexpr, VARLEN: tl.constexpr, SCALAR_GATE: tl.constexpr = False,
):  # fmt: skip
    """Grid (N * HV * (V // BV),): one axis, the V block fastest, so the programs resident at
    once read and write whole states (contiguous K*V runs of memory) rather than one V slice of
    many states; an axis of its own for the V blocks ran the 2 GiB state traffic of 512 sequences
    x 64 heads at 2.1 TB/s against fla's 3.4 (H200)."""
    pid = tl.program_id(0)
    pid_s = pid // (V // BV)
    pid_v = pid % (V // BV)
    seq = pid_s // HV
    hv = pid_s % HV
    h = hv // (HV // H)
    v0 = pid_v * BV
    if VARLEN:  # int64 token indices: packed batches may pass 2^31 elements
        # the caller's offsets (any int dtype), clamped here rather than by a cleaning launch:
        # bos and eos in [0, T], eos >= bos, so no offsets read or write out of bounds
        bos = tl.minimum(tl.maximum(tl.load(cu_seqlens + seq).to(tl.int64), 0), T)
        eos = tl.minimum(tl.maximum(tl.load(cu_seqlens + seq + 1).to(tl.int64), bos), T)
    else:
        bos = seq.to(tl.int64) * T
        eos = bos + T

    s = tl.zeros((K, BV), dtype=tl.float32)
    if POOL:
        idx = tl.load(state_idx + seq).to(tl.int64)
        keep = (idx >= 0) & (idx < P)  # read the slot and write it back
        slot = tl.where(keep, idx, 0) * HV + hv
        s += tl.where(idx >= P, float("nan"), 0.0)  # unchecked bad slot: NaN, never an access
        s += tl.load(_state_ptrs(h0, slot, K, V, BV, v0, STATE_VK), mask=keep,
                     other=0.0).to(tl.float32)  # fmt: skip
    elif USE_H0:
        s += tl.load(_state_ptrs(h0, pid_s, K, V, BV, v0, STATE_VK)).to(tl.float32)

    kk = tl.arange(0, K)
    vcols = v0 + tl.arange(0, BV)
    for t in tl.range(bos, eos):
        qk_row = (t * H + h) * K
        v_row = (t * HV + hv) * V
        k_t = tl.load(k + qk_row + kk).to(tl.float32)
        q_t = tl.load(q + qk_row + kk).to(tl.float32)
        v_t = tl.load(v + v_row + vcols).to(tl.float32)
        b_t = tl.load(beta + t * HV + hv).to(tl.float32)
        # [1, K] through the prefill's gate helper (one row), then [K] ([1]: a scalar gate)
        g_t = tl.sum(_gates(g, alog, dtb, t, 1, hv, HV, lower_bound, K, 1, GATE_ACT,
                            SCALAR_GATE=SCALAR_GATE), axis=0)  # fmt: skip
        if QK_L2:
            k_t = k_t * tl.rsqrt(tl.sum(k_t * k_t) + 1e-6)
            q_t = q_t * tl.rsqrt(tl.sum(q_t * q_t) + 1e-6)
        if BETA_SIG:
            b_t = tl.sigmoid(b_t)
        # containment: a non-finite k, g (-inf is a valid reset), beta or v at this token makes
        # every entry of k_t NaN, and the S^T k reduction below carries that to every column,
        # so the state is NaN from here on; only v (the whole row: a NaN in another block
        # poisons this one too) needs a reduction of its own
        poison = (k_t + tl.where(g_t == float("-inf"), 0.0, g_t) + b_t) * 0.0
        if BV < V:
            poison += _finite0(tl.load(v + v_row + tl.arange(0, V)).to(tl.float32))
        else:
            poison += _finite0(v_t)
        k_t += poison
        s = s * tl.exp(g_t)[:, None]
        err = v_t - tl.sum(s * k_t[:, None], axis=0)  # v_t - S^T k_t  [BV]
        s = s + (b_t * k_t)[:, None] * err[None, :]
        out = tl.sum(s * (q_t * scale)[:, None], axis=0)
        tl.store(o + v_row + vcols, out.to(o.dtype.element_ty))
    if POOL:  # in place, through the same index
        tl.store(_state_ptrs(h0, slot, K, V, BV, v0, STATE_VK), s.to(h0.dtype.element_ty),
                 mask=keep)  # fmt: skip
    elif STORE_HT:
        tl.store(_state_ptrs(ht, pid_s, K, V, BV, v0, STATE_VK), s)
