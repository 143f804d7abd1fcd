"""Float64 reference oracles for KDA (chunkwise gated delta-rule) prefill.

Two oracles compute the same function by different routes and share no algebra:

* :func:`token_serial_oracle` walks the recurrence one token at a time::

      S   <- diag(exp(g_t)) S
      S   <- S + beta_t k_t (v_t - S^T k_t)^T
      o_t  = S^T (scale * q_t)

* :func:`tile_oracle` applies the chunkwise factorization (docs/kda/ALGORITHM.md) chunk by chunk,
  forming every pairwise decay ``exp(G_i - G_j)`` directly from the masked difference tensor.

They share only :func:`_prepare_inputs` (conversion to float64, validation, splitting into
sequences), which contains no part of the recurrence.

Layouts: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g ``[B, T, HV, K]`` (activated log-decay);
beta ``[B, T, HV]``; initial_state ``[B or N, HV, K, V]`` (``[..., V, K]`` for ``state_layout="vk"``).
Value head ``hv`` reads qk head ``hv // (HV // H)``. Varlen: ``cu_seqlens [N + 1]`` with ``B == 1``.

The module also holds float64 reference input preparation (gate activations, L2 normalisation,
sigmoid) and :func:`relative_rms`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kreg.problems.linear_attention import STATE_LAYOUTS as _STATE_LAYOUTS

__all__ = [
    "gate_sigmoid_bound",
    "gate_softplus",
    "l2norm",
    "relative_rms",
    "sigmoid",
    "tile_oracle",
    "token_serial_oracle",
]


# --------------------------------------------------------------------------------------------------
# Input preparation shared by both oracles (conversion and validation only, no recurrence algebra)
# --------------------------------------------------------------------------------------------------


def _as_f64(x: Any, name: str) -> np.ndarray:
    """A float64 numpy copy of a numpy array, torch tensor or nested sequence."""
    if x is None:
        raise ValueError(f"{name}: expected an array, got None")
    if hasattr(x, "detach"):  # torch tensor, converted without importing torch
        x = x.detach().cpu().double().numpy()
    try:
        return np.array(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: cannot convert to a float64 array ({exc})") from exc


def _as_index(x: Any, name: str) -> np.ndarray:
    """A 1-D int64 numpy copy of an integer array or tensor."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected an integer array, got dtype {arr.dtype}")
    return arr.astype(np.int64)


@dataclass(frozen=True)
class _Prepared:
    q: np.ndarray  # [B, T, H, K]
    k: np.ndarray  # [B, T, H, K]
    v: np.ndarray  # [B, T, HV, V]
    g: np.ndarray  # [B, T, HV, K]
    beta: np.ndarray  # [B, T, HV]
    state0: np.ndarray  # [n_states, HV, K, V], always "kv" layout
    scale: float
    group: int  # HV // H
    segments: tuple[tuple[int, int, int], ...]  # (batch row, start, end), one per sequence
    varlen: bool


