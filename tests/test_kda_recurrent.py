"""``kda.recurrent`` on CPU: its rules per target, the AOT build, and the dispatcher's choice
between it and the chunked form (a comparison of estimated costs, not a length constant)."""

from __future__ import annotations

import attrs
import pytest

from kreg.dispatch import select
from kreg.families.kda import recurrent
from kreg.families.kda.recurrent import (
    TRUSTED_MAX_TOKENS,
    KdaRecurrentSpec,
    is_valid_recurrent_spec,
)
from kreg.problems import LinearAttentionProblem
from kreg.registry import get_registry

TARGETS = ("sm90", "gfx950", "gfx942")


def target(name):
    return get_registry().targets[name]


def problem(T=1, N=8, H=16, d=128, **kw):
    return LinearAttentionProblem(batch=N, seq_len=T, heads_qk=H, heads_v=H, head_dim_k=d,
                                  head_dim_v=d, **kw)  # fmt: skip


@pytest.mark.parametrize("name", TARGETS)
def test_every_head_dim_has_valid_specs_and_the_rules_bind(name):
    t = target(name)
    specs = recurrent.enumerate_recurrent_specs(t)
    for d in (32, 64, 128, 256):
        assert any(s.head_dim_k == d and is_valid_recurrent_spec(s, t).ok for s in specs), d
    big = KdaRecurrentSpec(256, 256, block_v=128, num_warps=1)
    assert any("would spill" in r for r in is_valid_recurrent_spec(big, t).reasons)
    odd = KdaRecurrentSpec(block_v=48)
    assert any("block_v=48" in r for r in is_valid_recurrent_spec(odd, t).reasons)


@pytest.mark.parametrize("name", TARGETS)
def test_the_build_compiles_for_every_target(name):
    spec = KdaRecurrentSpec(32, 32, block_v=16, num_warps=1, num_stages=1, state_pool=True,
                            initial_state=True, output_final_state=True, varlen=True)  # fmt: skip
    art = recurrent.build_kda_recurrent(spec, target(name))
    assert art.kernel == "kda_recurrent_kernel"
    head = next(line for line in art.stages["ttir"].splitlines() if "tt.func public" in line)
    assert "%state_idx" in head and "%cu_seqlens" in head and "%ht" not in head
    plain = recurrent.build_kda_recurrent(attrs.evolve(spec, state_pool=False, varlen=False,
                                                       initial_state=False), target(name))  # fmt: skip
    head = next(line for line in plain.stages["ttir"].splitlines() if "tt.func public" in line)
    assert "%state_idx" not in head and "%h0" not in head and "%ht" in head


def test_decode_shapes_take_the_recurrence_prefill_the_chunked_form():
    t = "sm90"
    assert select(problem(T=1), t).candidate.name == "kda.recurrent"
    assert select(problem(T=4), t).candidate.name == "kda.recurrent"
    assert select(problem(T=2048, N=1), t).candidate.name == "kda.split"
    # the crossover is where the two estimates cross: one switch, both sides agree
    names = [select(problem(T=T, N=1, H=32), t).candidate.name for T in range(1, 129)]
    switch = names.index("kda.split")
    assert 4 <= switch <= TRUSTED_MAX_TOKENS and set(names[switch:]) == {"kda.split"}
    sel = select(problem(T=switch + 1, N=1, H=32), t)  # names[0] is T = 1
    [loser] = [e for e in sel.trace if e.stage == "ranked" and e.candidate == "kda.recurrent"]
    assert "estimated cost" in loser.reason


def test_no_prefill_shape_of_the_grid_takes_the_recurrence():
    """Past the decode lengths the recurrence's estimate is not trusted: every kda-grid shape
    (T >= 256, many heads, head dims 32-256, varlen mixes) goes to the chunked form."""
    from kreg.families.kda.bench import grid

    for shape in grid.shapes():
        for bounded in [pair == "bounded" for pair in grid.pairs(shape)]:  # its regime's
            sel = select(grid.problem_of(shape, bounded=bounded), "sm90")
            assert sel.candidate.name == "kda.split", (shape.name, bounded)


def test_pools_and_chunk_states_each_go_to_the_form_that_serves_them():
    """A pool is served by both forms (the chunked one gathers and scatters its slots), so the
    lengths decide as without one: decode to the recurrence, prefill to the chunked form; chunk
    states only by the chunked form."""
    kw = dict(N=1, initial_state=True, output_final_state=True, state_pool=True)
    sel = select(problem(T=1, **kw), "sm90")
    assert sel.candidate.name == "kda.recurrent" and sel.spec.state_pool
    sel = select(problem(T=4096, **kw), "sm90")
    assert sel.candidate.name == "kda.split"
    [rec] = [e for e in sel.trace if e.candidate == "kda.recurrent" and e.stage == "ranked"]
    assert "estimated cost inf" in rec.reason
    states = problem(T=1, output_chunk_states=True)
    assert select(states, "sm90").candidate.name == "kda.split"
    with pytest.raises(ValueError, match="state_pool needs initial_state"):
        problem(state_pool=True)


def test_decode_cost_model_picks_near_the_fastest_measured_spec():
    """On every shape of the committed H200 decode sweep (fit and holdout), the spec of lowest
    estimated cost runs within 5% of the fastest valid spec measured there."""
    import json
    from pathlib import Path

    from kreg.families.kda import recurrent as R
    from kreg.problems import LinearAttentionProblem

    target = get_registry().targets["sm90"]
    data = json.loads((Path(__file__).parents[1] / "docs/kda/decode/specs.json").read_text())
    assert len(data["shapes"]) >= 30
    for row in data["shapes"]:
        problem = LinearAttentionProblem(
            batch=row["N"], seq_len=row["T"], heads_qk=row["H"], heads_v=row["H"],
            head_dim_k=128, head_dim_v=128, initial_state=True, output_final_state=True,
        )  # fmt: skip
        times = {}
        for r in row["specs"]:
            spec = R.KdaRecurrentSpec(block_v=r["block_v"], num_warps=r["num_warps"],
                                      num_stages=r["num_stages"], initial_state=True,
                                      output_final_state=True)  # fmt: skip
            if R.is_valid_recurrent_spec(spec, target, problem).ok:
                times[spec] = r["ms"]
        pick = min(times, key=lambda s: R.recurrent_cost(s, problem, target))
        assert times[pick] <= 1.05 * min(times.values()), (row["N"], row["H"], row["T"], pick)
