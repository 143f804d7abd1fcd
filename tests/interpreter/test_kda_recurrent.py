"""``kda.recurrent`` (the decode kernel) and state pools under the Triton interpreter.

Against the float64 token-serial oracle over the options; state pools (slots read and written in
place, negative slots, int32/int64 indices, the kernel's guard for slots the host did not check);
-inf and huge gates; non-finite containment bit for bit; decode of T tokens against the chunked
prefill and against T one-token steps; ``kreg.compat.fla.fused_recurrent_kda``'s mapping.
Small shapes (K, V <= 64, a few tokens): the interpreter runs on a 2-core CPU.
"""

from __future__ import annotations

import pytest
import test_kda_numerics as numerics  # same folder: pytest puts it on sys.path
import torch

from kreg.compat.fla import fused_recurrent_kda
from kreg.dispatch import select
from kreg.families.kda import api, launch
from kreg.families.kda.oracles import gate_sigmoid_bound, gate_softplus, token_serial_oracle
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

FP16, FP32 = numerics.FP16, numerics.FP32
TOL = numerics.TOL
REC = "kda.recurrent"
assert_equal, assert_close, activated = (
    numerics.assert_equal,
    numerics.assert_close,
    numerics._activated,
)


def make(B=2, T=3, H=1, HV=2, K=32, V=32, dtype=FP16, seed=0):
    return numerics.make(B=B, T=T, H=H, HV=HV, K=K, V=V, dtype=dtype, lb=-3.0, seed=seed)


def rec(x, **kw):
    """kda_prefill pinned to the recurrent candidate."""
    return api.kda_prefill(**x, algorithm=REC, **kw)


def check(x, o, ht=None, tol=None, **oracle_kw):
    so, sh = token_serial_oracle(**x, **oracle_kw)
    tol = tol or TOL[x["q"].dtype]
    assert_close(o, (so,), tol, "o")
    if ht is not None:
        assert_close(ht, (sh,), tol, "final state")


# --- against the oracle -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [FP16, FP32])
@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_matches_the_oracle_with_states_and_grouped_heads(dtype, layout):
    x = make(B=2, T=4, H=2, HV=4, K=32, V=64, dtype=dtype, seed=1)
    h0 = numerics.state(2, 4, 32, 64)
    if layout == "vk":
        h0 = h0.transpose(-1, -2).contiguous()
    o, ht = rec(x, initial_state=h0, output_final_state=True, state_layout=layout)
    check(x, o, ht, initial_state=h0, state_layout=layout)


def test_every_block_v_and_warp_count_agrees():
    """Every valid spec of the problem computes the same recurrence (V blocks are independent)."""
    x = make(T=3, K=32, V=64, dtype=FP32, seed=2)
    problem, call = api._prepare(**api_args(x, output_final_state=True))
    sel = select(problem, "sm90", algorithm=REC)
    ref = None
    for bv in (16, 32, 64):
        spec = sel.spec.__class__(**{**_fields(sel.spec), "block_v": bv})
        o, ht, _ = launch.run_recurrent(call, spec)
        check(x, o, ht)
        if ref is not None:
            assert_equal(o, ref, f"block_v={bv}")  # per column the same arithmetic
        ref = o


def _fields(spec):
    import attrs

    return attrs.asdict(spec)


def api_args(x, **kw):
    import inspect

    defaults = {n: p.default for n, p in inspect.signature(api.kda_prefill).parameters.items()
                if p.default is not inspect.Parameter.empty}  # fmt: skip
    opts = {**defaults, **x, **kw}
    return {n: opts[n] for n in inspect.signature(api._prepare).parameters if n in opts}


@pytest.mark.parametrize("dtype", [FP16, FP32])
def test_gate_activations_l2norm_and_beta_sigmoid(dtype):
    x = make(T=4, dtype=dtype, seed=3)
    gen = torch.Generator().manual_seed(4)
    x["g"] = torch.randn(x["g"].shape, generator=gen).to(dtype)  # raw gate input
    x["k"] = (3 * torch.randn(x["k"].shape, generator=gen)).to(dtype)  # not unit norm
    x["beta"] = (2 * torch.randn(x["beta"].shape, generator=gen)).to(dtype)  # logits
    A_log, dt_bias = numerics._gate_params(2, 32)
    common = dict(use_qk_l2norm=True, use_beta_sigmoid=True, output_final_state=True)
    o, ht = rec(x, gate_activation="softplus", A_log=A_log, dt_bias=dt_bias, **common)
    g = gate_softplus(x["g"], A_log, dt_bias)
    check(activated(x, g=g, l2=True, beta_sig=True), o, ht, tol=TOL[dtype])
    o, ht = rec(x, gate_activation="sigmoid_bound", gate_lower_bound=-5.0, **common)
    g = gate_sigmoid_bound(x["g"], lower_bound=-5.0)
    check(activated(x, g=g, l2=True, beta_sig=True), o, ht, tol=TOL[dtype])