def _prepare_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_layout) -> _Prepared:
    """Convert to float64, validate shapes and options, and list the independent sequences."""
    q = _as_f64(q, "q")
    k = _as_f64(k, "k")
    v = _as_f64(v, "v")
    g = _as_f64(g, "g")
    beta = _as_f64(beta, "beta")

    if q.ndim != 4:
        raise ValueError(f"q: expected shape [B, T, H, K], got {q.shape}")
    B, T, H, K = q.shape
    if H < 1 or K < 1:
        raise ValueError(f"q: need H >= 1 and K >= 1, got shape {q.shape}")
    if k.shape != q.shape:
        raise ValueError(f"k: expected shape {q.shape} (same as q), got {k.shape}")
    if v.ndim != 4 or v.shape[:2] != (B, T):
        raise ValueError(f"v: expected shape [B={B}, T={T}, HV, V], got {v.shape}")
    HV, V = v.shape[2], v.shape[3]
    if HV < 1 or V < 1:
        raise ValueError(f"v: need HV >= 1 and V >= 1, got shape {v.shape}")
    if HV % H != 0:
        raise ValueError(f"v: value heads HV={HV} must be a multiple of qk heads H={H}")
    if g.shape != (B, T, HV, K):
        raise ValueError(f"g: expected shape [B, T, HV, K] = {(B, T, HV, K)}, got {g.shape}")
    if beta.shape != (B, T, HV):
        raise ValueError(f"beta: expected shape [B, T, HV] = {(B, T, HV)}, got {beta.shape}")

    if state_layout not in _STATE_LAYOUTS:
        raise ValueError(f"state_layout: expected one of {_STATE_LAYOUTS}, got {state_layout!r}")

    if scale is None:
        scale = K**-0.5
    else:
        try:
            scale = float(scale)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"scale: expected a real number, got {scale!r}") from exc
        if not math.isfinite(scale):
            raise ValueError(f"scale: must be finite, got {scale}")

    if cu_seqlens is None:
        segments = tuple((b, 0, T) for b in range(B))
        varlen = False
    else:
        cu = _as_index(cu_seqlens, "cu_seqlens")
        if cu.ndim != 1 or cu.shape[0] < 2:
            raise ValueError(
                f"cu_seqlens: expected a 1-D array [N + 1] with N >= 1, got {cu.shape}"
            )
        if B != 1:
            raise ValueError(f"cu_seqlens: varlen inputs must be packed with B == 1, got B={B}")
        if cu[0] != 0:
            raise ValueError(f"cu_seqlens: must start at 0, got {int(cu[0])}")
        if cu[-1] != T:
            raise ValueError(f"cu_seqlens: must end at T={T}, got {int(cu[-1])}")
        if np.any(np.diff(cu) < 0):
            raise ValueError(f"cu_seqlens: must be non-decreasing, got {cu.tolist()}")
        segments = tuple((0, int(cu[n]), int(cu[n + 1])) for n in range(cu.shape[0] - 1))
        varlen = True
    n_states = len(segments)

    if initial_state is None:
        state0 = np.zeros((n_states, HV, K, V))
    else:
        state0 = _as_f64(initial_state, "initial_state")
        tail = (K, V) if state_layout == "kv" else (V, K)
        want = (n_states, HV, *tail)
        if state0.shape != want:
            lead = "N" if varlen else "B"
            dims = "K, V" if state_layout == "kv" else "V, K"
            raise ValueError(
                f"initial_state: expected shape [{lead}, HV, {dims}] = {want} "
                f"(state_layout={state_layout!r}), got {state0.shape}"
            )
        if state_layout == "vk":
            state0 = np.ascontiguousarray(np.swapaxes(state0, -1, -2))

    return _Prepared(q, k, v, g, beta, state0, scale, HV // H, segments, varlen)


def _state_out(state: np.ndarray, state_layout: str) -> np.ndarray:
    """States are kept [..., K, V] internally; return them in the requested layout."""
    if state_layout == "vk":
        return np.ascontiguousarray(np.swapaxes(state, -1, -2))
    return state


# --------------------------------------------------------------------------------------------------
# Oracle 1: token-serial recurrence
# --------------------------------------------------------------------------------------------------


def token_serial_oracle(
    q,
    k,
    v,
    g,
    beta,
    *,
    scale=None,
    initial_state=None,
    cu_seqlens=None,
    state_layout: str = "kv",
) -> tuple[np.ndarray, np.ndarray]:
    """Walk the recurrence one token at a time in float64.

    Returns ``(o [B, T, HV, V], final_state [B or N, HV, K, V])`` (state ``[..., V, K]`` for
    ``state_layout="vk"``).
    """
    p = _prepare_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_layout)
    B, T, HV, V = p.v.shape
    o = np.zeros((B, T, HV, V))
    final = np.empty_like(p.state0)
    for n, (b, start, end) in enumerate(p.segments):
        for hv in range(HV):
            h = hv // p.group
            S = p.state0[n, hv].copy()  # [K, V]
            for t in range(start, end):
                k_t = p.k[b, t, h]
                S = np.exp(p.g[b, t, hv])[:, None] * S  # decay first
                err = p.v[b, t, hv] - S.T @ k_t  # delta-rule error on the decayed state
                S = S + p.beta[b, t, hv] * np.outer(k_t, err)
                o[b, t, hv] = S.T @ (p.scale * p.q[b, t, h])  # read after the update
            final[n, hv] = S
    return o, _state_out(final, state_layout)


