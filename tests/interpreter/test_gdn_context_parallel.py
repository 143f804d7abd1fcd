"""Context parallel GDN prefill (``gdn_prefill_cp``) on the interpreter lane: KDA's context
parallel cases and checks (``test_kda_context_parallel``), run on GDN's entries with its scalar
gate ``[B, T, HV]``, against the single-process ``gdn_prefill`` and the float64 oracles (the
gate broadcast over K).

KDA's 2- and 3-rank cases as GDN's (varlen cuts mid-chunk and across an empty rank, empty
slices at the start, middle and end, a fixed batch, [V, K] bf16 initial states, mixed specs,
empty sequences on slice boundaries), the softplus ones with A_log and dt_bias ``[HV]``, and a
softplus case whose cut carries a mildly decaying state across an empty rank. The refusals are
KDA's, by name.
"""

from __future__ import annotations

import attrs
import pytest
import test_kda_context_parallel as kcp  # same folder: pytest puts it on sys.path
from cp_cases import Case

pytestmark = kcp.pytestmark  # TRITON_INTERPRET=1 only

SOFTPLUS = (("gate_activation", "softplus"), ("use_qk_l2norm", True), ("use_beta_sigmoid", True))


def as_gdn(case: Case) -> Case:
    return attrs.evolve(case, name=f"gdn-{case.name}", family="gdn",
                        gate_params=any(n == "gate_activation" for n, _ in case.options))  # fmt: skip


ALL = [as_gdn(c) for c in kcp.TWO + kcp.THREE] + [
    # a sequence cut at 40 across the empty rank 1 (its state carried from rank 0 to rank 2),
    # empty sequences at 0 and at the end; softplus with A_log, dt_bias [HV] of mild decays
    Case("gdn-softplus-cut", (0, 40, 40, 90), (0, 0, 25, 75, 90, 90), HV=2, family="gdn",
         gate_params=True, options=SOFTPLUS, seed=11),
]  # fmt: skip
assert all(c.world in (2, 3) for c in ALL)

results = kcp.results_fixture(ALL)
world1 = kcp.world1


@pytest.mark.parametrize("case", ALL, ids=lambda c: c.name)
def test_context_parallel_equals_single_process_and_oracles(case, results):
    kcp.check_vs_single_process_and_oracles(case, results(case))


@pytest.mark.parametrize("case", [c for c in ALL if c.repeat], ids=lambda c: c.name)
def test_context_parallel_is_bitwise_stable_run_to_run(case, results):
    kcp.check_bitwise_stable(case, results(case))


def test_one_rank_is_gdn_prefill_bit_for_bit(world1):
    kcp.check_one_rank_is_the_single_process(world1, "gdn")


@pytest.mark.parametrize("change,name", kcp.refusals("gdn"))
def test_bad_arguments_are_refused_by_name(world1, change, name):
    kcp.check_refused_by_name(world1, "gdn", change, name)


def test_a_per_channel_gate_is_refused_by_name(world1):
    kcp.check_the_other_gate_kind_is_refused(world1, "gdn")


def test_an_empty_slice_is_validated_as_any_slice(world1):
    kcp.check_an_empty_slice_is_validated_as_any_slice(world1, "gdn")


def test_run_cp_takes_pinned_selections(world1):
    kcp.check_run_cp_takes_pinned_selections(world1, "gdn")
