"""The KDA grid, its cost model and the held-out validation, on CPU with a synthetic sweep."""

from __future__ import annotations

import json
import math
import os
import random
import warnings
import zlib
from pathlib import Path

import attrs
import pytest

from kreg.dispatch import TuningWarning, clear_cache, select
from kreg.families.kda import builders, model
from kreg.families.kda.bench import gate_regimes, grid, scenario, sweep, validate
from kreg.registry import get_registry

SM90 = "sm90"


@pytest.fixture(scope="module")
def target():
    return get_registry().targets[SM90]


# --- the grid ---------------------------------------------------------------------------------


def test_grid_covers_the_axes_within_bounds():
    g = grid.shapes()
    s = grid.summary(g)
    assert s["shapes"] >= 80
    assert s["heads"] == [1, 2, 4, 8, 16, 32, 64] and s["ratios"] == [1, 2, 4]
    assert {32, 64, 128, 256} <= {k for k, _ in s["head_dims"]}
    assert sum(k != v for k, v in s["head_dims"]) >= 2
    assert s["B"] == (1, 64) and s["T"] == (256, 262144)
    assert set(s["kinds"]) == {"fixed", "uniform", "tailed", "one_long", "ones", "empty"}
    assert any(s.production and s.lengths for s in g) and any(s.production and not s.lengths
                                                              for s in g)  # fmt: skip
    assert {x.gate for x in g if not x.production} == {"bounded", "unbounded"}
    # every gate regime, each admitting the promise the sweep measures; the engines' head dims
    assert set(s["regimes"]) == set(gate_regimes.BY_NAME)
    for x in g:
        assert ("bounded" if x.gate == "bounded" else "default") in grid.pairs(x), x
        assert grid.params_of(x)["regime"] == x.regime
    assert {(96, 96), (192, 192), (256, 256)} <= set(s["head_dims"])
    assert {x.regime for x in g if x.production} == {"bounded", "softplus"}
    for x in g:
        assert x.work <= grid.WORK_MAX and x.T % 16 == 0, x
        if x.lengths:
            assert sum(x.lengths) == x.T and x.B == 1
    assert any(0 in x.lengths for x in g if x.kind == "empty")
    assert any(x.lengths.count(1) >= 100 for x in g if x.kind == "ones")
    names = [x.name for x in g]
    assert len(set(names)) == len(names)
    # the weak spots are in
    assert "b4-t8192-h32x32-d64x64" in names
    assert any(x.H == 8 and x.kind == "one_long" and 30000 <= max(x.lengths) < 30016
               and len(x.lengths) == 21 for x in g)  # fmt: skip


def test_grid_memory_bound():
    """Inputs and outputs, kreg's tiles (W, Q*G, (K*G')^T, U, Aqk in bf16, the decay in fp32) and
    fla's intermediates (counted as twice kreg's: docs/kda/RESULTS.md measured 2.1x at B=16
    T=8192 H=32) of every case stay within 20 GB."""
    worst = 0
    for x in grid.shapes():
        io = 2 * (2 * x.H * x.K + 2 * x.HV * x.V + x.HV * x.K + x.HV)
        tiles = x.HV * (2 * (3 * x.K + x.V + 64) + 4 * x.K)
        worst = max(worst, x.tokens * (io + 3 * tiles))
    assert worst < 20e9


def test_holdout_quarter_is_spread_and_fixed():
    g = grid.shapes()
    hold = [x for x in g if x.split == "holdout"]
    assert 0.2 <= len(hold) / len(g) <= 0.3
    assert len({(x.K, x.V) for x in hold}) >= 4 and len({x.H for x in hold}) >= 5
    assert {x.kind for x in hold} >= {"fixed"} and any(x.lengths for x in hold)
    assert any(x.gate == "bounded" for x in hold) and any(x.gate == "unbounded" for x in hold)
    grid.shapes.cache_clear()
    assert grid.shapes() == g  # deterministic


