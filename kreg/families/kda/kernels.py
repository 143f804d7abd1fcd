"""KDA chunkwise prefill kernels (Triton): prep (tiles), scan (recurrence) and fused (both).

The chunk body factors into state-independent tiles, computed by ``_chunk_tiles``, and a serial
state recurrence, one step of which is ``_scan_step``. The split path runs the first in
``kda_chunk_prep_kernel`` (one program per chunk x value head) and the second in
``kda_chunk_scan_kernel`` (one program per sequence x value head x V block); the fused path runs
both in ``kda_chunk_fused_kernel``. Both paths call the same two functions, and the tiles cross
memory in the same dtype the fused path rounds them to, so the paths agree bit for bit.

Exponentials are base 2 on log2-scaled gate sums. docs/kda/ALGORITHM.md derives the anchoring:
a chunk is split into sub-blocks of ``BS`` rows; across sub-blocks every factor has a
non-positive exponent, anchored at the sub-block boundary. Inside a sub-block the "block" anchor
pairs exp(Gin_i) with exp(-Gin_j) in two dots (bounded gates only, a spec rule); the "safe"
anchor (the default, any gate in [-inf, 0]) does the same for every row whose span fits fp32
and, for a row past it, forms each factor exp(G_i - G_j) pair by pair from sums local to the
sub-block (computed only in a chunk that has such a row).
A scalar gate (GDN, ``SCALAR_GATE``) needs no anchor: ``_scalar_tiles`` forms a pair's one
decay factor over the whole chunk from a masked product of direct gate sums.
Every exponent is built from the gates up to its row only, so no output depends on a later
input, bit for bit, and a non-finite input cuts its chunk there instead of reaching earlier rows.
"""

import triton
import triton.language as tl

from kreg.registry.interpreter import interpreting, patch_interpreter

from .specs import MAX_ANCHOR_NATS

if interpreting():
    patch_interpreter()

LOG2E = tl.constexpr(1.4426950408889634)

# gate activations (constexpr GATE_ACT)
GATE_NONE = 0
GATE_SIGMOID_BOUND = 1
GATE_SOFTPLUS = 2
GATE_ACT = {"none": GATE_NONE, "sigmoid_bound": GATE_SIGMOID_BOUND, "softplus": GATE_SOFTPLUS}

# diagonal sub-block anchoring (constexpr ANCHOR; specs name them "block" and "safe")
ANCHOR_BLOCK = tl.constexpr(0)
ANCHOR_SAFE = tl.constexpr(1)
ANCHORS = {"block": 0, "safe": 1}
# The block anchor's widest exponent in log2 units (MAX_ANCHOR_NATS of the numeric rule):
# exp2 of it and of its negative stay normal fp32, so no factor overflows or flushes.
MAX_SPAN_LOG2 = tl.constexpr(MAX_ANCHOR_NATS * 1.4426950408889634)
# exp2 below -126 leaves fp32's normal range: a gate under -FLUSH_LOG2 decays every product
# spanning it to (flushed) zero, so the pairwise diagonal may clamp it there.
FLUSH_LOG2 = tl.constexpr(127.0)


@triton.constexpr_function
def PAIR_CHANNELS(K):
    """Channels per slice of the pairwise diagonal: K halved while even and above 16 (the
    tree's [b, KS] tiles then fit one warp's registers at b = 16; 32 measured the same at
    T8192 and 15% slower at T2048 on an H100)."""
    while K > 16 and K % 2 == 0:
        K //= 2
    return K


@triton.constexpr_function
def CALLER_DIM(CALLER, D):
    """The head dim of the caller's tensors: the kernel's D, or with masked tiles (CALLER > 0)
    the caller's smaller CALLER, read and written through column masks while the kernel's
    tiles stay D wide (docs/kda/GATES.md, head dims)."""
    return D if CALLER == 0 else CALLER


@triton.jit
def _rows(ptr, row0, nrows, row_stride, COLS: tl.constexpr, ROWS: tl.constexpr,
          RAW: tl.constexpr = False, NCOLS: tl.constexpr = 0, col0=0):  # fmt: skip
    """Load a [ROWS, COLS] tile of consecutive token rows, zero past ``nrows`` and, with
    ``NCOLS`` (masked tiles: the caller's head dim), past column NCOLS of the row (``ptr``
    at column ``col0``); in fp32, or with ``RAW`` in the input's own dtype (a tensor-core
    operand as loaded)."""
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    offs = (row0 + r).to(tl.int64)[:, None] * row_stride + c[None, :]
    if NCOLS > 0:
        x = tl.load(ptr + offs, mask=(r < nrows)[:, None] & (col0 + c < NCOLS)[None, :],
                    other=0.0)  # fmt: skip
    else:
        x = tl.load(ptr + offs, mask=(r < nrows)[:, None], other=0.0)
    return x if RAW else x.to(tl.float32)


@triton.jit
def _block_row(x3, blk3, i):
    """Sub-block ``i`` of a [NB, BS, N] tile, as [BS, N] (a select, not a shared-memory slice)."""
    return tl.sum(tl.where(blk3 == i, x3, 0.0), axis=0)