def test_varlen_with_an_empty_sequence_and_bf16_initial_state():
    x = make(B=1, T=5, dtype=FP32, seed=5)
    cu = torch.tensor([0, 2, 2, 5])
    h0 = numerics.state(3, 2, 32, 32).bfloat16()
    o, ht = rec(x, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    check(x, o, ht, initial_state=h0.float(), cu_seqlens=cu)
    assert_equal(ht[1], h0[1].float(), "an empty sequence keeps its initial state")


# --- -inf and huge gates, containment -------------------------------------------------------------


def test_hard_resets_and_huge_gates_are_exact():
    x = make(T=6, dtype=FP32, seed=6)
    x["g"][0, 1] = float("-inf")  # a whole row
    x["g"][0, 3, :, ::2] = float("-inf")  # half a row
    x["g"][1, 2] = -1e30
    x["g"][1, 4, :, 1] = -1e5
    h0 = numerics.state(2, 2, 32, 32)
    o, ht = rec(x, initial_state=h0, output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    check(x, o, ht, initial_state=h0)


@pytest.mark.parametrize("name,value", [("k", "nan"), ("v", "nan"), ("g", "nan"), ("g", "inf"),
                                        ("beta", "nan"), ("k", "inf"), ("beta", "inf"), ("v", "inf"),
                                        ("k", "-inf"), ("v", "-inf")])  # fmt: skip
@numerics.NON_FINITE_EXPECTED
def test_non_finite_input_poisons_from_its_position(name, value):
    """Outputs before p bit for bit, NaN from p on (every V block, also where the bad value sits
    in another block's columns of v), final state NaN."""
    T, p = 5, 2
    x = make(T=T, V=64, dtype=FP32, seed=7)
    kw = dict(initial_state=numerics.state(2, 2, 32, 64), output_final_state=True)
    clean, _ = rec(x, **kw)
    bad = {n: t.clone() for n, t in x.items()}
    # value head 1 (column 40 of v: the second 32-column block); k's qk head feeds both
    where = {"k": (0, p, 0, 3), "v": (0, p, 1, 40), "g": (0, p, 1, 3), "beta": (0, p, 1)}[name]
    bad[name][where] = float(value)
    o, ht = rec(bad, **kw)
    assert_equal(o[0, :p], clean[0, :p], "before the bad token")
    assert_equal(o[1], clean[1], "another sequence")
    heads = [0, 1] if name == "k" else [1]
    assert o[0, p:, heads].isnan().all(), f"{name}={value}: a finite output from the token on"
    assert ht[0, heads].isnan().all(), f"{name}={value}: final state not NaN"
    if name != "k":
        assert_equal(o[0, :, 0], clean[0, :, 0], "the other value head")


def test_nan_query_reaches_only_its_row():
    x = make(T=4, dtype=FP32, seed=8)
    clean, hc = rec(x, output_final_state=True)
    x["q"][0, 2, 0, 5] = float("nan")
    o, ht = rec(x, output_final_state=True)
    assert o[0, 2].isnan().all()
    keep = [0, 1, 3]
    assert_equal(o[0, keep], clean[0, keep], "other rows")
    assert_equal(ht, hc, "final state")


# --- decode of T tokens against the chunked prefill and against T single steps ---------------


@pytest.mark.parametrize("dtype", [FP16, FP32])
def test_decode_of_t_tokens_equals_the_chunked_prefill(dtype):
    x = make(B=2, T=6, dtype=dtype, seed=9)
    h0 = numerics.state(2, 2, 32, 32)
    o, ht = rec(x, initial_state=h0, output_final_state=True)
    so, sh = api.kda_prefill(**x, initial_state=h0, output_final_state=True,
                             algorithm="kda.split")  # fmt: skip
    tol = 2 * TOL[dtype]
    assert numerics.relative_rms(o, so) <= tol and numerics.relative_rms(ht, sh) <= tol


def test_t_single_steps_on_a_pool_equal_one_call_of_t_tokens():
    """The pool between steps holds the fp32 state the kernel carried: bit for bit."""
    x = make(B=2, T=4, dtype=FP32, seed=10)
    pool = numerics.state(5, 2, 32, 32)
    idx = torch.tensor([4, 1])
    one = pool.clone()
    o_all, _ = rec(x, initial_state=one, initial_state_indices=idx)
    steps = pool.clone()
    outs = []
    for t in range(4):
        xt = {n: v[:, t : t + 1].contiguous() for n, v in x.items()}
        outs.append(rec(xt, initial_state=steps, initial_state_indices=idx)[0])
    assert_equal(torch.cat(outs, 1), o_all, "outputs")
    assert_equal(steps, one, "pool")


def test_the_dispatcher_picks_the_recurrence_for_decode_and_split_for_prefill():
    short = make(T=2)
    problem, _ = api._prepare(**api_args(short))
    assert select(problem, "sm90").candidate.name == REC
    long = make(T=300, B=1, seed=11)
    problem, _ = api._prepare(**api_args(long))
    assert select(problem, "sm90").candidate.name == "kda.split"


# --- state pools ----------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", [REC, "kda.split"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32, "int64-strided"])
@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_pool_slots_are_read_and_written_in_place(index_dtype, layout, algorithm):
    """The recurrent kernel reads and writes the slots itself; the chunked form gathers and
    scatters them around its kernels. Slots may be a strided view (a column of an engine's slot
    table): the kernel once read its raw memory, other sequences' slots."""
    x = make(B=1, T=5, dtype=FP32, seed=12)
    cu = torch.tensor([0, 1, 3, 3, 5])  # four sequences, one empty
    P = 7
    pool = numerics.state(P, 2, 32, 32, seed=13)
    if layout == "vk":
        pool = pool.transpose(-1, -2).contiguous()
    before = pool.clone()
    if index_dtype == "int64-strided":  # the other column holds slots of nobody here
        idx = torch.tensor([[5, 1], [-1, 3], [0, 4], [2, 6]])[:, 0]
        assert not idx.is_contiguous()
    else:
        idx = torch.tensor([5, -1, 0, 2], dtype=index_dtype)
    o, ret = api.kda_prefill(**x, initial_state=pool, initial_state_indices=idx, cu_seqlens=cu,
                             state_layout=layout, algorithm=algorithm)  # fmt: skip
    assert ret is pool, "the pool is returned, updated in place"
    starts = torch.stack([before[5], torch.zeros_like(before[0]), before[0], before[2]])
    so, sh = token_serial_oracle(**x, initial_state=starts, cu_seqlens=cu, state_layout=layout)
    assert_close(o, (so,), TOL[FP32], "o")
    for n, slot in ((0, 5), (3, 2)):
        assert_close(pool[slot], (sh[n],), TOL[FP32], f"slot {slot}")
    assert_equal(pool[0], before[0], "an empty sequence writes its slot back unchanged")
    for slot in (1, 3, 4, 6):  # untouched, and the -1 sequence wrote nothing
        assert_equal(pool[slot], before[slot], f"slot {slot} untouched")


@pytest.mark.parametrize("algorithm", [REC, "kda.split"])
def test_unchecked_slot_out_of_range_gives_nan_and_touches_nothing(algorithm):
    """Device indices alone are not read on the host: the recurrent kernel's guard, or the
    chunked form's gather and scatter (driven here through ``run_selection``, as a graph replay
    would reach them), make the outputs NaN and write nothing outside the slots given."""
    x = make(B=2, T=2, dtype=FP32, seed=14)
    pool = numerics.state(3, 2, 32, 32)
    before = pool.clone()
    problem, call = api._prepare(**api_args(x, initial_state=pool,
                                            initial_state_indices=torch.tensor([0, 1])))  # fmt: skip
    import attrs

    call = attrs.evolve(call, state_indices=torch.tensor([3, 1]))
    o, _ = api.run_selection(select(problem, "sm90", algorithm=algorithm), call, problem)
    assert o[0].isnan().all() and torch.isfinite(o[1]).all()
    assert_equal(pool[0], before[0], "slot 0")
    assert_equal(pool[2], before[2], "slot 2")
    assert torch.isfinite(pool[1]).all() and not torch.equal(pool[1], before[1]), "slot 1 written"


def test_a_pooled_prefill_is_the_plain_chunked_run_bit_for_bit():
    """Past the decode lengths the dispatcher serves a pool with the chunked form: outputs,
    chunk states and the slots written are bit for bit the run on the gathered states."""
    x = make(B=1, T=80, dtype=FP32, seed=15)
    cu = torch.tensor([0, 50, 50, 80])
    pool = numerics.state(6, 2, 32, 32, seed=16)
    before = pool.clone()
    idx = torch.tensor([4, 1, -1])
    kw = dict(cu_seqlens=cu, output_chunk_states=True)
    o, ret, hs = api.kda_prefill(**x, initial_state=pool, initial_state_indices=idx,
                                 algorithm="kda.split", **kw)  # fmt: skip
    assert ret is pool
    problem, _ = api._prepare(**api_args(x, initial_state=before, initial_state_indices=idx,
                                         cu_seqlens=cu))  # fmt: skip
    assert select(problem, "sm90").candidate.name == "kda.split"
    starts = torch.stack([before[4], before[1], torch.zeros_like(before[0])])
    po, ph, phs = api.kda_prefill(**x, initial_state=starts, output_final_state=True,
                                  algorithm="kda.split", **kw)  # fmt: skip
    assert_equal(o, po, "o")
    assert_equal(hs, phs, "chunk states")
    assert_equal(pool[4], ph[0], "slot 4")
    assert_equal(pool[1], ph[1], "slot 1 (an empty sequence: its state back unchanged)")
    for slot in (0, 2, 3, 5):
        assert_equal(pool[slot], before[slot], f"slot {slot} untouched")


@pytest.mark.parametrize("bad,fragment", [
    (torch.tensor([0, 3]), "slot 3 out of range for a pool of 3"),
    (torch.tensor([1, 1]), "slot 1 is given to more than one sequence"),
    (torch.tensor([0.0, 1.0]), "dtype must be torch.int64 or torch.int32"),
    (torch.tensor([0, 1, 2]), "expected a 1-d tensor [N] = (2,)"),
])  # fmt: skip
def test_bad_indices_are_refused_before_launch(bad, fragment):
    x = make(B=2, T=1, dtype=FP32)
    pool = numerics.state(3, 2, 32, 32)
    before = pool.clone()
    with pytest.raises(ValueError) as e:
        rec(x, initial_state=pool, initial_state_indices=bad)
    assert str(e.value).startswith("initial_state_indices: ") and fragment in str(e.value)
    assert_equal(pool, before, "nothing ran")


def test_repeated_negative_slots_are_fine_and_a_host_copy_is_checked():
    x = make(B=2, T=1, dtype=FP32)
    pool = numerics.state(3, 2, 32, 32)
    rec(x, initial_state=pool, initial_state_indices=torch.tensor([-1, -1]))
    with pytest.raises(ValueError, match="^initial_state_indices: slot 9 out of range"):
        rec(x, initial_state=pool, initial_state_indices=torch.tensor([0, 1]),
            initial_state_indices_cpu=torch.tensor([0, 9]))  # fmt: skip
    with pytest.raises(ValueError, match="^initial_state: the state pool"):
        rec(x, initial_state_indices=torch.tensor([0, 1]))
    # chunk states with a pool: the chunked form serves them (the recurrence has none)
    o, ret, hs = api.kda_prefill(**x, initial_state=pool, initial_state_indices=torch.tensor([0, 1]),
                                 output_chunk_states=True)  # fmt: skip
    assert ret is pool and hs.shape == (2, 2, 32, 32)
    with pytest.raises(ValueError, match="^initial_state_indices_cpu: given without"):
        rec(x, initial_state_indices_cpu=torch.tensor([0, 1]))


def test_a_pool_at_a_padded_head_dim_is_refused_not_copied():
    """K = V = 60 runs zero-padded to 64, on copies: a pool would not be updated in place."""
    x = numerics.make(B=2, T=1, K=60, V=60, dtype=FP32)
    pool = numerics.state(3, 1, 60, 60)
    before = pool.clone()
    with pytest.raises(ValueError, match=r"^initial_state_indices: a state pool needs kernel "
                                         r"head dims .*K=60, V=60"):  # fmt: skip
        rec(x, initial_state=pool, initial_state_indices=torch.tensor([0, 2]))
    assert_equal(pool, before, "nothing ran")


def test_a_pool_is_served_at_any_length():
    """The chunked kernels take no pools: the recurrence serves a long prefill too."""
    x = make(B=1, T=80, dtype=FP32, seed=15)
    pool = numerics.state(2, 2, 32, 32)
    h = pool[1].clone()
    o, _ = api.kda_prefill(**x, initial_state=pool, initial_state_indices=torch.tensor([1]))
    check(x, o, pool[1:], initial_state=h[None])


# --- kreg.compat.fla.fused_recurrent_kda ----------------------------------------------------------


def test_fused_recurrent_kda_maps_fla_arguments():
    x = make(T=3, dtype=FP32, seed=16)
    gen = torch.Generator().manual_seed(17)
    raw = torch.randn(x["g"].shape, generator=gen)
    A_log, dt_bias = numerics._gate_params(2, 32)
    h0 = numerics.state(2, 2, 32, 32).transpose(-1, -2).contiguous()
    args = [x["q"], x["k"], x["v"], raw, x["beta"]]
    o, ht = fused_recurrent_kda(*args, A_log, dt_bias, None, h0, True, True, True, True,
                                state_v_first=True)  # fmt: skip
    ro, rh = api.kda_prefill(*args, initial_state=h0, output_final_state=True,
                             gate_activation="softplus", A_log=A_log, dt_bias=dt_bias,
                             use_qk_l2norm=True, use_beta_sigmoid=True, state_layout="vk")  # fmt: skip
    assert_equal(o, ro, "o")
    assert_equal(ht, rh, "state")
    # sigmoid bound without A_log (factor 1, as fla); gates off: A_log, dt_bias ignored
    o, ht = fused_recurrent_kda(*args, use_gate_in_kernel=True, lower_bound=-4.0)
    assert ht is None
    assert_equal(o, api.kda_prefill(*args, gate_activation="sigmoid_bound",
                                    gate_lower_bound=-4.0)[0], "sigmoid_bound")  # fmt: skip
    o, _ = fused_recurrent_kda(*x.values(), A_log=A_log, dt_bias=dt_bias, lower_bound=-1.0)
    assert_equal(o, api.kda_prefill(*x.values())[0], "gates off")
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        o, _ = fused_recurrent_kda(*x.values(), initial_state=h0, transpose_state_layout=True)
    assert_equal(o, api.kda_prefill(*x.values(), initial_state=h0, state_layout="vk")[0], "vk")


@pytest.mark.parametrize("name", ["initial_state_indices", "ssm_state_indices"])
def test_fused_recurrent_kda_serves_pools_under_both_names(name):
    x = make(B=1, T=3, dtype=FP32, seed=18)
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    pool = numerics.state(4, 2, 32, 32)
    ref_pool = pool.clone()
    idx = torch.tensor([3, 0], dtype=torch.int32)
    o, ret = fused_recurrent_kda(*x.values(), initial_state=pool, cu_seqlens=cu, **{name: idx})
    ro, _ = api.kda_prefill(*x.values(), initial_state=ref_pool, cu_seqlens=cu,
                            initial_state_indices=idx)  # fmt: skip
    assert ret is pool
    assert_equal(o, ro, "o")
    assert_equal(pool, ref_pool, "pool")


@pytest.mark.parametrize("kwargs,name", [
    (dict(allow_neg_eigval=True, use_beta_sigmoid_in_kernel=True), "allow_neg_eigval"),
    (dict(use_gate_in_kernel=True), "A_log"),
    (dict(ssm_state_indices=torch.zeros(2, 2, dtype=torch.int64)), "ssm_state_indices"),
    (dict(initial_state_indices=torch.tensor([0, 1]), ssm_state_indices=torch.tensor([0, 1])),
     "ssm_state_indices"),
])  # fmt: skip
def test_fused_recurrent_kda_refuses_what_it_does_not_serve(kwargs, name):
    x = make(T=2, dtype=FP32)
    with pytest.raises(ValueError, match=f"^{name}: "):
        fused_recurrent_kda(*x.values(), **kwargs)
    headwise = torch.rand(*x["v"].shape)
    with pytest.raises(ValueError, match="^beta: per-column beta"):
        fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], headwise)
    with pytest.raises(TypeError, match="num_accepted_tokens"):
        fused_recurrent_kda(*x.values(), num_accepted_tokens=torch.ones(2))