def test_compile_jobs_launch_every_kernel(target):
    plans = [sweep.plan_shape(s, target) for s in grid.shapes()[::3]]
    jobs = sweep.compile_jobs(plans)
    by_name = {p.shape.name: p for p in plans}
    launched, fla = set(), set()
    for case, labels in jobs:
        p = by_name[case.name]
        for label in labels:
            if label.startswith("fla"):
                fla.add(grid.fla_class(p.shape, safe_gate=label.endswith("safe_gate")))
                continue
            spec = {lab: s for lab, s, _ in p.specs}[label]
            launched |= builders.kernel_keys(p.problem, spec)
    need = {k for p in plans for _, s, _ in p.specs for k in builders.kernel_keys(p.problem, s)}
    assert launched == need
    assert fla == grid.fla_classes([p.shape for p in plans])
    assert all(len(labels) <= 4 for _, labels in jobs)


def test_kernel_keys_follow_the_jit_specialisation(target):
    base = grid.problem_of(grid.shapes()[0])
    spec = model.pool(base, target)[0][1]
    same = attrs.evolve(base, seq_len=base.seq_len * 2)  # still divisible by 16
    other = attrs.evolve(base, seq_len=base.seq_len + 1)
    assert builders.kernel_keys(base, spec) == builders.kernel_keys(same, spec)
    assert builders.kernel_keys(base, spec) != builders.kernel_keys(other, spec)


# --- roles --------------------------------------------------------------------------------------


def test_pool_resolves_valid_distinct_specs(target):
    from kreg.families.kda import specs

    for x in grid.shapes():
        p = grid.problem_of(x)
        pool = model.pool(p, target)
        assert 1 <= len(pool) <= len(model.ROLES)
        for role, spec in pool:
            assert specs.is_valid_split_spec(spec, target, p).ok
            assert model.workspace_ok(spec, p) and model.segments_pay(spec, p)
            r = model.ROLE_BY_NAME[role]
            assert (spec.tile.chunk, spec.scan.segment_chunks) == (r.chunk, r.segment_chunks)


def test_workspace_bound_excludes_many_sequence_segments(target):
    ones = next(x for x in grid.shapes() if x.kind == "ones" and x.HV >= 16)
    p = grid.problem_of(ones)
    valid = __import__("kreg.families.kda.specs", fromlist=["x"]).valid_split_specs(target, p)
    seg = [s for s in valid if s.scan.segment_chunks == 16 and s.tile.chunk == 16]
    assert seg and model.workspace_bytes(seg[0], p) > 1e9
    assert all(not s.scan.segment_chunks or model.workspace_ok(s, p)
               for _, s in model.pool(p, target))  # fmt: skip


def test_one_long_sequence_among_short_ones_keeps_segmented_roles(target):
    """The workspace counts each sequence's segments as the longest one has them (as the launch
    plans them): one 30,000-token sequence among 20 short ones at 8 heads then fits, where the
    packed length (21 sequences x 41,376 tokens' segments) priced segments out of the pool."""
    from kreg.families.kda.runtime_args import segment_count

    shape = next(x for x in grid.shapes() if x.kind == "one_long" and x.HV <= 8)
    p = grid.problem_of(shape)
    segmented = [s for _, s in model.pool(p, target) if s.scan.segment_chunks]
    assert segmented
    for s in segmented:
        n_seg = segment_count(p.longest_seq, s.tile.chunk, s.scan.segment_chunks)
        assert n_seg < segment_count(p.seq_len, s.tile.chunk, s.scan.segment_chunks)
        K, V = p.head_dim_k, p.head_dim_v
        assert model.workspace_bytes(s, p) == p.num_seqs * n_seg * p.heads_v * K * (K + 2 * V) * 4


# --- a synthetic sweep ----------------------------------------------------------------------------

SEG_ROLE, FLAT_ROLE = "c32.narrow.w2s2.seg64", "c16.wide.w4s3.seg0"