@triton.jit
def _seg_cumsum(x, R: tl.constexpr, N: tl.constexpr, S: tl.constexpr):
    """Inclusive cumsum of the [R, N] rows ``x`` within consecutive segments of S rows. Each
    value is a direct sum of its own terms, never a difference of two larger sums."""
    if S == 1:
        return x
    if N == 1:  # a scalar gate's [R, 1] column scans as [R // S, S] (Triton 3.6's scan
        # lowering asserts on a 3-d scan whose last dim is 1)
        return tl.reshape(tl.cumsum(tl.reshape(x, (R // S, S)), axis=1), (R, 1))
    return tl.reshape(tl.cumsum(tl.reshape(x, (R // S, S, N)), axis=1), (R, N))


@triton.jit
def _gates(g_ptr, alog_ptr, dtb_ptr, row0, nrows, hv, HV, lower_bound,
           K: tl.constexpr, C: tl.constexpr, GATE_ACT: tl.constexpr,
           col0=0, COLS: tl.constexpr = None, SCALAR_GATE: tl.constexpr = False,
           KI: tl.constexpr = 0):  # fmt: skip
    """[C, COLS] log-decays (natural log) of the token rows from ``row0``, channels from
    ``col0`` (all K by default), activated; 0 past ``nrows``. With ``SCALAR_GATE`` the gate is
    one value per token and value head (g [.., HV], A_log and dt_bias [HV]): a [C, 1] tile.
    With ``KI`` (masked tiles) g and dt_bias have the caller's KI channels, and a channel past
    them reads g = 0 and dt_bias = -inf, whose activated gate is -0.0: the padded path's
    values, bit for bit (api._pad_inputs)."""
    NC: tl.constexpr = K if COLS is None else COLS
    KD: tl.constexpr = CALLER_DIM(KI, K)
    if SCALAR_GATE:
        r = tl.arange(0, C)
        g = tl.load(g_ptr + (row0 + r).to(tl.int64) * HV + hv, mask=r < nrows, other=0.0)
        g = g.to(tl.float32)[:, None]
    else:
        g = _rows(g_ptr + hv * KD + col0, row0, nrows, HV * KD, NC, C, NCOLS=KI, col0=col0)
    if GATE_ACT != 0:
        a = tl.exp(tl.load(alog_ptr + hv))
        if SCALAR_GATE:
            x = g + tl.load(dtb_ptr + hv)
        else:
            if KI > 0:
                ch = col0 + tl.arange(0, NC)
                x = g + tl.load(dtb_ptr + hv * KD + ch, mask=ch < KI, other=float("-inf"))[None, :]
            else:
                x = g + tl.load(dtb_ptr + hv * K + col0 + tl.arange(0, NC))[None, :]
        if GATE_ACT == 1:
            g = lower_bound * tl.sigmoid(a * x)
        else:
            # -a * softplus(x), softplus stable for large |x|; x = +inf gives a hard reset
            g = -a * (tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))
        g = tl.where((tl.arange(0, C) < nrows)[:, None], g, 0.0)
    return g


@triton.jit
def _nan_rows(x):
    """[R] 0 where row ``x[r]`` is finite, NaN where it holds a NaN or an infinity."""
    return tl.sum(x * 0.0, axis=1)


@triton.jit
def _pair_diag(
    q_ptr, k_ptr, g_ptr, alog_ptr, dtb_ptr, tok0, n, h, hv, H, HV, lower_bound, k_inv, q_inv,
    K: tl.constexpr, C: tl.constexpr, BS: tl.constexpr, GATE_ACT: tl.constexpr,
    FP32_DOT: tl.constexpr, KI: tl.constexpr = 0,
):  # fmt: skip
    """The diagonal sub-blocks of A and Aqk ([NB, BS, BS], every entry j <= i), exact for any
    gate, by halving: level s (BS/2, ..., 1) takes every pair whose j lies in the first and i
    in the second half of an aligned group of 2s rows, anchored at the second half's first row
    a: exp(G_i - G_j) = exp(sum of gates a..i) * exp(sum of gates j+1..a-1). Both are sums
    local to the group (never a difference of two large cumsums) and both factors are at most
    1 whatever the gates, so each level is one product of row-scaled tiles, not a factor per
    pair. A gate below -FLUSH_LOG2 is clamped there first: any factor spanning it is below
    fp32's normal range either way, and the clamp bounds the local sums (and their rounding);
    -inf resets need no case of their own. Every entry is built from the gates up to its row
    only: causal by construction. Channels are taken KS at a time (rows scaled by ``k_inv`` /
    ``q_inv``; zero past ``n``), with masked tiles (``KI``) only up to the caller's KI: a
    slice of padded channels adds exact zeros."""
    NB: tl.constexpr = C // BS
    KS: tl.constexpr = PAIR_CHANNELS(K)
    ri = tl.arange(0, BS)[None, :, None]
    ci = tl.arange(0, BS)[None, None, :]
    a = tl.zeros((NB, BS, BS), dtype=tl.float32)
    qk = tl.zeros((NB, BS, BS), dtype=tl.float32)
    KD: tl.constexpr = CALLER_DIM(KI, K)
    for c0 in tl.range(0, KD, KS):
        ks = _rows(k_ptr + h * KD + c0, tok0, n, H * KD, KS, C, NCOLS=KI, col0=c0) * k_inv
        qs = _rows(q_ptr + h * KD + c0, tok0, n, H * KD, KS, C, NCOLS=KI, col0=c0) * q_inv
        gs = _gates(g_ptr, alog_ptr, dtb_ptr, tok0, n, hv, HV, lower_bound, K, C, GATE_ACT,
                    c0, KS, KI=KI)  # fmt: skip
        gs = tl.maximum(gs * LOG2E, -FLUSH_LOG2)
        k3 = tl.reshape(ks, (NB, BS, KS))
        q3 = tl.reshape(qs, (NB, BS, KS))
        qk = tl.where(ri == ci, qk + tl.sum(q3 * k3, axis=2)[:, :, None], qk)  # exp(0)
        for lvl in tl.static_range(BS.bit_length() - 1):
            a, qk = _pair_level(k3, q3, gs, a, qk, BS >> (lvl + 1), C, BS, KS, FP32_DOT)
    return a, qk


@triton.jit
def _pair_level(k3, q3, gs, a, qk, S: tl.constexpr, C: tl.constexpr, BS: tl.constexpr,
                KS: tl.constexpr, FP32_DOT: tl.constexpr):  # fmt: skip
    """One level of ``_pair_diag``: the pairs across the halves (S rows each) of every aligned
    group of 2S rows, added to ``a`` and ``qk``."""
    NB: tl.constexpr = C // BS
    ri = tl.arange(0, BS)[None, :, None]
    ci = tl.arange(0, BS)[None, None, :]
    # exp(sum a..i): inclusive from the start of i's half; exp(sum j+1..a-1): to the end of j's
    pre = tl.reshape(_seg_cumsum(gs, C, KS, S), (C // S, S, KS))
    tot = tl.sum(tl.reshape(gs, (C // S, S, KS)), axis=1)[:, None, :]
    rows_f = tl.exp2(tl.reshape(pre, (NB, BS, KS)))
    cols_f = tl.exp2(tl.reshape(tot - pre, (NB, BS, KS)))
    kct = tl.permute(k3 * cols_f, (0, 2, 1))
    G: tl.constexpr = 2 * S
    across = ((ri // G) == (ci // G)) & ((ri % G) >= S) & ((ci % G) < S)
    a = tl.where(across, a + tl.dot(k3 * rows_f, kct, input_precision=FP32_DOT), a)
    qk = tl.where(across, qk + tl.dot(q3 * rows_f, kct, input_precision=FP32_DOT), qk)
    return a, qk


@triton.jit
def _chunk_tiles(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, pa_t, pqk_t, c,
    tok0, n, h, hv, H, HV, scale, lower_bound,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BS: tl.constexpr,
    GATE_ACT: tl.constexpr, QK_L2: tl.constexpr, BETA_SIG: tl.constexpr,
    FP32_DOT: tl.constexpr, ANCHOR: tl.constexpr = ANCHOR_SAFE,
    SCALAR_GATE: tl.constexpr = False, gq_t=None, aqk_t=None, gkt_t=None,
    STORE: tl.constexpr = False, KI: tl.constexpr = 0, VI: tl.constexpr = 0,
):  # fmt: skip
    """The six state-independent tiles of one chunk, for one value head: (w, u, gq, aqk, gkt,
    dec) in fp32, w = -T diag(beta) (K*Gamma) (negated so the scan subtracts into its
    accumulator), u = T diag(beta) V, gq = scale Q*Gamma, aqk (causal, scaled), gkt =
    (K * exp(G_C - G))^T laid out [K, C] so the scan needs no transpose, dec = exp(G_C).
    A per-channel gate's from ``_channel_tiles``, a scalar gate's (GDN) from ``_scalar_tiles``;
    both solve T = (I + diag(beta) A)^-1 in ``_solve_wu``. A scalar gate's gq and gkt are row
    scalings of q and k: in their places come the two [C] row scales (the scan applies them to
    the products of q and k as loaded, ``_scan_step``), and dec is one number. With ``STORE``
    (the split prep) gq, aqk and gkt (or the scales) go to ``gq_t``, ``aqk_t``, ``gkt_t`` as
    soon as each is final, before the solve, so that their registers are free for it (held to
    the end they spilled)."""
    if SCALAR_GATE:
        a_diag, n3, beta, kg, ok, gq, aqk, gkt, dec = _scalar_tiles(
            q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, tok0, n, h, hv, H, HV,
            scale, lower_bound, gq_t, aqk_t, gkt_t, c, K, V, C, BS, GATE_ACT, QK_L2, BETA_SIG,
            FP32_DOT, ANCHOR, STORE,
        )  # fmt: skip
        v = tl.where(ok, _rows(v_ptr + hv * V, tok0, n, HV * V, V, C), 0.0)
        w, u = _solve_wu(a_diag, n3, beta, kg, v, C, BS, FP32_DOT)
    else:
        w, u, gq, aqk, gkt, dec = _channel_tiles(
            q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, pa_t, pqk_t, c, tok0, n,
            h, hv, H, HV, scale, lower_bound, K, V, C, BS, GATE_ACT, QK_L2, BETA_SIG, FP32_DOT,
            ANCHOR, gq_t, aqk_t, gkt_t, STORE, KI, VI,
        )  # fmt: skip
    return w, u, gq, aqk, gkt, dec


@triton.jit
def _channel_tiles(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, pa_t, pqk_t, c,
    tok0, n, h, hv, H, HV, scale, lower_bound,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BS: tl.constexpr,
    GATE_ACT: tl.constexpr, QK_L2: tl.constexpr, BETA_SIG: tl.constexpr,
    FP32_DOT: tl.constexpr, ANCHOR: tl.constexpr, gq_t, aqk_t, gkt_t, STORE: tl.constexpr,
    KI: tl.constexpr = 0, VI: tl.constexpr = 0,
):  # fmt: skip
    """``_chunk_tiles`` for a per-channel gate (KDA); with masked tiles (``KI``, ``VI``) it
    reads the caller's head dims into tiles as wide as the padded path's, with the same
    values (zeros, and gates of -0.0, past them). With ``STORE`` gq and gkT go out before
    the off-diagonal products (held to the end they spilled 132 B per thread on sm90 at
    K = 128 with softplus gates; none stored early), Aqk before the solve.

    Every decay factor exp(G_i - G_j) is formed from sums of the gates between j and i: direct
    prefix and suffix sums from a sub-block boundary, never the difference of two large sums.
    Off-diagonal sub-blocks use the sub-block boundary as anchor (non-positive exponents on
    both sides). The diagonal sub-blocks come, with ``ANCHOR_SAFE``, from the pairs kernel
    (``kda_chunk_pairs_kernel``: pair by pair, exact for any gate, at a cost that does not
    depend on the gates) at ``pa_t`` / ``pqk_t`` for chunk ``c``; with ``ANCHOR_BLOCK`` (a
    promised bound) from one product pairing exp(Gin_i) with exp(-Gin_j), exact while Gin_i
    from its sub-block's start stays within MAX_SPAN_LOG2, a row past it poisoned: never
    silently wrong.

    Containment: the first row ``f`` whose k, v, g or beta is not finite (or, with
    ``ANCHOR_BLOCK``, whose span leaves the bound) is where the chunk is cut: later rows enter
    no product (so no 0 * inf reaches an earlier row; their pair entries are dropped by a
    select), their outputs are NaN through ``gq`` and
    the state is NaN through ``dec``. q only reaches its own row's output.
    """
    NB: tl.constexpr = C // BS
    GK: tl.constexpr = K
    KD: tl.constexpr = CALLER_DIM(KI, K)
    VD: tl.constexpr = CALLER_DIM(VI, V)
    rows = tl.arange(0, C)

    # --- one load of each input, activations fused -------------------------------------------
    k = _rows(k_ptr + h * KD, tok0, n, H * KD, K, C, NCOLS=KI)
    q = _rows(q_ptr + h * KD, tok0, n, H * KD, K, C, NCOLS=KI)
    gl = (
        _gates(
            g_ptr,
            alog_ptr,
            dtb_ptr,
            tok0,
            n,
            hv,
            HV,
            lower_bound,
            K,
            C,
            GATE_ACT,
            KI=KI,
        )
        * LOG2E
    )
    beta = tl.load(beta_ptr + (tok0 + rows).to(tl.int64) * HV + hv, mask=rows < n, other=0.0)
    beta = beta.to(tl.float32)
    k_inv = tl.full((C, 1), 1.0, dtype=tl.float32)  # row scales (the L2 norm's)
    q_inv = tl.full((C, 1), 1.0, dtype=tl.float32)
    if QK_L2:
        k_inv = tl.rsqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
        q_inv = tl.rsqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None]
        k = k * k_inv
        q = q * q_inv
    if BETA_SIG:
        beta = tl.where(rows < n, tl.sigmoid(beta), 0.0)

    # --- containment: the first row the chunk cannot take ------------------------------------
    resets = tl.where(gl == float("-inf"), 0.0, gl)  # a -inf gate is a valid hard reset
    # v is read here for its non-finite rows and again at its one product (fewer live registers)
    v_bad = _nan_rows(_rows(v_ptr + hv * VD, tok0, n, HV * VD, V, C, NCOLS=VI))
    bad = (_nan_rows(k + resets) + v_bad + beta * 0.0) != 0.0  # NaN != 0
    f = tl.min(tl.where(bad, rows, C))
    gl = tl.where((rows < f)[:, None], gl, 0.0)
    gin = _seg_cumsum(gl, C, GK, BS)  # from the sub-block's start, inclusive
    if ANCHOR == ANCHOR_BLOCK:  # cut at the first row past the span (exact up to it)
        fits = tl.min(gin, axis=1) >= -MAX_SPAN_LOG2
        f = tl.minimum(f, tl.min(tl.where(fits, C, rows)))
        gin = tl.where((rows < f)[:, None], gin, 0.0)
        gl = tl.where((rows < f)[:, None], gl, 0.0)
    ok = (rows < f)[:, None]
    k = tl.where(ok, k, 0.0)
    beta = tl.where(rows < f, beta, 0.0)

    # --- direct sums: sub-block prefixes and suffixes, sub-block totals ----------------------
    tot = tl.sum(tl.reshape(gl, (NB, BS, GK)), axis=1)  # [NB, GK]
    blk = tl.arange(0, NB)
    blk3 = blk[:, None, None]
    # P_I (sum of the totals before sub-block I) and the sum after sub-block J, summed block by
    # block in order: exact sums of their own terms only
    before = tl.zeros((NB, GK), dtype=tl.float32)
    after = tl.zeros((NB, GK), dtype=tl.float32)
    for i in tl.static_range(1, NB):
        tot_prev = tl.sum(tl.where(blk[:, None] == i - 1, tot, 0.0), axis=0)
        before = tl.where(blk[:, None] >= i, before + tot_prev[None, :], before)
        tot_next = tl.sum(tl.where(blk[:, None] == NB - i, tot, 0.0), axis=0)
        after = tl.where(blk[:, None] < NB - i, after + tot_next[None, :], after)
    k3 = tl.reshape(k, (NB, BS, K))
    q3 = tl.reshape(q, (NB, BS, K))
    gin3 = tl.reshape(gin, (NB, BS, GK))

    # --- diagonal sub-blocks: pair by pair (safe), or the block anchor's two dots -----------
    e_in = tl.exp2(gin3)  # exp(G_i - P_I) <= 1
    kl3 = k3 * e_in
    ql3 = q3 * e_in
    if ANCHOR == ANCHOR_SAFE:
        # the pairs kernel's entries (every row; rows from the cut are dropped below)
        a_diag = tl.reshape(tl.load(_tile_ptrs(pa_t, c, hv, HV, C, BS)), (NB, BS, BS))
        qk_diag = tl.reshape(tl.load(_tile_ptrs(pqk_t, c, hv, HV, C, BS)), (NB, BS, BS))
        # K exp(P_next(J) - G_j) from the sub-block's total less the inclusive prefix at j, both
        # local sums of clamped gates (as the pairs take them), never of cumsums across chunks;
        # not tl.cumsum(reverse=True), which compiles to flips (shuffles)
        gc3 = tl.reshape(tl.maximum(gl, -FLUSH_LOG2), (NB, BS, GK))
        gsuf = tl.sum(gc3, axis=1)[:, None, :] - tl.cumsum(gc3, axis=1)
        kr3 = k3 * tl.exp2(tl.minimum(gsuf, 0.0))
    else:
        kd3t = tl.permute(k3 * tl.exp2(-gin3), (0, 2, 1))  # >= 1, finite: every row fits
        a_diag = tl.dot(kl3, kd3t, input_precision=FP32_DOT)  # [NB, BS, BS]
        qk_diag = tl.dot(ql3, kd3t, input_precision=FP32_DOT)
        # to the sub-block's end: the total less the prefix, within rounding of the direct sum
        # while the whole sub-block fits the span
        kr3 = k3 * tl.exp2(tot[:, None, :] - gin3)  # K exp(P_next(J) - G_j) <= 1
    ri = tl.arange(0, BS)[None, :, None]
    ci = tl.arange(0, BS)[None, None, :]
    e_before = tl.exp2(before)[:, None, :]  # exp(P_I)
    kg = tl.reshape(kl3 * e_before, (C, K))  # K * Gamma
    gq = tl.reshape(ql3 * e_before, (C, K)) * scale
    gk = tl.reshape(kr3 * tl.exp2(after)[:, None, :], (C, K))  # K exp(G_C - G_j)
    gq = tl.where(((rows >= f) & (rows < n))[:, None], float("nan"), gq)
    if STORE:
        _store_tile(gq_t, c, hv, HV, C, K, gq)
        _store_tile(gkt_t, c, hv, HV, K, C, tl.trans(gk))
    dec = tl.exp2(tl.sum(tot, axis=0))

    a_diag = tl.where((ri > ci) & (tl.reshape(rows < f, (NB, BS))[:, :, None]), a_diag, 0.0)
    # Aqk as row sub-blocks [NB, BS, C]; the diagonal sub-block goes to column block I.
    colblk = (tl.arange(0, C) // BS)[None, None, :]
    qk3 = tl.reshape(
        tl.broadcast_to(tl.where(ri >= ci, qk_diag, 0.0)[:, :, None, :], (NB, BS, NB, BS)),
        (NB, BS, C),
    )
    qk3 = tl.where(colblk == blk3, qk3, 0.0)
    n3 = tl.zeros((NB, BS, C), dtype=tl.float32)  # strictly block-lower part of A
    kr = tl.reshape(kr3, (C, K))
    # between[J] = sum of the sub-block totals strictly between J and I, summed as I grows
    between = tl.zeros((NB, GK), dtype=tl.float32)
    for i in tl.static_range(1, NB):
        # exp(P_I - P_next(J)) for J < I, 0 for J >= I: non-positive exponents only
        scale_j = tl.exp2(tl.where(blk[:, None] < i, between, float("-inf")))
        scale_rows = tl.reshape(tl.broadcast_to(scale_j[:, None, :], (NB, BS, GK)), (C, GK))
        krt = tl.trans(kr * scale_rows)  # [K, C]
        a_i = tl.dot(_block_row(kl3, blk3, i), krt, input_precision=FP32_DOT)  # [BS, C]
        qk_i = tl.dot(_block_row(ql3, blk3, i), krt, input_precision=FP32_DOT)
        n3 = tl.where(blk3 == i, a_i[None, :, :], n3)
        qk3 = tl.where(blk3 == i, qk3 + qk_i[None, :, :], qk3)
        tot_i = tl.sum(tl.where(blk[:, None] == i, tot, 0.0), axis=0)
        between = tl.where(blk[:, None] < i, between + tot_i[None, :], 0.0)
    aqk = tl.reshape(qk3, (C, C)) * scale
    if STORE:
        _store_tile(aqk_t, c, hv, HV, C, C, aqk)

    v = tl.where(ok, _rows(v_ptr + hv * VD, tok0, n, HV * VD, V, C, NCOLS=VI), 0.0)
    w, u = _solve_wu(a_diag, n3, beta, kg, v, C, BS, FP32_DOT)
    dec = tl.where(f < n, float("nan"), dec)
    return w, u, gq, aqk, tl.trans(gk), dec


@triton.jit
def _scalar_tiles(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, tok0, n, h, hv, H, HV, scale,
    lower_bound, gq_t, aqk_t, gkt_t, c,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BS: tl.constexpr,
    GATE_ACT: tl.constexpr, QK_L2: tl.constexpr, BETA_SIG: tl.constexpr,
    FP32_DOT: tl.constexpr, ANCHOR: tl.constexpr, STORE: tl.constexpr,
):  # fmt: skip
    """A scalar gate's (GDN) tiles of one chunk, but for the solve: (a_diag, n3, beta, kg, ok,
    q_scale, aqk, k_scale, dec), A split by sub-blocks as ``_solve_wu`` takes it, ``ok`` the
    rows before the cut, aqk and dec final, gq and gkt as the [C] row scales ``_scan_step``
    applies to the products of q and k, dec one number. ``STORE`` as ``_chunk_tiles`` (at
    chunk 64 the three tiles held to the end spilled 444 B).

    A pair's decay is one number, so A = (K K^T) * Gamma and Aqk = (Q K^T) * Gamma over the
    whole chunk, K K^T and Q K^T one tensor-core product each on k and q as loaded (exact
    products of bf16 or fp16 operands) with the L2 norm's row scales after the dot. Gamma[i, j]
    = exp2(sum of the gates j+1..i) comes from one masked product, upto [i, t] = [t <= i]
    times after [t, j] = g_t [t > j]: every entry a direct sum of its own terms (never the
    difference of two prefix sums, which keeps only the rounding of the large ones), exact for
    any gate, no anchor needed; gates clamped at -FLUSH_LOG2 there (0 * -inf is NaN; any sum
    past the clamp is below fp32's normal range either way). Row factors exp(G_i) and
    exp(G_C - G_j) are direct prefix and suffix sums. Containment as ``_channel_tiles``: the
    first row whose k, v, g or beta is not finite (with ``ANCHOR_BLOCK``, whose sub-block span
    leaves the promised bound: the anchor's contract, though exact here) cuts the chunk."""
    NB: tl.constexpr = C // BS
    rows = tl.arange(0, C)
    ti = rows[:, None]
    tj = rows[None, :]
    k = _rows(k_ptr + h * K, tok0, n, H * K, K, C, RAW=True)
    q = _rows(q_ptr + h * K, tok0, n, H * K, K, C, RAW=True)
    kf = k.to(tl.float32)
    qf = q.to(tl.float32)
    gl = _gates(g_ptr, alog_ptr, dtb_ptr, tok0, n, hv, HV, lower_bound, K, C, GATE_ACT,
                SCALAR_GATE=True) * LOG2E  # fmt: skip
    beta = tl.load(beta_ptr + (tok0 + rows).to(tl.int64) * HV + hv, mask=rows < n, other=0.0)
    beta = beta.to(tl.float32)
    if BETA_SIG:
        beta = tl.where(rows < n, tl.sigmoid(beta), 0.0)
    k_inv = tl.full((C, 1), 1.0, dtype=tl.float32)  # the L2 norm's row scales
    q_inv = tl.full((C, 1), 1.0, dtype=tl.float32)
    if QK_L2:
        k_inv = tl.rsqrt(tl.sum(kf * kf, axis=1) + 1e-6)[:, None]
        q_inv = tl.rsqrt(tl.sum(qf * qf, axis=1) + 1e-6)[:, None]

    # --- containment: the first row the chunk cannot take ------------------------------------
    resets = tl.where(gl == float("-inf"), 0.0, gl)  # a -inf gate is a valid hard reset
    v_bad = _nan_rows(_rows(v_ptr + hv * V, tok0, n, HV * V, V, C))
    bad = (_nan_rows(kf + resets) + v_bad + beta * 0.0) != 0.0  # NaN != 0
    f = tl.min(tl.where(bad, rows, C))
    gl = tl.where((rows < f)[:, None], gl, 0.0)
    if ANCHOR == ANCHOR_BLOCK:  # the block anchor's contract: cut at the first row past the span
        fits = tl.min(_seg_cumsum(gl, C, 1, BS), axis=1) >= -MAX_SPAN_LOG2
        f = tl.minimum(f, tl.min(tl.where(fits, C, rows)))
        gl = tl.where((rows < f)[:, None], gl, 0.0)
    ok = (rows < f)[:, None]
    beta = tl.where(rows < f, beta, 0.0)
    k_inv = tl.where(ok, k_inv, 0.0)  # a cut row enters no product (its k may be NaN)
    kn = tl.where(ok, kf * k_inv, 0.0)  # K, normalised; a cut row's NaN * 0 stays out

    # --- row factors from direct sums: the scan's row scales --------------------------------
    g_in = _seg_cumsum(gl, C, 1, C)  # [C, 1]: G_i from the chunk's start, inclusive
    g_out = tl.sum(tl.where(ti > tj, gl, 0.0), axis=0)  # [C]: G_C - G_j, a suffix sum
    e_in = tl.exp2(g_in)
    # rows from the cut on: NaN outputs (gq only multiplies from the left) and a NaN state
    q_scale = tl.where((rows >= f) & (rows < n), float("nan"),
                       tl.reshape(q_inv * e_in * scale, (C,)))  # fmt: skip
    k_scale = tl.where(rows < f, tl.reshape(k_inv, (C,)) * tl.exp2(g_out), 0.0)
    if STORE:
        _store_vec(gq_t, c, hv, HV, C, q_scale)
        _store_vec(gkt_t, c, hv, HV, C, k_scale)
    dec = tl.where(f < n, float("nan"), tl.exp2(tl.sum(gl)))  # the chunk's one decay

    # --- Gamma from one masked product; products on k and q as loaded, row scales after ------
    after = tl.where(ti > tj, tl.maximum(gl, -FLUSH_LOG2), 0.0)  # [t, j]: g_t for t > j
    if C < 64:  # the masked product: upto [i, t] = [t <= i] times after
        upto = tl.where(tj <= ti, 1.0, 0.0)
        span = tl.dot(upto, after, input_precision="ieee")
    else:  # a scan down the columns, the same sums: at chunk 64 the product's operands spilled
        span = tl.cumsum(after, axis=0)
    gam = tl.exp2(span)  # [i, j] = exp2(sum of the gates j+1..i), i >= j
    # (no overflow where the norms are finite: |k_i . k_j| <= |k_i| |k_j|, Cauchy-Schwarz)
    ks = tl.where(ok, k, tl.zeros_like(k))
    kst = tl.trans(ks)
    k_inv_t = tl.reshape(k_inv, (1, C))
    qk = tl.dot(q, kst, input_precision=FP32_DOT)
    aqk = tl.where(ti >= tj, qk * (q_inv * scale) * k_inv_t * gam, 0.0)
    if STORE:
        _store_tile(aqk_t, c, hv, HV, C, C, aqk)
    kk = tl.dot(ks, kst, input_precision=FP32_DOT)
    a = tl.where(ti > tj, kk * k_inv * k_inv_t * gam, 0.0)
    kg = kn * e_in  # K * Gamma

    # A by sub-blocks, as the blocked solve takes it
    a3 = tl.reshape(a, (NB, BS, C))
    blk3 = tl.arange(0, NB)[:, None, None]
    colblk = (tl.arange(0, C) // BS)[None, None, :]
    n3 = tl.where(colblk < blk3, a3, 0.0)
    a_diag = tl.sum(tl.reshape(tl.where(colblk == blk3, a3, 0.0), (NB, BS, NB, BS)), axis=2)
    return a_diag, n3, beta, kg, ok, q_scale, aqk, k_scale, dec


@triton.jit
def _solve_wu(a_diag, n3, beta, kg, v, C: tl.constexpr, BS: tl.constexpr,
              FP32_DOT: tl.constexpr):  # fmt: skip
    """(w, u) = (-T diag(beta) kg, T diag(beta) v), T = (I + diag(beta) A)^-1 solved by blocks
    of BS rows: ``a_diag`` A's diagonal sub-blocks [NB, BS, BS] (strictly lower), ``n3`` its
    strictly block-lower part as row sub-blocks [NB, BS, C]."""
    NB: tl.constexpr = C // BS
    LOG2_BS: tl.constexpr = BS.bit_length() - 1
    ri = tl.arange(0, BS)[None, :, None]
    ci = tl.arange(0, BS)[None, None, :]
    blk3 = tl.arange(0, NB)[:, None, None]
    colblk = (tl.arange(0, C) // BS)[None, None, :]
    beta3 = tl.reshape(beta, (NB, BS))[:, :, None]
    a_diag = a_diag * beta3
    n3 = n3 * beta3
    # Diagonal blocks, all sub-blocks at once, by doubling: L = diag(beta) A is strictly lower
    # (nilpotent, L^BS = 0), so (I + L)^-1 = (I - L)(I + L^2)(I + L^4)...(I + L^(BS/2)):
    # 2 log2(BS) - 2 batched products instead of BS - 1 dependent row updates (measured 24%
    # faster prep on the H200 at chunk 32). ieee products whatever FP32_DOT says: the powers of
    # L carry the whole inverse, and tf32's 10-bit mantissa would compound through them.
    eye = tl.where(ri == ci, 1.0, 0.0) + tl.zeros((NB, BS, BS), dtype=tl.float32)
    td = eye - a_diag
    lp = a_diag
    for _ in tl.static_range(1, LOG2_BS):
        lp = tl.dot(lp, lp, input_precision="ieee")
        td = tl.dot(td, lp, acc=td, input_precision="ieee")
    # T by block rows: T_I = Td_I (E_I - N_I T), E_I the identity rows of block I
    t3 = tl.reshape(
        tl.broadcast_to(td[:, :, None, :], (NB, BS, NB, BS)),
        (NB, BS, C),
    )
    t3 = tl.where(colblk == blk3, t3, 0.0)
    for i in tl.static_range(1, NB):
        t_full = tl.reshape(t3, (C, C))
        y = tl.dot(_block_row(n3, blk3, i), t_full, input_precision=FP32_DOT)  # [BS, C]
        td_i = _block_row(td, blk3, i)
        t_i = _block_row(t3, blk3, i) - tl.dot(td_i, y, input_precision=FP32_DOT)
        t3 = tl.where(blk3 == i, t_i[None, :, :], t3)
    t = tl.reshape(t3, (C, C))

    w = -tl.dot(t, kg * beta[:, None], input_precision=FP32_DOT)
    u = tl.dot(t, v * beta[:, None], input_precision=FP32_DOT)
    return w, u


@triton.jit
def _scan_step(s, w, u, gq, aqk, gkt, dec, q_scale, k_scale, SCALAR_GATE: tl.constexpr):
    """One chunk of the recurrence on a [K, BV] fp32 state; returns (next state, output [C, BV]).

    Operands arrive in the tile dtype; every product accumulates in fp32, with the residual and
    the output formed straight in the accumulator (no fp32 staging through memory). With a
    scalar gate gq and gkt are q and k^T as loaded and the [C] fp32 row scales apply to the
    products' rows: Q*Gamma S = diag(q_scale) (Q S), and (K*Gamma')^T V' = K^T (diag(k_scale) V')
    (a cut row's k may be NaN: its chunk's decay is NaN, so the state is NaN either way).
    """
    sd = s.to(w.dtype)
    v_new = tl.dot(w, sd, acc=u.to(tl.float32))  # U - W S  (w holds -W)
    if SCALAR_GATE:  # dec: the chunk's one decay
        o = tl.dot(aqk, v_new.to(w.dtype), acc=tl.dot(gq, sd) * q_scale[:, None])
        s = tl.dot(gkt, (v_new * k_scale[:, None]).to(w.dtype), acc=s * dec)
    else:
        o = tl.dot(aqk, v_new.to(w.dtype), acc=tl.dot(gq, sd))
        s = tl.dot(gkt, v_new.to(w.dtype), acc=s * dec[:, None])
    return s, o


@triton.jit
def _chunk_of(pid_c, T, chunk_seq, seq_chunk, cu_seqlens, C: tl.constexpr, VARLEN: tl.constexpr):
    """(first token, valid rows) of chunk ``pid_c`` on the flattened token axis.

    Varlen grids are sized for the most chunks the packed length allows (no host sync to count
    them); a chunk past the last one gets 0 valid rows.
    """
    if VARLEN:
        seq = tl.load(chunk_seq + pid_c)
        tok0 = tl.load(cu_seqlens + seq).to(tl.int32) + (pid_c - tl.load(seq_chunk + seq)) * C
        end = tl.load(cu_seqlens + seq + 1).to(tl.int32)
        return tok0, tl.minimum(end - tok0, C)
    else:
        nt = tl.cdiv(T, C)
        it = pid_c % nt
        return (pid_c // nt) * T + it * C, tl.minimum(C, T - it * C)


@triton.jit
def _tile_ptrs(
    base, cidx, hv, HV, R: tl.constexpr, S: tl.constexpr, col0=0, COLS: tl.constexpr = 0
):
    """Pointers to the [R, COLS or S] tile at column ``col0`` of (chunk, value head) in a
    chunk-major [NC, HV, R, S] buffer."""
    W: tl.constexpr = S if COLS == 0 else COLS
    off = (cidx * HV + hv).to(tl.int64) * (R * S)
    return base + off + tl.arange(0, R)[:, None] * S + col0 + tl.arange(0, W)[None, :]


@triton.jit
def _state_ptrs(base, idx, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, v0, STATE_VK,
                KI: tl.constexpr = 0, VI: tl.constexpr = 0):  # fmt: skip
    """Pointers to the [K, BV] block at ``v0`` of state ``idx`` in a [.., K, V] or [.., V, K]
    buffer; a caller's state with masked tiles is [.., KI, VI] (``_state_in``, ``_state_out``)."""
    KD: tl.constexpr = CALLER_DIM(KI, K)
    VD: tl.constexpr = CALLER_DIM(VI, V)
    kk = tl.arange(0, K)[:, None]
    vv = v0 + tl.arange(0, BV)[None, :]
    inner = vv * KD + kk if STATE_VK else kk * VD + vv
    return base + idx.to(tl.int64) * (KD * VD) + inner


@triton.jit
def _state_in(base, idx, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, v0, STATE_VK,
              KI: tl.constexpr, VI: tl.constexpr):  # fmt: skip
    """A caller's state block [K, BV] in fp32; with masked tiles zero past its KI rows and VI
    columns (the padded path's zero-padded state)."""
    if KI + VI > 0:
        s = tl.load(_state_ptrs(base, idx, K, V, BV, v0, STATE_VK, KI, VI),
                    mask=_state_fits(K, V, BV, v0, KI, VI), other=0.0)  # fmt: skip
    else:
        s = tl.load(_state_ptrs(base, idx, K, V, BV, v0, STATE_VK))
    return s.to(tl.float32)


@triton.jit
def _state_out(base, idx, s, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, v0, STATE_VK,
               KI: tl.constexpr, VI: tl.constexpr, mask=None):  # fmt: skip
    """Store a caller's state block in ``base``'s dtype (with masked tiles its KI x VI part),
    where ``mask``."""
    if KI + VI > 0:
        fits = _state_fits(K, V, BV, v0, KI, VI)
        if mask is not None:
            fits = fits & mask
        tl.store(_state_ptrs(base, idx, K, V, BV, v0, STATE_VK, KI, VI),
                 s.to(base.dtype.element_ty), mask=fits)  # fmt: skip
    else:
        tl.store(_state_ptrs(base, idx, K, V, BV, v0, STATE_VK), s.to(base.dtype.element_ty),
                 mask=mask)  # fmt: skip


@triton.jit
def _state_fits(K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, v0, KI: tl.constexpr,
                VI: tl.constexpr):  # fmt: skip
    """[K, BV]: the entries of the block at ``v0`` inside the caller's KI x VI state."""
    kk = tl.arange(0, K)[:, None]
    vv = v0 + tl.arange(0, BV)[None, :]
    return (kk < CALLER_DIM(KI, K)) & (vv < CALLER_DIM(VI, V))


@triton.jit
def _load_tiles(q, k, w_t, u_t, gq_t, aqk_t, gkt_t, dec_t, c, tok0, n, h, H, hv, HV, v0, load_u,
                K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr,
                SCALAR_GATE: tl.constexpr):  # fmt: skip
    """The stored tiles of chunk ``c`` (tokens ``tok0`` on, ``n`` of them) and the row scales;
    u is the V block at ``v0`` (zeros unless ``load_u``). With a scalar gate gq and gkt are
    q and k^T as the caller passed them, with the prep's [C] row scales (``_scan_step``); the
    scales are unused placeholders otherwise."""
    w = tl.load(_tile_ptrs(w_t, c, hv, HV, C, K))
    u = tl.load(_tile_ptrs(u_t, c, hv, HV, C, V, v0, BV), mask=load_u, other=0.0)
    aqk = tl.load(_tile_ptrs(aqk_t, c, hv, HV, C, C))
    if SCALAR_GATE:
        dec = tl.load(dec_t + (c * HV + hv).to(tl.int64))  # one decay per chunk
        gq, gkt = _raw_qk(q, k, tok0, n, h, H, K, C)
        q_scale = tl.load(_vec_ptrs(gq_t, c, hv, HV, C))
        k_scale = tl.load(_vec_ptrs(gkt_t, c, hv, HV, C))
    else:
        dec = tl.load(_vec_ptrs(dec_t, c, hv, HV, K))
        gq = tl.load(_tile_ptrs(gq_t, c, hv, HV, C, K))
        gkt = tl.load(_tile_ptrs(gkt_t, c, hv, HV, K, C))
        q_scale = 0.0
        k_scale = 0.0
    return w, u, gq, aqk, gkt, dec, q_scale, k_scale


@triton.jit
def _raw_qk(q_ptr, k_ptr, tok0, n, h, H, K: tl.constexpr, C: tl.constexpr):
    """A scalar gate's scan operands: the chunk's q [C, K] and k^T [K, C] as the caller passed
    them (exact tensor-core operands; the prep's row scales apply to the products' rows)."""
    q = _rows(q_ptr + h * K, tok0, n, H * K, K, C, RAW=True)
    k = _rows(k_ptr + h * K, tok0, n, H * K, K, C, RAW=True)
    return q, tl.trans(k)


@triton.jit
def _seq_chunks(seq, T, seq_chunk, cu_seqlens, C: tl.constexpr, VARLEN: tl.constexpr):
    """(first chunk, end chunk, first token, end token) of sequence ``seq``."""
    if VARLEN:
        c0 = tl.load(seq_chunk + seq)
        c1 = tl.load(seq_chunk + seq + 1)
        tok_start = tl.load(cu_seqlens + seq).to(tl.int32)
        tok_end = tl.load(cu_seqlens + seq + 1).to(tl.int32)
    else:
        nt = tl.cdiv(T, C)
        c0 = seq * nt
        c1 = c0 + nt
        tok_start = seq * T
        tok_end = tok_start + T
    return c0, c1, tok_start, tok_end


@triton.jit
def _recurrence(
    q, k, v, g, beta, alog, dtb, pa_t, pqk_t,
    w_t, u_t, gq_t, aqk_t, gkt_t, dec_t,
    o, h0, ht, hs, hs_seq,
    seq_chunk, cu_seqlens,
    T, H, HV, scale, lower_bound,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BS: tl.constexpr, BV: tl.constexpr,
    GATE_ACT: tl.constexpr, QK_L2: tl.constexpr, BETA_SIG: tl.constexpr,
    FP32_DOT: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
    STORE_HS: tl.constexpr, STATE_VK: tl.constexpr, VARLEN: tl.constexpr,
    FUSED: tl.constexpr, TILE_DT: tl.constexpr, SEG: tl.constexpr = 0, NSEG=1,
    ABLATE_SCAN: tl.constexpr = False, ANCHOR: tl.constexpr = ANCHOR_SAFE,
    HS_EVERY: tl.constexpr = 1, SCALAR_GATE: tl.constexpr = False,
    KI: tl.constexpr = 0, VI: tl.constexpr = 0,
):  # fmt: skip
    """The serial recurrence of one (sequence, value head, V block): tiles loaded (split) or
    computed on chip (fused, where BV == V), then the shared ``_scan_step``.

    With ``SEG`` > 0 the program runs one segment of SEG chunks (grid axis 2), starting from the
    state the combine kernel wrote to ``h0`` ([N, NSEG, HV, K, V] fp32).
    ``STORE_HS`` stores the state at the start of every ``HS_EVERY``-th chunk of the sequence,
    in ``hs``'s dtype; with varlen and ``HS_EVERY`` > 1, ``hs_seq`` [N + 1] holds each
    sequence's first row of ``hs``.
    """
    pid_v = tl.program_id(0)
    pid_s = tl.program_id(1)
    seq = pid_s // HV
    hv = pid_s % HV
    h = hv // (HV // H)
    v0 = pid_v * BV
    c0, c1, tok_start, tok_end = _seq_chunks(seq, T, seq_chunk, cu_seqlens, C, VARLEN)
    seq_c0 = c0  # the sequence's first chunk (c0 moves to the segment's with SEG)
    hs0 = c0  # the sequence's first chunk state
    if HS_EVERY > 1:
        if VARLEN:
            hs0 = tl.load(hs_seq + seq)
        else:
            hs0 = seq * tl.cdiv(c1 - c0, HS_EVERY)
    last = True
    if SEG > 0:  # this program's segment; its start state comes from the combine kernel
        seg = tl.program_id(2)
        # NSEG is planned from the longest sequence the host saw; a longer one (a captured
        # graph replayed on new offsets) runs its chunks past NSEG segments in the last one
        n_seg = tl.minimum(tl.cdiv(c1 - c0, SEG), NSEG)
        last = seg == tl.maximum(n_seg, 1) - 1  # an empty sequence: segment 0 keeps h0
        tok_start += seg * SEG * C
        c0 = c0 + seg * SEG
        c1 = tl.where(seg == NSEG - 1, c1, tl.minimum(c1, c0 + SEG))
        s = tl.load(_state_ptrs(h0, (seq * NSEG + seg) * HV + hv, K, V, BV, v0, False))
    elif USE_H0:
        s = _state_in(h0, pid_s, K, V, BV, v0, STATE_VK, KI, VI)
    else:
        s = tl.zeros((K, BV), dtype=tl.float32)
    rows = tl.arange(0, C)
    vcols = v0 + tl.arange(0, BV)
    for c in tl.range(c0, c1):
        if STORE_HS:
            if HS_EVERY == 1:
                _state_out(hs, c * HV + hv, s, K, V, BV, v0, STATE_VK, KI, VI)
            else:
                idx = hs0 + (c - seq_c0) // HS_EVERY
                _state_out(hs, idx * HV + hv, s, K, V, BV, v0, STATE_VK, KI, VI,
                           mask=(c - seq_c0) % HS_EVERY == 0)  # fmt: skip
        tok0 = tok_start + (c - c0) * C
        n = tl.minimum(tok_end - tok0, C)
        if FUSED:
            w, u, gq, aqk, gkt, dec = _chunk_tiles(
                q, k, v, g, beta, alog, dtb, pa_t, pqk_t, c, tok0, n, h, hv, H, HV, scale,
                lower_bound, K, V, C, BS, GATE_ACT, QK_L2, BETA_SIG, FP32_DOT, ANCHOR, SCALAR_GATE,
                KI=KI, VI=VI,
            )  # fmt: skip
            # the same rounding the split path's tiles get on their way through memory
            w = w.to(TILE_DT)
            u = u.to(TILE_DT)
            aqk = aqk.to(TILE_DT)
            if SCALAR_GATE:  # gq, gkt hold the fp32 row scales the split scan loads
                q_scale = gq
                k_scale = gkt
                gq, gkt = _raw_qk(q, k, tok0, n, h, H, K, C)
            else:
                gq = gq.to(TILE_DT)
                gkt = gkt.to(TILE_DT)
                q_scale = 0.0
                k_scale = 0.0
        else:
            w, u, gq, aqk, gkt, dec, q_scale, k_scale = _load_tiles(
                q, k, w_t, u_t, gq_t, aqk_t, gkt_t, dec_t, c, tok0, n, h, H, hv, HV, v0, True,
                K, V, C, BV, SCALAR_GATE,
            )  # fmt: skip
        if ABLATE_SCAN:  # case-study probe: the tile phase alone, every tile still consumed
            fold = tl.sum(w.to(tl.float32), 1) + tl.sum(gq.to(tl.float32), 1)
            fold += tl.sum(aqk.to(tl.float32), 1) + tl.sum(gkt.to(tl.float32), 0)
            out = u.to(tl.float32) + (fold + tl.sum(dec))[:, None]
        else:
            s, out = _scan_step(s, w, u, gq, aqk, gkt, dec, q_scale, k_scale, SCALAR_GATE)
        VD: tl.constexpr = CALLER_DIM(VI, V)
        o_offs = (tok0 + rows).to(tl.int64)[:, None] * (HV * VD) + hv * VD + vcols[None, :]
        if VI > 0:  # masked tiles: the caller's V columns only
            tl.store(o + o_offs, out.to(o.dtype.element_ty),
                     mask=(rows < n)[:, None] & (vcols < VI)[None, :])  # fmt: skip
        else:
            tl.store(o + o_offs, out.to(o.dtype.element_ty), mask=(rows < n)[:, None])
    if STORE_HT:
        _state_out(ht, pid_s, s, K, V, BV, v0, STATE_VK, KI, VI, last)


@triton.jit
def _store_tile(t, c, hv, HV, R: tl.constexpr, S: tl.constexpr, x):
    """Store the [R, S] tile ``x`` of (chunk ``c``, value head ``hv``) in ``t``'s dtype."""
    tl.store(_tile_ptrs(t, c, hv, HV, R, S), x.to(t.dtype.element_ty))


@triton.jit
def _vec_ptrs(t, c, hv, HV, N: tl.constexpr):
    """Pointers to the [N] vector of (chunk ``c``, value head ``hv``) in a [NC, HV, N] buffer."""
    return t + (c * HV + hv).to(tl.int64) * N + tl.arange(0, N)


@triton.jit
def _store_vec(t, c, hv, HV, N: tl.constexpr, x):
    """Store the [N] vector ``x`` (a decay, a row scale) of (chunk ``c``, value head ``hv``)."""
    tl.store(_vec_ptrs(t, c, hv, HV, N), x)


@triton.jit
def _ballast(x, BALLAST: tl.constexpr):
    """Case-study probe: stage a [16, BALLAST // 32] fp16 operand of a tiny product through
    shared memory (BALLAST bytes), so fewer programs fit per SM; adds exactly 0 to ``x``."""
    if BALLAST > 0:
        N: tl.constexpr = BALLAST // 32
        x0 = tl.sum(x)  # runtime data, so the product cannot be folded away
        a = (tl.arange(0, 16)[:, None] + tl.arange(0, 16)[None, :] + x0).to(tl.float16)
        b = (tl.arange(0, 16)[:, None] * N + tl.arange(0, N)[None, :] + x0).to(tl.float16)
        x = x + 0.0 * tl.sum(tl.dot(a, b))
    return x


@triton.jit
def kda_chunk_pairs_kernel(
    q, k, g, alog, dtb, pa_t, pqk_t,
    chunk_seq, seq_chunk, cu_seqlens,
    T, H, HV, lower_bound,
    K: tl.constexpr, C: tl.constexpr, BS: tl.constexpr,
    GATE_ACT: tl.constexpr, QK_L2: tl.constexpr, VARLEN: tl.constexpr, FP32_DOT: tl.constexpr,
    KI: tl.constexpr = 0,
):  # fmt: skip
    """Safe anchor, first kernel of the split and fused paths: the diagonal sub-blocks of A and
    Aqk of one chunk x value head pair by pair (``_pair_diag``), stored [NC, HV, C, BS] fp32.
    Its own kernel, one warp per 16 rows (builders.PAIRS_ROWS_PER_WARP): the tree's scans and
    reductions stay inside a warp (shuffles, no shared-memory round trip) at 142 registers;
    inside the prep (2 warps, large tiles) the pairs spilled or exposed their latency."""
    c = tl.program_id(0)
    hv = tl.program_id(1)
    h = hv // (HV // H)
    tok0, n = _chunk_of(c, T, chunk_seq, seq_chunk, cu_seqlens, C, VARLEN)
    if n > 0:
        k_inv = tl.full((C, 1), 1.0, dtype=tl.float32)
        q_inv = tl.full((C, 1), 1.0, dtype=tl.float32)
        if QK_L2:  # the row norms, as the prep takes them
            KD: tl.constexpr = CALLER_DIM(KI, K)
            kk = _rows(k + h * KD, tok0, n, H * KD, K, C, NCOLS=KI)
            k_inv = tl.rsqrt(tl.sum(kk * kk, axis=1) + 1e-6)[:, None]
            qq = _rows(q + h * KD, tok0, n, H * KD, K, C, NCOLS=KI)
            q_inv = tl.rsqrt(tl.sum(qq * qq, axis=1) + 1e-6)[:, None]
        a, qk = _pair_diag(q, k, g, alog, dtb, tok0, n, h, hv, H, HV, lower_bound, k_inv, q_inv,
                           K, C, BS, GATE_ACT, FP32_DOT, KI)  # fmt: skip
        tl.store(_tile_ptrs(pa_t, c, hv, HV, C, BS), tl.reshape(a, (C, BS)))
        tl.store(_tile_ptrs(pqk_t, c, hv, HV, C, BS), tl.reshape(qk, (C, BS)))


@triton.jit
def kda_chunk_prep_kernel(
    q, k, v, g, beta, alog, dtb, pa_t, pqk_t,
    w_t, u_t, gq_t, aqk_t, gkt_t, dec_t,
    chunk_seq, seq_chunk, cu_seqlens,
    T, H, HV, scale, lower_bound,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BS: tl.constexpr,
    GATE_ACT: tl.constexpr, QK_L2: tl.constexpr, BETA_SIG: tl.constexpr,
    FP32_DOT: tl.constexpr, VARLEN: tl.constexpr, ANCHOR: tl.constexpr,
    LOOPED: tl.constexpr = False, BALLAST: tl.constexpr = 0, SCALAR_GATE: tl.constexpr = False,
    KI: tl.constexpr = 0, VI: tl.constexpr = 0,
):  # fmt: skip
    """Split path, first kernel: the tiles of one chunk x value head, stored chunk-major (at
    the kernel's head dims K, V: with masked tiles, ``KI`` and ``VI`` are the caller's).

    Case-study probes (off by default): ``LOOPED`` makes each program walk all chunks of one
    (sequence, value head) in order, as the fused kernel does, still writing tiles to memory;
    ``BALLAST`` adds unused shared memory to lower the programs resident per SM.
    """
    hv = tl.program_id(1)
    h = hv // (HV // H)
    if LOOPED:
        seq = tl.program_id(0)
        c0, c1, tok_start, tok_end = _seq_chunks(seq, T, seq_chunk, cu_seqlens, C, VARLEN)
        for c in tl.range(c0, c1):
            tok0 = tok_start + (c - c0) * C
            _prep_chunk(
                q, k, v, g, beta, alog, dtb, pa_t, pqk_t, w_t, u_t, gq_t, aqk_t, gkt_t, dec_t,
                c, tok0, tl.minimum(tok_end - tok0, C), h, hv, H, HV, scale,
                lower_bound, K, V, C, BS, GATE_ACT, QK_L2, BETA_SIG, FP32_DOT, BALLAST, ANCHOR,
                SCALAR_GATE, KI, VI,
            )  # fmt: skip
    else:
        c = tl.program_id(0)
        tok0, n = _chunk_of(c, T, chunk_seq, seq_chunk, cu_seqlens, C, VARLEN)
        _prep_chunk(
            q, k, v, g, beta, alog, dtb, pa_t, pqk_t, w_t, u_t, gq_t, aqk_t, gkt_t, dec_t,
            c, tok0, n, h, hv, H, HV, scale, lower_bound,
            K, V, C, BS, GATE_ACT, QK_L2, BETA_SIG, FP32_DOT, BALLAST, ANCHOR, SCALAR_GATE, KI, VI,
        )  # fmt: skip


@triton.jit
def _prep_chunk(
    q, k, v, g, beta, alog, dtb, pa_t, pqk_t, w_t, u_t, gq_t, aqk_t, gkt_t, dec_t,
    c, tok0, n, h, hv, H, HV, scale, lower_bound,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BS: tl.constexpr,
    GATE_ACT: tl.constexpr, QK_L2: tl.constexpr, BETA_SIG: tl.constexpr,
    FP32_DOT: tl.constexpr, BALLAST: tl.constexpr, ANCHOR: tl.constexpr,
    SCALAR_GATE: tl.constexpr, KI: tl.constexpr, VI: tl.constexpr,
):  # fmt: skip
    if n > 0:
        w, u, gq, aqk, gkt, dec = _chunk_tiles(
            q, k, v, g, beta, alog, dtb, pa_t, pqk_t, c, tok0, n, h, hv, H, HV, scale,
            lower_bound, K, V, C, BS, GATE_ACT, QK_L2, BETA_SIG, FP32_DOT, ANCHOR, SCALAR_GATE,
            gq_t, aqk_t, gkt_t, True, KI, VI,
        )  # fmt: skip
        if SCALAR_GATE:  # one decay per chunk, [NC, HV]
            tl.store(dec_t + (c * HV + hv).to(tl.int64), _ballast(dec, BALLAST))
        else:
            _store_vec(dec_t, c, hv, HV, K, _ballast(dec, BALLAST))
        _store_tile(w_t, c, hv, HV, C, K, w)
        _store_tile(u_t, c, hv, HV, C, V, u)


@triton.jit
def kda_chunk_scan_kernel(
    q, k, w_t, u_t, gq_t, aqk_t, gkt_t, dec_t,
    o, h0, ht, hs, hs_seq,
    seq_chunk, cu_seqlens,
    T, H, HV, NSEG,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, STORE_HS: tl.constexpr,
    STATE_VK: tl.constexpr, VARLEN: tl.constexpr, SEG: tl.constexpr,
    HS_EVERY: tl.constexpr = 1, SCALAR_GATE: tl.constexpr = False,
    KI: tl.constexpr = 0, VI: tl.constexpr = 0,
):  # fmt: skip
    """Split path, second kernel: the recurrence over stored tiles (one segment of it when
    SEG > 0, h0 then holding the segments' start states); q and k are read with a scalar gate
    only (``_scan_step``)."""
    _recurrence(
        q, k, None, None, None, None, None, None, None,
        w_t, u_t, gq_t, aqk_t, gkt_t, dec_t, o, h0, ht, hs, hs_seq, seq_chunk, cu_seqlens,
        T, H, HV, 1.0, 0.0, K, V, C, C, BV, 0, False, False, "ieee",
        USE_H0, STORE_HT, STORE_HS, STATE_VK, VARLEN, False, w_t.dtype.element_ty, SEG, NSEG,
        HS_EVERY=HS_EVERY, SCALAR_GATE=SCALAR_GATE, KI=KI, VI=VI,
    )  # fmt: skip


@triton.jit
def kda_chunk_fused_kernel(
    q, k, v, g, beta, alog, dtb, pa_t, pqk_t,
    o, h0, ht, hs, hs_seq,
    seq_chunk, cu_seqlens,
    T, H, HV, scale, lower_bound,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BS: tl.constexpr, BV: tl.constexpr,
    GATE_ACT: tl.constexpr, QK_L2: tl.constexpr, BETA_SIG: tl.constexpr,
    FP32_DOT: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
    STORE_HS: tl.constexpr, STATE_VK: tl.constexpr, VARLEN: tl.constexpr,
    ABLATE_SCAN: tl.constexpr = False, ANCHOR: tl.constexpr = ANCHOR_SAFE,
    HS_EVERY: tl.constexpr = 1, SCALAR_GATE: tl.constexpr = False,
    KI: tl.constexpr = 0, VI: tl.constexpr = 0,
):  # fmt: skip
    """Fused path: tiles computed on chip, chunk after chunk, inside the recurrence.

    ``ABLATE_SCAN`` (case-study probe, off by default) replaces the scan step by a cheap fold of
    every tile into the output, timing the tile phase alone."""
    _recurrence(
        q, k, v, g, beta, alog, dtb, pa_t, pqk_t,
        None, None, None, None, None, None, o, h0, ht, hs, hs_seq, seq_chunk, cu_seqlens,
        T, H, HV, scale, lower_bound, K, V, C, BS, BV, GATE_ACT, QK_L2, BETA_SIG, FP32_DOT,
        USE_H0, STORE_HT, STORE_HS, STATE_VK, VARLEN, True, q.dtype.element_ty, 0, 1,
        ABLATE_SCAN, ANCHOR, HS_EVERY, SCALAR_GATE, KI, VI,
    )  # fmt: skip


@triton.jit
def kda_segment_map_kernel(
    q, k, w_t, u_t, gq_t, aqk_t, gkt_t, dec_t, seg_map,
    seq_chunk, cu_seqlens,
    T, H, HV, NSEG, MAP_LAST,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr,
    VARLEN: tl.constexpr, SEG: tl.constexpr, SCALAR_GATE: tl.constexpr = False,
):  # fmt: skip
    """Sequence-parallel scan, pass 1: the affine map S_end = M S_start + N of one segment.

    Runs the scan step on the augmented state [M | N] ([K, K + V], columns independent, one
    BV block per program) from [I | 0]: M's columns see u = 0, N's columns the real u.
    A sequence's last segment is mapped only with ``MAP_LAST`` (context parallel composes a
    whole piece): the scan runs that segment from its start state, so its map is not needed.
    """
    pid_v = tl.program_id(0)
    pid_s = tl.program_id(1)
    seg = tl.program_id(2)
    seq = pid_s // HV
    hv = pid_s % HV
    h = hv // (HV // H)
    c0, c1, tok_start, tok_end = _seq_chunks(seq, T, seq_chunk, cu_seqlens, C, VARLEN)
    n_seg = tl.cdiv(c1 - c0, SEG)
    col0 = pid_v * BV
    is_n = col0 >= K
    v0 = tl.maximum(col0 - K, 0)
    cols = col0 + tl.arange(0, BV)
    s = tl.where((tl.arange(0, K)[:, None] == cols[None, :]), 1.0, 0.0)
    needed = (seg < tl.minimum(n_seg, NSEG) - 1) | (MAP_LAST != 0)
    first = c0 + seg * SEG
    for c in tl.range(first, tl.where(needed, tl.minimum(c1, first + SEG), first)):
        tok0 = tok_start + (c - c0) * C
        w, u, gq, aqk, gkt, dec, q_scale, k_scale = _load_tiles(
            q, k, w_t, u_t, gq_t, aqk_t, gkt_t, dec_t, c, tok0, tl.minimum(tok_end - tok0, C),
            h, H, hv, HV, v0, is_n, K, V, C, BV, SCALAR_GATE,
        )  # fmt: skip
        s, out = _scan_step(s, w, u, gq, aqk, gkt, dec, q_scale, k_scale, SCALAR_GATE)  # out unused
    base = ((seq * NSEG + seg) * HV + hv).to(tl.int64) * (K * (K + V))
    offs = tl.arange(0, K)[:, None] * (K + V) + cols[None, :]
    tl.store(seg_map + base + offs, s, mask=(seg < n_seg) & needed)


@triton.jit
def kda_segment_combine_kernel(
    seg_map, seg_start, h0,
    seq_chunk, cu_seqlens,
    T, HV, NSEG,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr,
    USE_H0: tl.constexpr, STATE_VK: tl.constexpr, VARLEN: tl.constexpr, SEG: tl.constexpr,
    FP32_DOT: tl.constexpr, BK: tl.constexpr, KI: tl.constexpr = 0, VI: tl.constexpr = 0,
):  # fmt: skip
    """Sequence-parallel scan, pass 2: the short serial chain over segments that gives every
    segment its true start state (S_next = M S + N), written to ``seg_start``.

    With ``BK`` < K the map is multiplied in row blocks of BK (a whole [K, K] map does not fit
    shared memory at K = 256): each block of S_next goes to its slot of ``seg_start``, which the
    next step reads whole after a barrier."""
    pid_v = tl.program_id(0)
    pid_s = tl.program_id(1)
    seq = pid_s // HV
    hv = pid_s % HV
    v0 = pid_v * BV
    c0, c1, tok_start, tok_end = _seq_chunks(seq, T, seq_chunk, cu_seqlens, C, VARLEN)
    if USE_H0:
        s = _state_in(h0, pid_s, K, V, BV, v0, STATE_VK, KI, VI)
    else:
        s = tl.zeros((K, BV), dtype=tl.float32)
    kk = tl.arange(0, K)
    n_seg = tl.minimum(tl.cdiv(c1 - c0, SEG), NSEG)  # see _recurrence
    if BK == K:  # the last segment's map is not needed (nor, without MAP_LAST, computed)
        n_maps = tl.maximum(n_seg - 1, 0)
        for seg in tl.range(0, n_maps):
            idx = (seq * NSEG + seg) * HV + hv
            tl.store(_state_ptrs(seg_start, idx, K, V, BV, v0, False), s)
            base = seg_map + idx.to(tl.int64) * (K * (K + V)) + kk[:, None] * (K + V)
            m = tl.load(base + kk[None, :])
            n = tl.load(base + K + v0 + tl.arange(0, BV)[None, :])
            s = tl.dot(m, s, acc=n, input_precision=FP32_DOT)
        # the last segment's start (an empty sequence's segment 0 carries the initial state)
        tl.store(_state_ptrs(seg_start, (seq * NSEG + n_maps) * HV + hv, K, V, BV, v0, False), s)
    else:
        # segment 0's start (an empty sequence's too); the last segment's map is not needed
        tl.store(_state_ptrs(seg_start, seq * NSEG * HV + hv, K, V, BV, v0, False), s)
        rows = tl.arange(0, BK)
        vv = v0 + tl.arange(0, BV)
        for seg in tl.range(0, n_seg - 1):
            idx = (seq * NSEG + seg) * HV + hv
            tl.debug_barrier()  # the previous step's blocks, stored by every thread
            s = tl.load(_state_ptrs(seg_start, idx, K, V, BV, v0, False))
            nxt = seg_start + (idx + HV).to(tl.int64) * (K * V)  # (seq, seg + 1)
            for kb in tl.static_range(K // BK):
                r = kb * BK + rows
                base = seg_map + idx.to(tl.int64) * (K * (K + V)) + r[:, None] * (K + V)
                m = tl.load(base + kk[None, :])
                n = tl.load(base + K + vv[None, :])
                tl.store(nxt + r[:, None] * V + vv[None, :],
                         tl.dot(m, s, acc=n, input_precision=FP32_DOT))  # fmt: skip
