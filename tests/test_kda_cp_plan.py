"""``plan_cp``: which pieces of which sequences a rank holds, against a token-by-token count.

Host arithmetic only (the kernels run on the interpreter lane,
tests/interpreter/test_kda_context_parallel.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from kreg.families.kda.context_parallel import plan_cp


def _layouts(seed: int, n: int = 200):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        world = int(rng.integers(1, 6))
        lens = rng.integers(0, 40, size=int(rng.integers(1, 7)))
        lens[rng.random(lens.size) < 0.25] = 0  # empty sequences
        T = int(lens.sum())
        cu = np.concatenate([[0], np.cumsum(lens)])
        cuts = np.sort(rng.integers(0, T + 1, size=world - 1))
        yield tuple(int(x) for x in (0, *cuts, T)), tuple(int(x) for x in cu)


@pytest.mark.parametrize("seed", range(3))
def test_varlen_plans_against_token_counts(seed):
    for offsets, cu in _layouts(seed):
        world, N = len(offsets) - 1, len(cu) - 1
        plans = [plan_cp(offsets, r, cu_seqlens=cu) for r in range(world)]
        owners = [r for r, p in enumerate(plans) for _ in p.owned]
        owned = sorted(n for p in plans for n in p.owned_seqs)
        assert owned == list(range(N)), (offsets, cu)  # every sequence ends on exactly one rank
        assert len(owners) == N
        for r, plan in enumerate(plans):
            a, b = offsets[r], offsets[r + 1]
            lens = np.diff(plan.local_cu)
            assert plan.local_cu[0] == 0 and plan.local_cu[-1] == b - a
            for p, n in enumerate(plan.seqs):
                s, e = cu[n], cu[n + 1]
                held = max(0, min(e, b) - max(s, a))
                assert lens[p] == held  # the piece is the sequence's tokens in the slice
                assert held > 0 or (s == e and p in plan.owned)
                # earlier pieces: exactly the earlier ranks holding tokens of the sequence
                want = [q for q in range(r) if min(e, offsets[q + 1]) > max(s, offsets[q])]
                assert [q for q, _ in plan.preds[p]] == want
                assert (p in plan.open) == (held > 0 and e > b)
                assert (p in plan.owned) == (held > 0 and e <= b or held == 0)
            # every sequence with tokens in the slice is a piece
            touching = [n for n in range(N) if min(cu[n + 1], b) > max(cu[n], a)]
            assert set(touching) <= set(plan.seqs)
            assert len(plan.open) <= plan.slots == 1


def test_fixed_batch_plan():
    offsets = (0, 5, 5, 12)
    plans = [plan_cp(offsets, r, batch=3) for r in range(3)]
    assert plans[0].open == (0, 1, 2) and plans[0].owned == () and plans[0].slots == 3
    assert plans[1].seqs == () and plans[1].owned == ()  # an empty slice holds no row
    assert plans[2].preds == (((0, 0),), ((0, 1),), ((0, 2),)) and plans[2].owned_seqs == (0, 1, 2)


def test_empty_sequence_at_zero_belongs_to_rank_0():
    plans = [plan_cp((0, 0, 10), r, cu_seqlens=(0, 0, 10)) for r in range(2)]
    assert plans[0].seqs == (0,) and plans[0].owned == (0,) and plans[0].local_cu == (0, 0)
    assert plans[1].seqs == (1,) and plans[1].preds == ((),)


# --- its arguments: kda_prefill's, bound by its signature ----------------------------------------


@pytest.mark.parametrize("family", ["kda", "gdn"])
def test_the_cp_entries_take_the_prefill_keywords_and_their_own(family):
    import importlib
    import inspect

    from kreg.families.kda import api

    entry = getattr(importlib.import_module(f"kreg.families.{family}"), f"{family}_prefill_cp")
    got = inspect.signature(entry).parameters
    ref = api.PREFILL_SIGNATURE.parameters
    assert [n for n in got if n not in ("group", "cp_offsets")] == list(ref)
    assert all(got[n] == p for n, p in ref.items())


SLOTS = "one int64 slot"  # made in the test: no tensor at collection time


@pytest.mark.parametrize("family", ["kda", "gdn"])
@pytest.mark.parametrize(
    "name, value",
    [("output_chunk_states", True), ("chunk_states_size", 128), ("initial_state_indices", SLOTS),
     ("initial_state_indices_cpu", SLOTS), ("chunk_states_dtype", "bfloat16")],
)  # fmt: skip
def test_what_context_parallel_does_not_serve_is_refused_by_name(name, value, family):
    """Refused before the process group is looked at (none exists here), for either family's
    entry (GDN's g: ``[B, T, HV]``)."""
    import torch

    from kreg.families.gdn.context_parallel import GDN
    from kreg.families.kda.context_parallel import KDA, prepare_cp

    entry = {"kda": KDA, "gdn": GDN}[family]
    g = torch.zeros(1, 4, 1, 16) if family == "kda" else torch.zeros(1, 4, 1)
    x = [torch.zeros(1, 4, 1, 16)] * 3 + [g, torch.zeros(1, 4, 1)]
    if value == SLOTS:
        value = torch.zeros(1, dtype=torch.int64)
    elif name == "chunk_states_dtype":
        value = getattr(torch, value)
    with pytest.raises(ValueError, match=f"^{name}: not served with context parallelism"):
        prepare_cp(*x, group=None, entry=entry, **{name: value})
    with pytest.raises(TypeError):
        prepare_cp(*x, group=None, entry=entry, no_such_option=1)