# --------------------------------------------------------------------------------------------------
# Oracle 2: chunkwise factorization with directly formed pairwise decays
# --------------------------------------------------------------------------------------------------


def _unit_lower_inverse(A: np.ndarray) -> np.ndarray:
    """(I + A)^-1 for strictly lower-triangular A, by row-wise forward substitution."""
    c = A.shape[0]
    Tm = np.eye(c)
    for i in range(1, c):
        Tm[i, :i] -= A[i, :i] @ Tm[:i, :i]
    return Tm


def _chunk_step(q, k, v, g, beta, S0, scale):
    """One chunk: inputs q, k, g [c, K]; v [c, V]; beta [c]; S0 [K, V]. Returns (O, S1)."""
    c = g.shape[0]
    G = np.cumsum(g, axis=0)  # chunk-local inclusive cumsum
    causal = np.tril(np.ones((c, c), dtype=bool))  # j <= i
    strict = np.tril(np.ones((c, c), dtype=bool), -1)  # j < i
    diff = G[:, None, :] - G[None, :, :]  # [c, c, K]: G_i - G_j
    # Mask before exponentiating: the upper triangle (j > i) holds positive exponents.
    decay = np.exp(np.where(causal[:, :, None], diff, -np.inf))

    A = beta[:, None] * np.einsum("id,jd,ijd->ij", k, k, decay)
    A = np.where(strict, A, 0.0)
    Tm = _unit_lower_inverse(A)
    Gamma = np.exp(G)
    W = Tm @ (beta[:, None] * (k * Gamma))
    U = Tm @ (beta[:, None] * v)
    Aqk = scale * np.einsum("id,jd,ijd->ij", q, k, decay)
    Aqk = np.where(causal, Aqk, 0.0)

    Vnew = U - W @ S0
    O = scale * (q * Gamma) @ S0 + Aqk @ Vnew
    S1 = Gamma[-1][:, None] * S0 + (k * np.exp(G[-1][None, :] - G)).T @ Vnew
    return O, S1