def planted_log2(role: str, f: dict) -> float:
    """A planted truth over a role's pair features: time grows with the scan's chain, so
    segments of 64 (a fixed cost of 1.15 log2) win past about 2^13 tokens, chunk 16 wide below;
    the other roles lose by a fixed margin of their own, wide enough that none ties the winner
    (a chunk-16 segmented role's chain is half of SEG_ROLE's: 0.6 log2 less). The truth lies in
    the model's class (role offsets plus shared coefficients), so a correct fitter must recover
    it; the margin is drawn from the role's name with crc32, not hash(), which varies with
    PYTHONHASHSEED."""
    base = -10 + 0.9 * f["X"] - 0.2 * f["P"] + 0.5 * f["k"]
    if role == SEG_ROLE:
        return base + 0.6 * f["chain"] + 1.15
    if role == FLAT_ROLE:
        return base + 0.6 * f["chain"]
    return base + 0.6 * f["chain"] + 2.2 + 0.1 * (zlib.crc32(role.encode()) % 5)


def synthetic_sweep(target, noise=0.02, seed=0, truth=planted_log2) -> dict:
    shapes = []
    for x in grid.shapes():
        plan = sweep.plan_shape(x, target)
        rows = []
        for label, spec, roles in plan.specs:
            f = model.features(plan.problem)
            if roles:
                f = model.pair_features(plan.problem, spec)
                # noise drawn per (shape, spec): the same data whatever other rows the plan
                # holds (the dispatcher's current choice depends on the packaged model)
                rng = random.Random(f"{seed}/{x.name}/{label}")
                ms = 2 ** (truth(roles[0], f) + rng.gauss(0, noise))
            else:
                ms = 2 ** (truth("other", f) + 0.5)  # the current choice, off the pool
            rows.append({"impl": label, "roles": list(roles), "ms": ms, "current":
                         label == plan.current, "spec": sweep.spec_fields(spec)})  # fmt: skip
        best = min(r["ms"] for r in rows)
        peer = "fla.safe_gate" if x.gate == "bounded" else "fla"
        shapes.append({"name": x.name, "params": grid.params_of(x), "current": plan.current,
                       "decided_by": plan.decided_by, "specs": rows,
                       "fla": {peer: {"ms": best * 1.3}}})  # fmt: skip
    key = {"target": SM90, "device": "synthetic", "date": "2026-12-04T00:00:00Z",
           "triton": __import__("triton").__version__, "torch": "x"}  # fmt: skip
    return {"kind": sweep.SWEEP_KIND, "version": sweep.SWEEP_VERSION, "key": key, "fla": "x",
            "complete": True, "shapes": shapes, "elapsed_s": 1.0}  # fmt: skip


@pytest.fixture(scope="module")
def synth(target):
    return synthetic_sweep(target)


def test_fitter_recovers_the_planted_best_role_on_holdout(synth):
    rows = validate.evaluate(synth, validate.fit_payload(synth))
    hold = [r for r in rows if r["split"] == "holdout"]
    regimes = set()
    for r in hold:
        f = model.features(validate.problem_of(next(e for e in synth["shapes"]
                                                    if e["name"] == r["name"])))  # fmt: skip
        if r["best"] is None:
            continue
        if abs(f["L"] - 13) > 1:  # away from the switch the planted best must be picked
            best_role = min(validate.role_times(next(e for e in synth["shapes"]
                                                     if e["name"] == r["name"])).items(),
                            key=lambda kv: kv[1])[0]  # fmt: skip
            assert r["ratio"] < 1.05, (r["name"], r["role"], best_role)
            regimes.add(r["role"])
    assert {SEG_ROLE, FLAT_ROLE} <= regimes  # both regimes occur among the holdout shapes
    st = validate.stats(rows)
    assert st["holdout"]["median"] <= 1.02 and st["goals"]["holdout_median"]


