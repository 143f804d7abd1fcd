"""Tests of the float64 KDA oracles and the reference input preparation (CPU, fast)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kreg.families.kda.oracles import (
    gate_sigmoid_bound,
    gate_softplus,
    l2norm,
    relative_rms,
    sigmoid,
    tile_oracle,
    token_serial_oracle,
)

TOL = 1e-10
ORACLES = {"serial": token_serial_oracle, "tile": tile_oracle}


def make_inputs(
    B=2,
    T=100,
    H=2,
    HV=2,
    K=16,
    V=16,
    *,
    seed=0,
    lower_bound=-5.0,
    init=False,
    n_states=None,
    resets=(),
):
    """Random inputs in the production form: L2-normalised q, k; bounded gates; sigmoid beta."""
    rng = np.random.default_rng(seed)
    q = l2norm(rng.normal(size=(B, T, H, K)))
    k = l2norm(rng.normal(size=(B, T, H, K)))
    v = rng.normal(size=(B, T, HV, V))
    g = gate_sigmoid_bound(
        rng.normal(size=(B, T, HV, K)),
        A_log=rng.normal(scale=0.5, size=HV),
        dt_bias=rng.normal(size=HV * K),
        lower_bound=lower_bound,
    )
    for t in resets:  # hard resets: the state is wiped at these positions
        g[:, t] = -1000.0
    beta = sigmoid(rng.normal(size=(B, T, HV)))
    S0 = rng.normal(size=(n_states or B, HV, K, V)) if init else None
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": S0}


def assert_close(x, ref, tol=TOL):
    err = relative_rms(x, ref)
    assert err < tol, f"relative RMS error {err:.3e} >= {tol:.0e}"


# ------------------------------------------------------------------------------------------------
# The two oracles agree
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("KV", [(16, 16), (32, 16)])
@pytest.mark.parametrize("init", [False, True])
def test_oracles_agree(chunk, KV, init):
    K, V = KV
    x = make_inputs(T=100, K=K, V=V, init=init, seed=chunk + K)  # 100: not a multiple of any chunk
    o1, s1 = token_serial_oracle(**x)
    o2, s2 = tile_oracle(**x, chunk=chunk)
    assert o1.shape == (2, 100, 2, V) and s1.shape == (2, 2, K, V)
    assert o2.shape == o1.shape and s2.shape == s1.shape
    assert o1.dtype == np.float64 and s1.dtype == np.float64
    assert_close(o2, o1)
    assert_close(s2, s1)


@pytest.mark.parametrize("lower_bound", [-0.01, -1.0, -5.0, -20.0])
@pytest.mark.parametrize("resets", [(), (3, 40, 41, 77)])
def test_gate_sweep_and_hard_resets(lower_bound, resets):
    x = make_inputs(T=90, lower_bound=lower_bound, init=True, resets=resets, seed=7)
    o1, s1 = token_serial_oracle(**x)
    # The tile oracle masks before exponentiating: no overflow, no inf * 0 even at g = -1000.
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        o2, s2 = tile_oracle(**x, chunk=32)
    assert np.all(np.isfinite(o2)) and np.all(np.isfinite(s2))
    assert_close(o2, o1)
    assert_close(s2, s1)


def test_hard_reset_wipes_state():
    """A reset (g = -1000 everywhere) at t makes everything from t on independent of the past."""
    x = make_inputs(B=1, T=60, init=True, resets=(30,), seed=3)
    y = {key: (val.copy() if val is not None else None) for key, val in x.items()}
    y["v"][:, :30] = np.random.default_rng(9).normal(size=y["v"][:, :30].shape)
    y["initial_state"] = None
    for oracle in ORACLES.values():
        ox, sx = oracle(**x)
        oy, sy = oracle(**y)
        assert relative_rms(ox[:, :30], oy[:, :30]) > 1e-2  # the prefix does differ
        assert_close(ox[:, 30:], oy[:, 30:], 1e-12)
        assert_close(sx, sy, 1e-12)


def test_unbounded_softplus_gates():
    x = make_inputs(T=70, init=True, seed=11)
    rng = np.random.default_rng(12)
    x["g"] = gate_softplus(rng.normal(scale=3.0, size=x["g"].shape), A_log=np.array([0.5, 1.5]))
    assert x["g"].min() < -30  # genuinely large decays in single steps
    o1, s1 = token_serial_oracle(**x)
    with np.errstate(over="raise", invalid="raise"):
        o2, s2 = tile_oracle(**x, chunk=64)
    assert_close(o2, o1)
    assert_close(s2, s1)


# ------------------------------------------------------------------------------------------------
# Grouped value heads
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("H,HV", [(1, 2), (2, 4)])
def test_gqa_matches_repeated_heads(H, HV):
    x = make_inputs(H=H, HV=HV, T=50, init=True, seed=H + HV)
    rep = dict(x)
    rep["q"] = np.repeat(x["q"], HV // H, axis=2)  # value head hv reads qk head hv // (HV // H)
    rep["k"] = np.repeat(x["k"], HV // H, axis=2)
    o_ref, s_ref = token_serial_oracle(**rep)
    for name, oracle in ORACLES.items():
        o, s = oracle(**x)
        assert o.shape == (2, 50, HV, 16), name
        assert_close(o, o_ref)
        assert_close(s, s_ref)


# ------------------------------------------------------------------------------------------------
# Varlen
# ------------------------------------------------------------------------------------------------

CU = np.array([0, 37, 37, 100, 130], dtype=np.int64)  # includes a zero-length sequence


@pytest.mark.parametrize("init", [False, True])
def test_varlen_agrees_and_equals_separate_runs(init):
    x = make_inputs(B=1, T=130, init=init, n_states=4, seed=21)
    o1, s1 = token_serial_oracle(**x, cu_seqlens=CU)
    o2, s2 = tile_oracle(**x, cu_seqlens=CU, chunk=32)
    assert o1.shape == (1, 130, 2, 16) and s1.shape == (4, 2, 16, 16)
    assert_close(o2, o1)
    assert_close(s2, s1)
    for n in range(4):
        a, b = CU[n], CU[n + 1]
        part = {key: x[key][:, a:b] for key in ("q", "k", "v", "g", "beta")}
        S0n = None if x["initial_state"] is None else x["initial_state"][n : n + 1]
        for oracle in ORACLES.values():
            o, s = oracle(**part, initial_state=S0n)
            assert o.shape == (1, b - a, 2, 16)
            np.testing.assert_allclose(o, o1[:, a:b], rtol=1e-12, atol=1e-13)
            np.testing.assert_allclose(s, s1[n : n + 1], rtol=1e-12, atol=1e-13)
    # The zero-length sequence returns its initial state (or zeros) untouched.
    expect = np.zeros((2, 16, 16)) if x["initial_state"] is None else x["initial_state"][1]
    np.testing.assert_array_equal(s1[1], expect)
    np.testing.assert_array_equal(s2[1], expect)


def test_varlen_differs_from_unsplit():
    """Sequences really restart: treating the batch as one sequence gives different outputs."""
    x = make_inputs(B=1, T=130, seed=22)
    o_var, _ = tile_oracle(**x, cu_seqlens=CU)
    o_one, _ = tile_oracle(**x)
    assert_close(o_var[:, :37], o_one[:, :37], 1e-12)
    assert relative_rms(o_var[:, 37:], o_one[:, 37:]) > 1e-2


# ------------------------------------------------------------------------------------------------
# State layout and chunk states
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("oracle", ORACLES.values(), ids=ORACLES.keys())
def test_state_layout_vk(oracle):
    x = make_inputs(T=40, K=32, V=16, init=True, seed=31)
    o_kv, s_kv = oracle(**x)
    x_vk = dict(x, initial_state=np.swapaxes(x["initial_state"], -1, -2).copy())
    o_vk, s_vk = oracle(**x_vk, state_layout="vk")
    assert s_vk.shape == (2, 2, 16, 32)
    np.testing.assert_array_equal(o_vk, o_kv)
    np.testing.assert_array_equal(s_vk, np.swapaxes(s_kv, -1, -2))


@pytest.mark.parametrize("chunk", [16, 32])
def test_chunk_states_fixed_length(chunk):
    T = 75
    x = make_inputs(T=T, init=True, seed=41)
    _o, _s, cs = tile_oracle(**x, chunk=chunk, return_chunk_states=True)
    NT = math.ceil(T / chunk)
    assert cs.shape == (2, 2, NT, 16, 16)
    np.testing.assert_array_equal(cs[:, :, 0], x["initial_state"])
    for c in range(1, NT):
        prefix = {key: x[key][:, : c * chunk] for key in ("q", "k", "v", "g", "beta")}
        _, s_prefix = token_serial_oracle(**prefix, initial_state=x["initial_state"])
        assert_close(cs[:, :, c], s_prefix)
    # Chunk states follow state_layout.
    x_vk = dict(x, initial_state=np.swapaxes(x["initial_state"], -1, -2).copy())
    _, _, cs_vk = tile_oracle(**x_vk, chunk=chunk, return_chunk_states=True, state_layout="vk")
    np.testing.assert_array_equal(cs_vk, np.swapaxes(cs, -1, -2))


def test_chunk_states_varlen():
    chunk = 16
    x = make_inputs(B=1, T=130, init=True, n_states=4, seed=42)
    _, _, cs = tile_oracle(**x, cu_seqlens=CU, chunk=chunk, return_chunk_states=True)
    lens = np.diff(CU)
    assert cs.shape == (
        sum(math.ceil(n / chunk) for n in lens),
        2,
        16,
        16,
    )  # 3 + 0 + 4 + 2
    row = 0
    for n in range(4):
        a = CU[n]
        for c in range(math.ceil(lens[n] / chunk)):
            prefix = {key: x[key][:, a : a + c * chunk] for key in ("q", "k", "v", "g", "beta")}
            S0n = x["initial_state"][n : n + 1]
            _, s_prefix = token_serial_oracle(**prefix, initial_state=S0n)
            assert_close(cs[row], s_prefix[0])
            row += 1
    assert row == cs.shape[0]


# ------------------------------------------------------------------------------------------------
# Closed forms
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("oracle", ORACLES.values(), ids=ORACLES.keys())
def test_single_token_closed_form(oracle):
    x = make_inputs(B=1, T=1, H=1, HV=1, K=8, V=4, seed=51)
    q, k, v, b = x["q"][0, 0, 0], x["k"][0, 0, 0], x["v"][0, 0, 0], x["beta"][0, 0, 0]
    scale = 0.37
    o, s = oracle(**x, scale=scale)
    np.testing.assert_allclose(o[0, 0, 0], scale * b * (q @ k) * v, rtol=1e-13, atol=0)
    np.testing.assert_allclose(s[0, 0], b * np.outer(k, v), rtol=1e-13, atol=0)

    # With a state: decay, then the delta-rule error on the decayed state, then the read.
    S0 = np.random.default_rng(52).normal(size=(1, 1, 8, 4))
    o, s = oracle(**dict(x, initial_state=S0), scale=scale)
    Sd = np.exp(x["g"][0, 0, 0])[:, None] * S0[0, 0]
    S1 = Sd + b * np.outer(k, v - Sd.T @ k)
    np.testing.assert_allclose(s[0, 0], S1, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(o[0, 0, 0], S1.T @ (scale * q), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("oracle", ORACLES.values(), ids=ORACLES.keys())
def test_default_scale_is_inverse_sqrt_k(oracle):
    x = make_inputs(T=20, K=32, V=16, init=True, seed=53)
    o_default, _ = oracle(**x)
    o_explicit, _ = oracle(**x, scale=32**-0.5)
    np.testing.assert_array_equal(o_default, o_explicit)
    o_other, _ = oracle(**x, scale=1.0)
    assert relative_rms(o_other, o_default) > 0.5


@pytest.mark.parametrize("oracle", ORACLES.values(), ids=ORACLES.keys())
def test_g_zero_beta_zero_state_carries(oracle):
    x = make_inputs(T=50, init=True, seed=61)
    x["g"][:] = 0.0
    x["beta"][:] = 0.0
    o, s = oracle(**x)
    S0 = x["initial_state"]
    np.testing.assert_allclose(s, S0, rtol=1e-14, atol=1e-14)
    q_v = np.repeat(x["q"], 1, axis=2)  # H == HV here
    expect = np.einsum("bhkv,bthk->bthv", S0, 16**-0.5 * q_v)
    np.testing.assert_allclose(o, expect, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("oracle", ORACLES.values(), ids=ORACLES.keys())
def test_beta_zero_pure_decay(oracle):
    x = make_inputs(T=45, init=True, seed=62)
    x["beta"][:] = 0.0
    _, s = oracle(**x)
    total = np.exp(x["g"].sum(axis=1))  # [B, HV, K]
    np.testing.assert_allclose(s, total[..., None] * x["initial_state"], rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("oracle", ORACLES.values(), ids=ORACLES.keys())
def test_delta_rule_overwrites_key(oracle):
    """beta = 1, g = 0, |k| = 1: after writing v at key k, reading at k returns exactly v."""
    x = make_inputs(B=1, T=24, H=1, HV=1, K=16, V=8, init=True, seed=63)
    x["g"][:] = 0.0
    x["beta"][:] = 1.0
    x["k"] = x["k"] / np.linalg.norm(x["k"], axis=-1, keepdims=True)
    x["q"] = x["k"].copy()
    o, _ = oracle(**x, scale=1.0)
    np.testing.assert_allclose(o, x["v"], rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# Input handling and validation
# ------------------------------------------------------------------------------------------------


def test_torch_inputs_accepted():
    torch = pytest.importorskip("torch")
    x = make_inputs(T=30, init=True, seed=71)
    xt = {key: torch.tensor(val, dtype=torch.float32) for key, val in x.items()}
    x32 = {key: val.astype(np.float32).astype(np.float64) for key, val in x.items()}
    for oracle in ORACLES.values():
        o_t, s_t = oracle(**xt)
        o_n, s_n = oracle(**x32)
        assert o_t.dtype == np.float64
        np.testing.assert_array_equal(o_t, o_n)
        np.testing.assert_array_equal(s_t, s_n)
    cu = torch.tensor([0, 10, 30])
    xt1 = {key: val[:1] for key, val in xt.items() if key != "initial_state"}
    x1 = {key: val[:1] for key, val in x32.items() if key != "initial_state"}
    o_t, _ = tile_oracle(**xt1, cu_seqlens=cu)
    o_n, _ = tile_oracle(**x1, cu_seqlens=[0, 10, 30])
    np.testing.assert_array_equal(o_t, o_n)


def _bad(**changes):
    x = make_inputs(B=1, T=12, H=2, HV=4, K=8, V=4, init=True, seed=81)
    x.update(changes)
    return x


BAD_CASES = [
    ({"q": np.zeros((1, 12, 2))}, {}, "^q:"),
    ({"k": np.zeros((1, 12, 2, 9))}, {}, "^k:"),
    ({"v": np.zeros((1, 11, 4, 4))}, {}, "^v:"),
    (
        {"v": np.zeros((1, 12, 3, 4)), "g": np.zeros((1, 12, 3, 8))},
        {},
        "^v: value heads HV=3",
    ),
    ({"g": np.zeros((1, 12, 4, 4))}, {}, "^g:"),
    ({"beta": np.zeros((1, 12, 2))}, {}, "^beta:"),
    ({"initial_state": np.zeros((1, 4, 4, 8))}, {}, "^initial_state:"),
    (
        {"initial_state": np.zeros((1, 4, 8, 4))},
        {"state_layout": "vk"},
        "^initial_state: .*V, K",
    ),
    ({}, {"state_layout": "kvk"}, "^state_layout:"),
    ({}, {"scale": float("nan")}, "^scale:"),
    (
        {"initial_state": None},
        {"cu_seqlens": np.array([1, 12])},
        "^cu_seqlens: must start at 0",
    ),
    (
        {"initial_state": None},
        {"cu_seqlens": np.array([0, 11])},
        "^cu_seqlens: must end at T=12",
    ),
    (
        {"initial_state": None},
        {"cu_seqlens": np.array([0, 8, 5, 12])},
        "^cu_seqlens: must be non-decreasing",
    ),
    (
        {"initial_state": None},
        {"cu_seqlens": np.array([0.0, 12.0])},
        "^cu_seqlens: .*integer",
    ),
    ({"initial_state": None}, {"cu_seqlens": np.array([[0, 12]])}, "^cu_seqlens:"),
    (
        {"initial_state": np.zeros((1, 4, 8, 4))},
        {"cu_seqlens": [0, 5, 12]},
        "^initial_state: .*\\[N, HV",
    ),
]


@pytest.mark.parametrize("oracle", ORACLES.values(), ids=ORACLES.keys())
@pytest.mark.parametrize("changes,kwargs,match", BAD_CASES)
def test_bad_inputs_rejected(oracle, changes, kwargs, match):
    x = _bad(**changes)
    with pytest.raises(ValueError, match=match):
        oracle(**x, **kwargs)


def test_varlen_requires_batch_one():
    x = make_inputs(B=2, T=12, seed=82)
    for oracle in ORACLES.values():
        with pytest.raises(ValueError, match="^cu_seqlens: .*B == 1, got B=2"):
            oracle(**x, cu_seqlens=[0, 5, 12])


@pytest.mark.parametrize("chunk", [0, -16, 2.5, True])
def test_bad_chunk_rejected(chunk):
    with pytest.raises(ValueError, match="^chunk:"):
        tile_oracle(**_bad(), chunk=chunk)


# ------------------------------------------------------------------------------------------------
# Reference input preparation and the error metric
# ------------------------------------------------------------------------------------------------


def test_gate_sigmoid_bound_formula():
    rng = np.random.default_rng(91)
    HV, K = 3, 4
    g_raw = rng.normal(size=(2, 5, HV, K))
    A_log = rng.normal(size=HV)
    dt_bias = rng.normal(size=HV * K)
    got = gate_sigmoid_bound(g_raw, A_log, dt_bias, lower_bound=-3.0)
    for h in range(HV):
        for d in range(K):
            z = math.exp(A_log[h]) * (g_raw[..., h, d] + dt_bias[h * K + d])
            np.testing.assert_allclose(got[..., h, d], -3.0 / (1.0 + np.exp(-z)), rtol=1e-14)
    # Without A_log / dt_bias: plain lower_bound * sigmoid(g_raw); sigmoid(0) = 1/2.
    assert gate_sigmoid_bound(np.zeros((1, 1))).item() == -2.5
    big = gate_sigmoid_bound(np.array([[-1e4, 1e4]]))
    np.testing.assert_array_equal(big, [[-0.0, -5.0]])


def test_gate_softplus_formula_and_stability():
    HV, K = 2, 3
    A_log = np.array([0.0, math.log(2.0)])
    dt_bias = np.arange(HV * K, dtype=float) / 10
    g_raw = np.array([[[-800.0, 0.0, 1.0], [0.5, 800.0, -2.0]]])
    got = gate_softplus(g_raw, A_log, dt_bias)
    x = g_raw + dt_bias.reshape(HV, K)
    factor = np.array([[1.0], [2.0]])
    expect = -factor * np.where(x > 30, x, np.log1p(np.exp(np.minimum(x, 30))))
    assert np.all(np.isfinite(got)) and np.all(got <= 0)
    np.testing.assert_allclose(got, expect, rtol=1e-14, atol=1e-300)
    with pytest.raises(ValueError, match="dt_bias"):
        gate_softplus(g_raw, A_log, np.zeros(5))
    with pytest.raises(ValueError, match="A_log"):
        gate_softplus(g_raw, np.zeros(3), dt_bias)


def test_l2norm_and_sigmoid():
    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    y = l2norm(x)
    np.testing.assert_allclose(y[0], x[0] / math.sqrt(25 + 1e-6), rtol=1e-15)
    np.testing.assert_array_equal(y[1], [0.0, 0.0])  # eps keeps zero rows finite
    np.testing.assert_allclose(l2norm(x[:1], eps=0.0)[0], [0.6, 0.8], rtol=1e-15)
    s = sigmoid(np.array([-1000.0, -1.0, 0.0, 2.0, 1000.0]))
    np.testing.assert_allclose(s, [0.0, 1 / (1 + math.e), 0.5, 1 / (1 + math.exp(-2)), 1.0])
    assert np.all(np.isfinite(s))


def test_relative_rms():
    ref = np.array([3.0, 4.0])
    assert relative_rms(ref, ref) == 0.0
    assert relative_rms(np.array([3.0, 4.5]), ref) == pytest.approx(0.1, rel=1e-14)
    assert relative_rms(np.array([np.nan, 4.0]), ref) == math.inf
    assert relative_rms(ref, np.array([np.inf, 4.0])) == math.inf
    assert relative_rms(np.zeros(2), np.zeros(2)) == 0.0
    assert relative_rms(np.ones(2), np.zeros(2)) == math.inf
    with pytest.raises(ValueError, match="shape"):
        relative_rms(np.zeros(3), ref)
