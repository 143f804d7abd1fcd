"""SUPPORT_MATRIX.md: fresh, and its claims hold (claims versus reality)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kreg import golden, matrix
from kreg.dispatch import NoCandidateError, select
from kreg.families.kda.specs import padded_head_dim
from kreg.problems import LinearAttentionProblem

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reg(builtin_registry):
    return builtin_registry


@pytest.fixture(scope="module")
def rows(reg):
    return matrix.build(reg)


def test_support_matrix_is_fresh(reg):
    ok, message = matrix.check(reg, ROOT / matrix.MATRIX_FILE)
    assert ok, message


def test_check_detects_staleness(reg, tmp_path):
    path = tmp_path / "SUPPORT_MATRIX.md"
    matrix.write(reg, path)
    assert matrix.check(reg, path)[0]
    path.write_text(path.read_text().replace("| 16, 32, 48, 64 |", "| 16, 32, 48, 64, 96 |", 1))
    ok, message = matrix.check(reg, path)
    assert not ok and "run `kreg matrix --write`" in message
    env = {**os.environ, "KREG_PLUGINS": "none"}
    r = subprocess.run([sys.executable, "-m", "kreg", "matrix", "--check", "--file", str(path)],
                       capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert r.returncode == 1 and "run `kreg matrix --write`" in r.stderr
    path.unlink()
    assert "does not exist" in matrix.check(reg, path)[1]


def test_rows_cover_every_candidate_and_target(reg, rows):
    assert {(r.candidate, r.target) for r in rows} == {
        (c, t) for c in reg.candidates for t in reg.targets
    }
    text = matrix.render(reg, rows)
    for r in rows:
        target = reg.targets[r.target]
        # the interpreter lane runs the specs sm90's rules select, so only that row claims it
        if r.target == matrix.INTERPRETER_TARGET:
            assert r.verification.endswith(matrix.INTERPRETER)
        else:
            assert "never run" in r.verification and "interpreter-verified" not in r.verification
        if target.verification == "gpu":
            assert r.verification.startswith("GPU-verified")
        else:
            assert r.verification.startswith("compiled + golden-hashed (never executed here)")
        assert f"| {r.valid} / {r.rejected} |" in text
    fused = [r for r in rows if r.candidate == "kda.fused"]
    assert fused and all(r.opt_in for r in fused)
    assert reg.candidates["kda.fused"].opt_in_reason in text


def test_claimed_cells_validate(reg, rows):
    """Every claimed cell has a spec that is valid for a problem of that cell."""
    claimed = 0
    for r in rows:
        c, target = reg.candidates[r.candidate], reg.targets[r.target]
        for cell in r.cells:
            verdict = c.is_valid(cell.spec, target, cell.problem)
            assert verdict.ok, (r.candidate, r.target, cell, verdict.reasons)
            assert matrix.spec_value(cell.spec, "dtype") == cell.dtype == cell.problem.dtype
            # a claimed head dim runs at the kernel head dim it pads to
            assert matrix.spec_value(cell.spec, "head_dim_k") == padded_head_dim(cell.head_dim_k)
            assert matrix.spec_value(cell.spec, "chunk") == cell.chunk
            claimed += 1
        # the dispatcher agrees: it serves each claimed (dtype, head dim) with this candidate
        # pinned
        for cell in {(x.dtype, x.head_dim_k): x for x in r.cells}.values():
            sel = select(cell.problem, target, algorithm=r.candidate)
            assert sel.candidate.name == r.candidate
    assert claimed > 50


@pytest.mark.slow
def test_claimed_cells_compile(reg, rows):
    """One representative spec per candidate x target x head dim compiles (dtypes rotate across
    head dims so each claimed dtype compiles somewhere), within the target's shared memory."""
    jobs = []
    for r in rows:
        c = reg.candidates[r.candidate]
        dims = sorted({x.head_dim_k for x in r.cells})
        dtypes = list(dict.fromkeys(x.dtype for x in r.cells))
        for i, d in enumerate(dims):
            cells = [x for x in r.cells if x.head_dim_k == d]
            want = dtypes[i % len(dtypes)]
            pick = min(cells, key=lambda x: (x.dtype != want, x.chunk))  # small chunk: cheap
            key = f"{c.family}/matrix-{pick.dtype}-d{d}-c{pick.chunk}/{r.target}"
            jobs.append(golden.Job(key, c.name, pick.spec, r.target, tuple(c.builders)))
    assert len(jobs) >= 10
    plan = golden.Plan(tuple(jobs), {}, {}, ())
    entries = golden.compute(reg, plan, jobs=2, plugins="none",
                             progress=lambda m: print(m, file=sys.stderr))  # fmt: skip
    assert set(entries) <= set(plan.kernel_keys())
    assert {k.rsplit("/", 1)[0] for k in entries} == {job.key for job in jobs}
    for key, entry in entries.items():
        target = reg.targets[key.split("/")[2]]
        assert entry["shared_bytes"] <= target.shared_mem_per_block, key
        assert {"ttir", "ttgir", "llir"} <= set(entry), key


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"head_dim_k": 512, "head_dim_v": 512}, "head_dim_k=512 not in supported"),
        ({"dtype": "fp8"}, "dtype='fp8' not in"),
        ({"chunk": 128}, "chunk=128 not in"),
    ],
)
def test_unclaimed_cells_rejected_with_reason(reg, rows, fields, reason):
    for r in rows:
        claimed = {
            "head_dim_k": {x.head_dim_k for x in r.cells},
            "dtype": {x.dtype for x in r.cells},
            "chunk": {x.chunk for x in r.cells},
        }
        for name, value in fields.items():
            assert value not in claimed.get(name, set())
        c = reg.candidates[r.candidate]
        spec = next(iter(c.enumerate_specs(reg.targets[r.target])))
        if not all(matrix.spec_values(spec, name) for name in fields):
            continue  # a spec without the field (the recurrent form has no chunk)
        verdict = matrix.explain_cell(c, reg.targets[r.target], **fields)
        assert not verdict.ok
        assert any(reason in x for x in verdict.reasons), verdict.reasons


def test_unclaimed_problems_rejected_by_dispatch(reg):
    with pytest.raises(NoCandidateError, match="K=512, V=512: at most 256"):
        select(LinearAttentionProblem.from_options({"K": 512}), "sm90")
    # below 256 any head dim is served (padded)
    assert select(LinearAttentionProblem.from_options({"K": 48}), "sm90").spec.tile.head_dim_k == 64
    with pytest.raises(ValueError, match="dtype must be one of"):
        LinearAttentionProblem.from_options({"dtype": "fp8"})


def test_a_problem_type_brings_its_own_probe():
    """The matrix runs the probe a problem type declares beside its fields (``matrix_probe``):
    a new problem type with one is probed by it, one without gets rows without cells."""
    from kreg.problems.probe import Option, Probe

    probe = matrix.probe_of(LinearAttentionProblem)
    assert probe.dtypes == ("bf16", "fp16", "fp32") and 128 in probe.head_dims
    assert {o.label for o in probe.options} >= {"softplus", "varlen", "state pool (in place)"}

    class Elsewhere:
        @classmethod
        def matrix_probe(cls):
            return Probe(("fp8",), lambda family, dtype, d: None, (Option("x", "y", {}),), (8,))

    assert matrix.probe_of(Elsewhere).head_dims == (8,)
    assert matrix.probe_of(object) is None