def test_holdout_shapes_never_reach_the_fit(synth):
    """Replacing every holdout measurement by garbage leaves the fitted model unchanged; fitting
    on all shapes (a leak) changes it."""
    poisoned = json.loads(json.dumps(synth))
    rng = random.Random(1)
    for e in poisoned["shapes"]:
        if e["params"]["split"] == "holdout":
            for r in e["specs"]:
                r["ms"] = rng.uniform(1e-3, 1e3)
    assert validate.fit_payload(poisoned) == validate.fit_payload(synth)
    leaked = model.fit(validate.samples(poisoned, "fit") + validate.samples(poisoned, "holdout"))
    assert leaked != validate.fit_payload(poisoned)
    names = {e["name"] for e in synth["shapes"] if e["params"]["split"] == "holdout"}
    assert len(validate.samples(synth, "fit")) == len(synth["shapes"]) - len(names)


def test_flagged_and_failed_specs_are_not_fitted(synth):
    e = json.loads(json.dumps(synth["shapes"][0]))
    e["specs"][0]["flagged"] = True
    e["specs"][1]["error"] = "boom"
    e["specs"][1].pop("ms")
    times = validate.spec_times(e)
    assert e["specs"][0]["impl"] not in times and e["specs"][1]["impl"] not in times


def test_render_writes_page_and_plot(synth, tmp_path):
    written = validate.render(synth, tmp_path)
    text = written["md"].read_text()
    assert "holdout: selected / best, median" in text and "| shape | split |" in text
    assert "png" in written and written["png"].stat().st_size > 1000


# --- the ranker seam --------------------------------------------------------------------------


@pytest.fixture
def model_file(tmp_path, monkeypatch, synth):
    def use(section):
        path = tmp_path / "kda_model.json"
        path.write_text(json.dumps(section))
        monkeypatch.setenv("KREG_MODELS", str(path))
        clear_cache()

    yield use
    monkeypatch.delenv("KREG_MODELS")
    clear_cache()


def _off_table(synth):
    """A holdout problem no tuning-table bucket covers."""
    for e in synth["shapes"]:
        if e["params"]["split"] == "holdout":
            p = validate.problem_of(e)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if not select(p, SM90).decided_by.startswith("tuning table"):
                    clear_cache()  # the caller's select() decides (and warns) afresh
                    return e, p
    raise AssertionError("every holdout shape hit the tuning table")


def test_dispatcher_runs_the_modelled_spec_and_says_so(synth, model_file, target):
    section = validate.fit_section(synth)
    model_file(section)
    e, p = _off_table(synth)
    sel = select(p, SM90)
    role, spec, ms = model.choose(section["model"], p, target)
    assert sel.spec == spec
    assert sel.decided_by.startswith("cost model kda_model.json")
    assert f"role {role}" in sel.decided_by and f"predicted {ms:.4g} ms" in sel.decided_by


