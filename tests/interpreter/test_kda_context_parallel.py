"""Context parallel KDA prefill on the interpreter lane: 2-4 processes (gloo), each running the
interpreter kernels on its slice, against the single-process result and the float64 oracles.

Slices cut sequences mid-chunk, may be empty, and the rank counts divide no chunk count; ranks
may even run different specs (chunks are local to a slice). All cases of one world size run in
one spawn (a module fixture), since starting the processes costs more than the kernels.

The checks are functions of the case's family (``Case.family``, ``cp_cases.entries``):
``test_gdn_context_parallel`` runs them on GDN's entries.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from cp_cases import FP32, Case, assemble, cp_options, entries, inputs, pinned, spawn
from test_kda_numerics import TOL, assert_close, assert_equal, check_vs_oracles

from kreg.families.kda import api
from kreg.families.kda.context_parallel import plan_cp, prepare_cp, run_cp
from kreg.families.kda.oracles import gate_softplus, l2norm, relative_rms, sigmoid
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

VARLEN = (0, 30, 30, 71, 100)  # an empty sequence, and 41 and 29 tokens: chunk-unaligned
TWO = [
    # a slice boundary 15 tokens into a sequence; the dispatcher's specs; run twice
    Case("varlen-cut", (0, 45, 100), VARLEN, repeat=True),
    # [V, K] bf16 initial states, fp32 operands; rank 0 scans in segments of one chunk of 16
    # (its map composes 2 segments), rank 1 in chunks of 32 without segments
    Case(
        "varlen-vk-mixed-specs",
        (0, 61, 100),
        VARLEN,
        dtype=FP32,
        h0=torch.bfloat16,
        layout="vk",
        specs=((16, 1), (32, 0)),
        HV=2,
        seed=3,
    ),  # fmt: skip
    # a fixed batch: every row cut at 37 (its maps all sent), segments of 64 chunks for the map
    Case("fixed-b2", (0, 37, 70), B=2, dtype=FP32, specs=((16, 0), (16, 0)), seed=4),
    # every token on one rank: the result is the single-process one bit for bit
    Case("varlen-rank1-empty", (0, 100, 100), VARLEN, specs=((16, 0), (16, 0)), seed=5),
    Case("fixed-rank0-empty", (0, 0, 64), h0=None, specs=((16, 2), (16, 2)), seed=6),
    # head dims the kernels lack (run at 32 on zero-padded copies, the outputs and the final
    # states cut back to K = 24, V = 20), [V, K] initial states, a sequence cut between ranks
    Case(
        "varlen-vk-odd-dims",
        (0, 52, 100),
        VARLEN,
        dtype=FP32,
        h0=torch.bfloat16,
        layout="vk",
        K=24,
        V=20,
        HV=2,
        seed=11,
    ),  # fmt: skip
]
THREE = [
    # one sequence over all three ranks (a chain of two maps), none a whole number of chunks
    Case(
        "varlen-three-ranks",
        (0, 40, 77, 125),
        (0, 5, 125),
        specs=((16, 2),) * 3,
        seed=7,
        repeat=True,
    ),  # fmt: skip
    # an empty middle rank (no map of its own) in a fixed batch
    Case(
        "fixed-empty-middle", (0, 50, 50, 90), h0=None, dtype=FP32, specs=((16, 0),) * 3, seed=8
    ),  # fmt: skip
    # empty sequences on slice boundaries (owned by the rank holding the token before them)
    # and an empty rank; softplus gates with l2-normalised q, k and sigmoid beta
    Case(
        "varlen-empty-seqs-softplus",
        (0, 40, 40, 90),
        (0, 40, 40, 40, 90, 90),
        seed=9,
        options=(
            ("gate_activation", "softplus"),
            ("use_qk_l2norm", True),
            ("use_beta_sigmoid", True),
        ),
    ),  # fmt: skip
]
FOUR = [
    Case(
        "varlen-four-ranks", (0, 23, 80, 81, 130), (0, 10, 70, 130), specs=((16, 2),) * 4, seed=10
    ),  # fmt: skip
]
ALL = TWO + THREE + FOUR


def results_fixture(cases: list[Case]):
    """A module fixture: per world size, one spawn of every case of that size among ``cases``
    (computed when first needed)."""

    @pytest.fixture(scope="module")
    def results(tmp_path_factory):
        done: dict[str, list] = {}

        def get(case: Case):
            if case.name not in done:
                group = [c for c in cases if c.world == case.world]
                done.update(spawn(group, tmp_path_factory.mktemp(f"cp{case.world}")))
            return done[case.name]

        return get

    return results


results = results_fixture(ALL)


def single(case: Case):
    """The single-process prefill of the whole batch (rank 0's pinned spec, if any)."""
    x, kw = inputs(case)
    opts = {**api.PREFILL_DEFAULTS, **x, **kw}
    problem, call = api._prepare(**{n: opts[n] for n in _PREPARE},
                                 gate=entries(case.family).gate)  # fmt: skip
    spec = None if case.specs is None else case.specs[0] or case.specs[-1]
    return api.run_selection(pinned(problem, spec, case.family), call, problem)


_PREPARE = ("q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
            "gate_lower_bound", "cu_seqlens", "cu_seqlens_cpu", "A_log", "dt_bias",
            "gate_activation", "use_qk_l2norm", "use_beta_sigmoid", "state_layout",
            "output_chunk_states", "max_seqlen")  # fmt: skip
# keywords that describe the whole batch, not the options every slice of it takes alike
_WHOLE_BATCH = ("initial_state", "cu_seqlens", "output_final_state", "state_layout")


def activated(x: dict, kw: dict) -> dict:
    """Float64 inputs with ``kw``'s activations applied on the host and a scalar gate broadcast
    over K: what the oracles take."""
    act = kw.get("gate_activation", "none")
    assert act in ("none", "softplus"), act
    y = {n: t.double() for n, t in x.items()}
    K = x["q"].shape[-1]
    g = x["g"] if x["g"].dim() == 4 else x["g"][..., None]  # a scalar gate: one channel
    if act == "softplus":
        y["g"] = torch.from_numpy(gate_softplus(g, kw.get("A_log"), kw.get("dt_bias")))
    else:
        y["g"] = g.double()
    y["g"] = y["g"].expand(*g.shape[:-1], K)
    if kw.get("use_qk_l2norm"):
        y["q"], y["k"] = (torch.from_numpy(l2norm(x[n])) for n in ("q", "k"))
    if kw.get("use_beta_sigmoid"):
        y["beta"] = torch.from_numpy(sigmoid(x["beta"]))
    return y


def check_vs_single_process_and_oracles(case: Case, per_rank):
    """The assembled outputs and final states against the single process (bit for bit where
    one rank holds every token) and the float64 oracles; where a slice cuts a sequence, the
    carried states must matter."""
    o, ht = assemble(case, per_rank)
    assert not torch.isnan(ht).any(), "a sequence's final state came from no rank"
    ref_o, ref_ht = single(case)
    tol = TOL[case.dtype]
    if case.one_rank:
        assert_equal(o, ref_o, "o")
        assert_equal(ht, ref_ht, "final state")
    assert_close(o, (ref_o,), tol, "o vs single process")
    assert_close(ht, (ref_ht,), tol, "final state vs single process")
    x, kw = inputs(case)
    check_vs_oracles(activated(x, kw), o, ht, chunk=16, tol=tol,
                     initial_state=kw.get("initial_state"), cu_seqlens=case.cu,
                     state_layout=case.layout)  # fmt: skip
    if not case.cuts:
        return  # no state is carried
    # the states carried between ranks matter: without them the outputs are far off
    assert relative_rms(o, ref_o) < 0.1 * _carry_free_error(case, ref_o)


def _carry_free_error(case, ref_o) -> float:
    """The error of slices that each start from the initial state (no carried state)."""
    x, kw = inputs(case)
    prefill = entries(case.family).prefill
    options = {n: value for n, value in kw.items() if n not in _WHOLE_BATCH}
    parts = []
    for a, b in zip(case.offsets, case.offsets[1:], strict=False):
        if a == b:
            continue
        part = {n: t[:, a:b].contiguous() for n, t in x.items()}
        if case.cu is None:
            h0 = kw.get("initial_state")
            o, _ = prefill(**part, **options, initial_state=h0, state_layout=case.layout)
        else:
            cut = sorted({0, b - a, *(min(max(c - a, 0), b - a) for c in case.cu)})
            o, _ = prefill(**part, **options, cu_seqlens=torch.tensor(cut))
        parts.append(o)
    err = relative_rms(torch.cat(parts, 1), ref_o)
    assert math.isfinite(err)
    return err


def check_bitwise_stable(case: Case, per_rank):
    o1, ht1 = assemble(case, per_rank, run=0)
    o2, ht2 = assemble(case, per_rank, run=1)
    assert_equal(o1, o2, "o, second run")
    assert_equal(ht1, ht2, "final state, second run")


def _slow(case):
    return pytest.param(case, id=case.name, marks=[pytest.mark.slow] if case.world == 4 else [])


@pytest.mark.parametrize("case", [_slow(c) for c in ALL])
def test_context_parallel_equals_single_process_and_oracles(case, results):
    check_vs_single_process_and_oracles(case, results(case))


@pytest.mark.parametrize("case", [c for c in ALL if c.repeat], ids=lambda c: c.name)
def test_context_parallel_is_bitwise_stable_run_to_run(case, results):
    check_bitwise_stable(case, results(case))


# --- one process: a world of one rank, and the arguments' checks ----------------------------


@pytest.fixture(scope="module")
def world1(tmp_path_factory):
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("cp1") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def check_one_rank_is_the_single_process(group, family: str):
    e = entries(family)
    case = Case("one", (0, 100), VARLEN, family=family)
    x, kw = inputs(case)
    o, ht = e.prefill_cp(**x, **kw, group=group)
    ref_o, ref_ht = e.prefill(**x, **kw)
    assert_equal(o, ref_o, "o")
    assert_equal(ht, ref_ht, "final state")


def test_one_rank_is_kda_prefill_bit_for_bit(world1):
    check_one_rank_is_the_single_process(world1, "kda")


def refusals(family: str) -> list:
    """(change, the argument its error names) for ``check_refused_by_name``."""
    return [
        (dict(cp_offsets=(0, 99)), "cp_offsets"),
        (dict(cp_offsets=(0, 50, 100)), "cp_offsets"),
        (dict(cp_offsets=(1, 100)), "cp_offsets"),
        (dict(cp_offsets=torch.tensor([0.0, 100.0])), "cp_offsets"),
        (dict(algorithm=f"{family}.fused"), "algorithm"),
        (dict(output_chunk_states=True), "output_chunk_states"),
        (dict(initial_state_indices=torch.zeros(3, dtype=torch.int64)), "initial_state_indices"),
        (dict(cu_seqlens=torch.tensor([0, 30, 30, 71, 90])), "cu_seqlens"),
        (dict(max_seqlen=10), "max_seqlen"),
        (dict(initial_state=torch.zeros(3, 1, 32, 32)), "initial_state"),
        (dict(group="world"), "group"),
    ]


def check_refused_by_name(group, family: str, change: dict, name: str):
    case = Case("bad", (0, 100), VARLEN, family=family)
    x, kw = inputs(case)
    kw = {**kw, "group": group, **change}
    with pytest.raises(ValueError, match=f"^{name}: "):
        entries(family).prefill_cp(**x, **kw)


@pytest.mark.parametrize("change,name", refusals("kda"))
def test_bad_arguments_are_refused_by_name(world1, change, name):
    check_refused_by_name(world1, "kda", change, name)


def check_the_other_gate_kind_is_refused(group, family: str):
    """g of the other family's gate kind is refused by name, as the single-process entry does."""
    e = entries(family)
    x, kw = inputs(Case("gate", (0, 40), (0, 40), family=family))
    g = x["g"]
    other = g[..., 0] if g.dim() == 4 else g[..., None].expand(*g.shape, x["q"].shape[-1])
    x = {**x, "g": other.contiguous()}
    for call in (e.prefill, functools.partial(e.prefill_cp, group=group)):
        with pytest.raises(ValueError, match="^g: "):
            call(**x, **kw)


def test_a_scalar_gate_is_refused_by_name(world1):
    check_the_other_gate_kind_is_refused(world1, "kda")


def check_an_empty_slice_is_validated_as_any_slice(group, family: str):
    """T = 0 is a slice like any other: the other dimensions and dtypes are still checked."""
    x, kw = inputs(Case("e", (0, 10), (0, 10), family=family))
    empty = {n: t[:, :0] for n, t in x.items()}
    opts = {**cp_options(kw), "group": group, "cp_offsets": (0, 0), "entry": entries(family).cp}
    with pytest.raises(ValueError, match="^k: "):
        prepare_cp(**{**empty, "k": empty["k"].to(FP32)}, **opts)
    with pytest.raises(ValueError, match="^v: "):
        prepare_cp(**{**empty, "v": x["v"]}, **opts)


def test_an_empty_slice_is_validated_as_any_slice(world1):
    check_an_empty_slice_is_validated_as_any_slice(world1, "kda")


def check_run_cp_takes_pinned_selections(group, family: str):
    """``prepare_cp`` + ``run_cp`` (what the cases use to pin specs) is the entry's call."""
    e = entries(family)
    x, kw = inputs(Case("pin", (0, 64), None, h0=None, family=family))
    cp = prepare_cp(**x, **cp_options(kw), group=group, cp_offsets=None, entry=e.cp)
    o, ht = run_cp(cp, pinned(cp.problem, None, family))
    ref_o, ref_ht = e.prefill_cp(**x, **kw, group=group)
    assert_equal(o, ref_o, "o")
    assert_equal(ht, ref_ht, "final state")
    assert plan_cp((0, 64), 0, batch=1).owned_seqs == (0,)


def test_run_cp_takes_pinned_selections(world1):
    check_run_cp_takes_pinned_selections(world1, "kda")