def tile_oracle(
    q,
    k,
    v,
    g,
    beta,
    *,
    scale=None,
    initial_state=None,
    cu_seqlens=None,
    state_layout: str = "kv",
    chunk: int = 64,
    return_chunk_states: bool = False,
):
    """The chunkwise factorization in float64, chunk by chunk within each sequence.

    Chunks never straddle sequences; the last chunk of a sequence may be shorter than ``chunk``.

    Returns ``(o, final_state)``, or ``(o, final_state, chunk_states)`` with
    ``return_chunk_states=True``: the state at the start of every chunk, ``[B, HV, NT, K, V]``
    (NT = ceil(T / chunk)) without cu_seqlens, or ``[total_chunks, HV, K, V]`` in sequence order
    with cu_seqlens (a zero-length sequence has no chunks). Chunk states follow ``state_layout``.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"chunk: expected a positive integer, got {chunk!r}")
    chunk = int(chunk)
    p = _prepare_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens, state_layout)
    B, T, HV, V = p.v.shape
    K = p.q.shape[-1]
    o = np.zeros((B, T, HV, V))
    final = np.empty_like(p.state0)

    starts_per_seg = [list(range(s, e, chunk)) for (_, s, e) in p.segments]
    if p.varlen:
        chunk_states = np.zeros((sum(map(len, starts_per_seg)), HV, K, V))
    else:
        chunk_states = np.zeros((B, HV, -(-T // chunk), K, V))

    flat = 0  # running chunk index across sequences (varlen)
    for n, (b, _, end) in enumerate(p.segments):
        starts = starts_per_seg[n]
        for hv in range(HV):
            h = hv // p.group
            S = p.state0[n, hv].copy()
            for c, cs in enumerate(starts):
                ce = min(cs + chunk, end)
                if p.varlen:
                    chunk_states[flat + c, hv] = S
                else:
                    chunk_states[b, hv, c] = S
                O, S = _chunk_step(
                    p.q[b, cs:ce, h],
                    p.k[b, cs:ce, h],
                    p.v[b, cs:ce, hv],
                    p.g[b, cs:ce, hv],
                    p.beta[b, cs:ce, hv],
                    S,
                    p.scale,
                )
                o[b, cs:ce, hv] = O
            final[n, hv] = S
        flat += len(starts)

    out = (o, _state_out(final, state_layout))
    if return_chunk_states:
        return (*out, _state_out(chunk_states, state_layout))
    return out


# --------------------------------------------------------------------------------------------------
# Reference input preparation (float64): gate activations, normalisation, sigmoid
# --------------------------------------------------------------------------------------------------


def sigmoid(x) -> np.ndarray:
    """Numerically stable logistic function in float64."""
    x = _as_f64(x, "x")
    return np.exp(-np.logaddexp(0.0, -x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)  # log(1 + exp(x)) without overflow


def _gate_pre(g_raw, A_log, dt_bias):
    """(exp(A_log) per head, g_raw + dt_bias) for g_raw [..., HV, K]."""
    x = _as_f64(g_raw, "g_raw")
    if x.ndim < 2:
        raise ValueError(f"g_raw: expected shape [..., HV, K], got {x.shape}")
    HV, K = x.shape[-2:]
    if dt_bias is not None:
        bias = _as_f64(dt_bias, "dt_bias")
        if bias.size != HV * K:
            raise ValueError(f"dt_bias: expected HV*K = {HV * K} values, got shape {bias.shape}")
        x = x + bias.reshape(HV, K)
    factor = 1.0
    if A_log is not None:
        a = _as_f64(A_log, "A_log")
        if a.size != HV:
            raise ValueError(f"A_log: expected HV = {HV} values, got shape {a.shape}")
        factor = np.exp(a.reshape(HV, 1))
    return factor, x


def gate_sigmoid_bound(g_raw, A_log=None, dt_bias=None, lower_bound: float = -5.0) -> np.ndarray:
    """Bounded gate: ``lower_bound * sigmoid(exp(A_log) * (g_raw + dt_bias))``, in [lower_bound, 0].

    g_raw ``[..., HV, K]``; A_log ``[HV]`` (None: factor 1); dt_bias ``[HV * K]`` (None: 0).
    """
    factor, x = _gate_pre(g_raw, A_log, dt_bias)
    return float(lower_bound) * sigmoid(factor * x)


def gate_softplus(g_raw, A_log=None, dt_bias=None) -> np.ndarray:
    """Unbounded gate: ``-exp(A_log) * softplus(g_raw + dt_bias)``, in (-inf, 0]."""
    factor, x = _gate_pre(g_raw, A_log, dt_bias)
    return -factor * _softplus(x)


def l2norm(x, eps: float = 1e-6) -> np.ndarray:
    """``x / sqrt(sum(x**2) + eps)`` over the last dimension, in float64."""
    x = _as_f64(x, "x")
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


# --------------------------------------------------------------------------------------------------
# Error metric
# --------------------------------------------------------------------------------------------------


def relative_rms(x, ref) -> float:
    """``||x - ref|| / ||ref||`` (Frobenius, float64); inf if anything is NaN or infinite.

    A zero reference gives 0.0 when x is also zero, else inf.
    """
    x = _as_f64(x, "x")
    ref = _as_f64(ref, "ref")
    if x.shape != ref.shape:
        raise ValueError(f"x: shape {x.shape} differs from ref shape {ref.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(ref))):
        return math.inf
    num = float(np.linalg.norm((x - ref).ravel()))
    den = float(np.linalg.norm(ref.ravel()))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den