def test_explain_names_the_model_entry(synth, model_file, capsys):
    from kreg.cli import main

    model_file(validate.fit_section(synth))
    e, p = _off_table(synth)
    opts = [f"B={p.batch}", f"T={p.seq_len}", f"H={p.heads_qk}", f"HV={p.heads_v}",
            f"K={p.head_dim_k}", f"V={p.head_dim_v}"]  # fmt: skip
    if p.varlen:
        opts += ["varlen=true", f"num_seqs={p.num_seqs}", f"max_seqlen={p.max_seqlen}"]
    if p.gate_lower_bound is not None:
        opts.append(f"lower_bound={p.gate_lower_bound}")
    if p.gate_activation != "none":
        opts += [f"gate_activation={p.gate_activation}", "qk_l2norm=true", "beta_sigmoid=true",
                 "initial_state=true"]  # fmt: skip
    opts.append("output_final_state=true")
    assert main(["explain", "kda", "--target", SM90, *opts, "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "cost model kda_model.json" in out and "predicted" in out and "role c" in out


def test_stale_model_falls_back_to_the_heuristic(synth, model_file):
    section = validate.fit_section(synth)
    section["header"]["triton"] = "0.0.1"
    model_file(section)
    e, p = _off_table(synth)
    with pytest.warns(TuningWarning, match="cost model kda_model.json ignored"):
        assert select(p, SM90).decided_by.startswith("heuristic cost")


def test_unknown_payload_predicts_nothing(synth, model_file):
    section = validate.fit_section(synth)
    section["model"]["feature_version"] = 999
    model_file(section)
    e, p = _off_table(synth)
    assert select(p, SM90).decided_by.startswith("heuristic cost")


def test_a_malformed_payload_is_ignored_with_a_warning(synth, model_file):
    """A role offset that is not a number (valid JSON) once raised TypeError out of select."""
    section = validate.fit_section(synth)
    for role in section["model"]["roles"].values():
        role["offset"] = "fast"
    model_file(section)
    e, p = _off_table(synth)
    with pytest.warns(TuningWarning, match="malformed"):
        assert select(p, SM90).decided_by.startswith("heuristic cost")


def test_prediction_is_the_offset_plus_raw_coefficients_dot_features(synth, target):
    payload = validate.fit_payload(synth)
    p = validate.problem_of(synth["shapes"][5])
    pool = model.pool(p, target)
    assert pool
    for role, spec in pool:
        f = model.pair_features(p, spec)
        assert list(f) == list(model.FEATURES)
        want = 2 ** (payload["roles"][role]["offset"]
                     + sum(c * f[n] for n, c in payload["coef"].items()))  # fmt: skip
        assert math.isclose(model.predict_ms(payload, role, f), want)


def test_ridge_is_chosen_by_cross_validation_on_the_fit_shapes_only(synth):
    """The payload's ridge is the CV winner over the fit samples alone: the CV counts are the
    fit shapes', poisoning the holdout leaves the choice and every CV figure unchanged, and a fit
    offered one ridge takes it."""
    payload = validate.fit_payload(synth)
    n_fit = len(validate.samples(synth, "fit"))
    assert set(payload["cv"]) == {str(a) for a in model.RIDGES}
    assert all(c["n"] == n_fit for c in payload["cv"].values())
    best = min(model.RIDGES, key=lambda a: (round(payload["cv"][str(a)]["geomean"], 6),
                                            payload["cv"][str(a)]["worst"]))  # fmt: skip
    assert payload["ridge"] == best
    poisoned = json.loads(json.dumps(synth))
    rng = random.Random(2)
    for e in poisoned["shapes"]:
        if e["params"]["split"] == "holdout":
            for r in e["specs"]:
                r["ms"] = rng.uniform(1e-3, 1e3)
    again = validate.fit_payload(poisoned)
    assert again["ridge"] == payload["ridge"] and again["cv"] == payload["cv"]
    assert model.fit(validate.samples(synth, "fit")[:30], ridges=(0.5,))["ridge"] == 0.5


def _kda_grid_script():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "kda_grid.py"
    spec = importlib.util.spec_from_file_location("kda_grid_script", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_sweep_too_small_to_fit_gives_a_model_that_predicts_nothing(synth, tmp_path, capsys):
    """The GPU smoke sweep (two shapes) measures no role on MIN_SHAPES shapes: the fit leaves
    every role out and says so (it crashed in _solve on the empty design), validation still
    evaluates every shape, and the CLI refuses to write such a model over the packaged one."""
    small = dict(synth, shapes=[e for e in synth["shapes"] if e["name"] in SMOKE])
    assert len(small["shapes"]) == 2
    payload = validate.fit_payload(small)
    assert payload["roles"] == {} and "no role measured on" in payload["unfitted"]
    assert model.payload_ok(payload)
    rows = validate.evaluate(small, payload)
    assert [r["name"] for r in rows] == list(SMOKE) and all(r["role"] is None for r in rows)
    sweep_file, out = tmp_path / "sweep.json", tmp_path / "model.json"
    sweep_file.write_text(json.dumps(small))
    assert _kda_grid_script().main(["fit", str(sweep_file), "--out", str(out)]) == 2
    assert not out.exists() and "left as it is" in capsys.readouterr().err


def test_role_features_follow_the_spec(target):
    """Segments shorten the chain and multiply the programs; a narrower V block adds V blocks."""
    p = validate.problem_of({"params": grid.params_of(grid.shape_named(
        "b1-t262144-h1x1-d128x128"))})  # fmt: skip
    feats = {role: model.role_features(p, spec) for role, spec in model.pool(p, target)}
    flat, seg = feats["c32.narrow.w2s3.seg0"], feats["c32.narrow.w2s2.seg64"]
    assert flat["chain"] == math.log2(262144) and seg["chain"] < flat["chain"] - 4
    assert seg["waves"] > flat["waves"] + 4
    assert feats["c16.narrow.w4s3.seg0"]["v_blocks"] == feats["c16.wide.w4s3.seg0"]["v_blocks"] + 1


def test_bench_compile_plan_covers_every_row(target):
    from kreg.families.kda.bench.scenario import KREG_BOUNDED, KREG_DEFAULT

    cases = grid.cases()
    jobs = scenario.bench_warm_jobs(cases, SM90)
    launched, fla = set(), set()
    for case, names in jobs:
        shape = grid.shape_named(case.name)
        for n in names:
            if n.startswith("fla"):
                fla.add(grid.fla_class(shape, safe_gate=n.endswith("safe_gate")))
            else:
                p = grid.problem_of(shape, bounded=n == KREG_BOUNDED)
                launched |= builders.kernel_keys(p, select(p, SM90).spec)
    need = set()
    for case in cases:
        shape = grid.shape_named(case.name)
        for name in [
            KREG_BOUNDED if pair == "bounded" else KREG_DEFAULT for pair in grid.pairs(shape)
        ]:
            p = grid.problem_of(shape, bounded=name == KREG_BOUNDED)
            need |= builders.kernel_keys(p, select(p, SM90).spec)
    assert launched == need and fla == grid.fla_classes()
    assert len(jobs) < len(cases) * 2  # shared kernels are compiled once


def test_packaged_cost_models_are_current():
    """Every packaged *_model.json section names a registered candidate with a predict hook and,
    for KDA, a payload this code reads (roles it knows, its feature set)."""
    from importlib import resources

    reg = get_registry()
    files = [f for f in resources.files("kreg.dispatch").iterdir()
             if f.name.endswith("_model.json")]  # fmt: skip
    for f in files:
        data = json.loads(f.read_text())
        for section in data if isinstance(data, list) else [data]:
            h = section["header"]
            assert {"target", "triton", "abi", "candidate", "device", "date"} <= set(h)
            cand = reg.candidates[h["candidate"]]
            assert cand.predict is not None
            if h["candidate"] == "kda.split":
                assert model.payload_ok(section["model"])
                assert set(section["model"]["roles"]) <= set(model.ROLE_BY_NAME)


SMOKE = ("b64-t256-h4x4-d64x64", "ones153-t4736-h8x8-d128x128")


@pytest.mark.gpu
def test_sweep_runs_and_validates_on_gpu(tmp_path):
    """Two small shapes through the whole sweep (compile workers, both phases, the JSON) and the
    validation of its output."""
    out = tmp_path / "sweep.json"
    res = sweep.run(out, deadline_s=300, workers=2, names=set(SMOKE))
    assert res["complete"] and [e["name"] for e in res["shapes"]] == list(SMOKE)
    for e in res["shapes"]:
        assert all("ms" in r for r in e["specs"]), e["specs"]
        assert sum(r["current"] for r in e["specs"]) == 1
        assert all(not r.get("flagged") for r in e["specs"])
    sw = validate.load_sweep(out)
    assert validate.evaluate(sw, validate.fit_payload(sw))


@pytest.mark.gpu
def test_grid_bench_runs_on_gpu(tmp_path):
    from kreg.bench import require_gpu

    cases = [c for c in grid.cases() if c.name in SMOKE]
    res = grid.run(cases, target=require_gpu(), quick=True, workers=2, progress=False,
                   deadline_s=300)  # fmt: skip
    assert [c["name"] for c in res["cases"]] == [c.name for c in cases]
    assert all(r.get("ms") for c in res["cases"] for r in c["rows"])


# --- the grid in parts (one device call each) and their merge --------------------------------------


def test_head_parts_cover_the_grid_once():
    parts = [grid.head_part(k, 2) for k in (1, 2)]
    for s in grid.shapes():
        hits = [k for k, pats in enumerate(parts) if any(p in s.name for p in pats)]
        assert len(hits) == 1, s.name
    with pytest.raises(ValueError, match="part 3 of 2"):
        grid.head_part(3, 2)


def _part_results(names, **key):
    from kreg import bench

    return {"scenario": "kda-grid", "quick": True, "elapsed_s": 10.0,
            "key": {"target": "sm90", "device": "H200", "triton": "3.6.0", "torch": "2.11",
                    "cuda": "13.0", **key},
            "cases": [{"name": n, "rows": [], "pairs": [], "skipped": [], "notes": [], "tags": []}
                      for n in names],
            "not_measured": [], "meta": {}, "budget": attrs.asdict(bench.QUICK_BUDGET)}  # fmt: skip


def test_merge_joins_parts_and_refuses_mixed_runs():
    from kreg import bench

    a, b = _part_results(["x", "y"]), _part_results(["z"])
    b["not_measured"] = ["w"]
    m = bench.merge_results([a, b])
    assert [c["name"] for c in m["cases"]] == ["x", "y", "z"] and m["not_measured"] == ["w"]
    assert m["elapsed_s"] == 20.0 and len(m["parts"]) == 2
    with pytest.raises(bench.ResultsError, match="key.triton"):
        bench.merge_results([a, _part_results(["z"], triton="3.7.0")])
    with pytest.raises(bench.ResultsError, match="more than one part"):
        bench.merge_results([a, _part_results(["y"])])


def test_merge_supersede_keeps_the_last_measurement_and_says_so():
    from kreg import bench

    a, b = _part_results(["x", "y"], date="d1"), _part_results(["y", "z"], date="d2")
    a["cases"][1]["notes"] = ["first run"]
    m = bench.merge_results([a, b], supersede=True)
    assert [c["name"] for c in m["cases"]] == ["x", "y", "z"]
    assert next(c for c in m["cases"] if c["name"] == "y")["notes"] == []  # b's row
    assert m["superseded"] == [{"case": "y", "measured": "d1", "replaced_by": "d2"}]
    assert "**Re-measured**" in bench.markdown(m) and "y (d1 → d2)" in bench.markdown(m)
    assert "superseded" not in bench.merge_results([a, _part_results(["z"])], supersede=True)
    assert "**Runs merged**: d1 (2 cases), d2 (2 cases)" in bench.markdown(m)
    assert "Runs merged" not in bench.markdown(a)  # one run: its date heads the page


def test_roles_predict_only_at_head_dims_their_sweep_measured(target):
    """Segmented scans are valid at K = 256 since the row-blocked combine, but no sweep has timed
    them there: the fitted roles name the head dims they were measured at and predict nothing
    elsewhere, so the selection stays among measured kernels."""
    path = Path(model.__file__).with_name("kda_model.json")
    payload = json.loads(path.read_text())["model"]
    shape = next(x for x in grid.shapes() if x.name == "b2-t12160-h2x2-d256x256")
    p = grid.problem_of(shape)
    pool = model.pool(p, target)
    assert any(s.scan.segment_chunks for _, s in pool)
    for role, spec in pool:
        ms = model.predict_ms(payload, role, model.pair_features(p, spec))
        entry = payload["roles"].get(role)  # a role no sweep has timed is not fitted at all
        assert (ms is None) == (entry is None or 256 not in entry["head_dims"]), role
    assert 256 in payload["roles"][model.choose(payload, p, target)[0]]["head_dims"]
    assert not model.payload_ok({**payload, "roles": {"r": {"offset": 0.0}}})


def test_prep_warps_rule_picks_the_fewest_or_the_most_enumerated(target):
    from kreg.families.kda import specs

    for name in ("b2-t12160-h2x2-d256x256", "b4-t8192-h32x32-d64x64"):
        p = grid.problem_of(grid.shape_named(name))
        valid = specs.valid_split_specs(target, p)
        warps = {s.tile.num_warps for s in valid if s.tile.chunk == 16 and s.tile.solve_block == 16}
        few = model.resolve(model.ROLE_BY_NAME["c16.narrow.w4s3.seg0"], valid)
        most = model.resolve(model.ROLE_BY_NAME["c16.narrow.w4s3.seg0.pmost"], valid)
        assert (few.tile.num_warps, most.tile.num_warps) == (min(warps), max(warps))
        assert attrs.evolve(most, tile=few.tile) == few  # the prep is all that differs


def test_k256_pool_holds_a_segmented_scan_below_the_spill_line(target):
    """At K = 256 the chain-bound shapes need segments, and the segmented roles that spill there
    (a state block of 128 fp32 per thread: sm90 ptxas spilled 288-896 B) cannot be what a sweep
    picks from: the pool must hold one with a smaller block."""
    p = grid.problem_of(grid.shape_named("b2-t12160-h2x2-d256x256"))
    per_thread = {role: 256 * s.scan.block_v // (s.scan.num_warps * 32)
                  for role, s in model.pool(p, target) if s.scan.segment_chunks}  # fmt: skip
    assert any(n < 128 for n in per_thread.values()), per_thread


def test_changed_lists_the_cases_a_model_moves(tmp_path):
    """``kda_grid.py changed``: which grid cases another cost model selects differently (the
    ones a refit sends back to the benchmark)."""
    path = Path(model.__file__).with_name("kda_model.json")
    same = validate.selections(str(path))
    assert same == validate.selections()  # the packaged file is that one
    assert set(same) == {c.name for c in grid.cases()}
    heuristic = validate.selections(os.devnull)
    moved = [n for n in same if same[n] != heuristic[n]]
    assert moved and len(moved) < len(same)
    assert all(tuple(v) == grid.pairs(grid.shape_named(n)) for n, v in same.items())
    clear_cache()


def test_device_next_script_selects_existing_gpu_tests():
    """scripts/device_next.sh spends device time on named GPU tests: its -k selection must
    still collect them (a renamed test would cost a call and find nothing), and a bad step is
    a one-line usage error."""
    import re
    import subprocess
    import sys

    root = Path(__file__).parents[1]
    text = (root / "scripts" / "device_next.sh").read_text()
    files = re.search(r"-p no:cacheprovider \\\n\s+(tests/\S+ tests/\S+) \\", text).group(1)
    k = re.search(r'-k "([^"]+)"', text).group(1)
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                          *files.split(), "-k", k], cwd=root, capture_output=True, text=True)  # fmt: skip
    collected = [line for line in out.stdout.splitlines() if "::" in line]
    for pattern in k.split(" or "):
        assert any(pattern in line for line in collected), (pattern, out.stdout + out.stderr)
    bad = subprocess.run(["bash", "scripts/device_next.sh", "nonsense"], cwd=root,
                         capture_output=True, text=True, env={**os.environ, "OUT": "/tmp"})  # fmt: skip
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
