"""``kreg bench``: the KDA scenario's cases and formulas, the renderer, the CLI (CPU); one GPU
smoke run under ``@pytest.mark.gpu``."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

from kreg import bench
from kreg.cli import main
from kreg.families.kda import bench as kda

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra):
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    env.update(extra)
    return env


# --- cases ------------------------------------------------------------------------------------


def test_cases_cover_required_shapes():
    cases = kda.cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    for c in cases:
        p = c.params
        assert (p["K"], p["V"], p["dtype"], p["lower_bound"], p["HV"]) == (128, 128, "bf16", -5.0,
                                                                           p["H"])  # fmt: skip
    plain = {(c.params["B"], c.params["T"], c.params["H"]): c for c in cases
             if not c.params["lengths"] and not c.params["production"]}  # fmt: skip
    for shape in [(1, 2048, 32), (1, 8192, 32), (4, 8192, 32), (16, 8192, 32), (1, 65536, 4),
                  (1, 65536, 32)]:  # fmt: skip
        assert shape in plain, shape
    sweep = sorted(c.bh for c in cases if "sweep" in c.tags)
    assert sweep == [4, 8, 16, 32, 64, 128, 256, 512]
    assert all(c.params["T"] == 8192 for c in cases if "sweep" in c.tags)
    assert min(c.params["T"] for c in cases) == 2048
    assert max(c.params["T"] for c in cases) == 65536
    varlen = [c for c in cases if c.params["lengths"]]
    assert {c.params["production"] for c in varlen} == {False, True}
    for c in varlen:
        assert c.params["lengths"] == [1300, 547, 2048, 963, 271, 3063]
        assert c.params["B"] == 1 and c.params["T"] == 8192 and c.params["H"] == 32
    prod = [c for c in cases if c.params["production"]]
    assert {(c.params["B"], c.params["T"], c.params["H"], bool(c.params["lengths"]))
            for c in prod} == {(1, 8192, 32, False), (1, 8192, 32, True)}  # fmt: skip
    for c in cases:
        pairs = ("kreg.split.bounded", "fla.safe_gate", "kreg.fused.bounded")
        if c.params["production"]:  # sigmoid_bound needs its bound: the bounded pair only
            assert c.impls[:3] == pairs and "kreg.split" not in c.impls and "fla" not in c.impls
        else:  # like with like: default vs default, bounded vs safe_gate, on the same inputs
            assert c.impls[:5] == ("kreg.split", "fla", *pairs)
        assert 2 <= len([i for i in c.impls if i.startswith("split.bounded[")]) <= 3


def test_pairs_are_like_with_like():
    for c in kda.cases():
        pairs = {p.label: p for p in kda.pairs_of(c.params)}
        bounded = pairs["bounded"]
        assert (bounded.impl, bounded.peer) == ("kreg.split.bounded", "fla.safe_gate")
        assert "lower_bound=-5.0" in bounded.text
        if c.params["production"]:
            assert set(pairs) == {"bounded"} and "bounded by construction" in bounded.text
            assert "use_gate_in_kernel=True, safe_gate=True" in bounded.text
            with pytest.raises(ValueError):
                kda.problem_of(c.params, bounded=False)
        else:
            assert (pairs["default"].impl, pairs["default"].peer) == ("kreg.split", "fla")
            assert kda.problem_of(c.params, bounded=False).gate_lower_bound is None
        assert kda.problem_of(c.params).gate_lower_bound == -5.0


def test_spec_variants_are_valid_and_distinct():
    from kreg.dispatch import select
    from kreg.families.kda import specs
    from kreg.registry import get_registry

    target = get_registry().targets["sm90"]
    for case in kda.cases():
        problem = kda.problem_of(case.params)
        sel = select(problem, target)
        variants = kda.split_variants(problem, target, sel.spec)
        labels = [kda.spec_label(v, sel.spec) for v in variants]
        assert len(set(variants)) == len(variants) and sel.spec not in variants
        assert len(set(labels)) == len(labels)
        assert any(v.tile.chunk != sel.spec.tile.chunk for v in variants)
        assert any(v.scan.block_v != sel.spec.scan.block_v for v in variants)
        for v in variants:
            assert specs.is_valid_split_spec(v, target, problem).ok


# --- formulas -----------------------------------------------------------------------------------


def test_flop_formula_by_hand():
    # K = V = 128, C = 64: 6*128*128 + 2*64*(3*128 + 2*128) + 64*64/3
    per = 98304 + 81920 + 4096 / 3
    assert kda.kda_flops(1, 1) == pytest.approx(per)
    assert per == pytest.approx(181589.333, abs=1e-3)
    case = next(c for c in kda.cases() if c.name == "b1-t2048-h32")
    assert case.flops == pytest.approx(2048 * 32 * per)


def test_byte_formula_by_hand():
    assert kda.kda_bytes(1, 1, 1, final_state=False) == 10 * 128 + 2 == 1282
    plain = next(c for c in kda.cases() if c.name == "b1-t2048-h32")
    # q, k, v, g, o in bf16 + beta, then the fp32 final state of 32 heads
    assert plain.bytes == 2048 * 32 * 1282 + 32 * 128 * 128 * 4 == 86_114_304
    prod = next(c for c in kda.cases() if c.name == "prod-varlen6-t8192-h32")
    # + fp32 initial state of 6 sequences, + A_log [32] and dt_bias [32*128] fp32
    assert prod.bytes == 8192 * 32 * 1282 + 6 * 32 * 128 * 128 * 8 + (32 + 32 * 128) * 4


def test_row_metrics():
    case = bench.BenchCase("c", {}, flops=2e12, bytes=3e9, tokens=1000, heads=4, bh=4)
    m = bench.row_metrics(case, 2.0, copy_gbs=4000.0)
    assert m["tflops"] == pytest.approx(1000.0)
    assert m["gbs"] == pytest.approx(1500.0)
    assert m["bw_fraction"] == pytest.approx(0.375)
    assert m["ns_per_token_head"] == pytest.approx(2e6 / 4000)


def test_rel_rms():
    import torch

    b = torch.tensor([3.0, 4.0])
    assert bench.rel_rms(b, b) == 0.0
    assert bench.rel_rms(torch.tensor([3.0, 4.5]), b) == pytest.approx(0.1)


# --- inputs and argument mapping (CPU) -----------------------------------------------------------


def _small(**kw):
    return kda.make_case(1, 64, 2, head_dim=32, dtype="fp32", **kw)


def test_inputs_respect_the_gate_bound():
    import torch

    for case in (_small(), _small(lengths=(40, 24)), _small(production=True)):
        x = kda.make_inputs(case.params, torch.device("cpu"), 1)
        if case.params["production"]:
            assert x["initial_state"].dtype == torch.float32
            assert x["A_log"].shape == (2,) and x["dt_bias"].shape == (2 * 32,)
            continue
        g = x["g"]
        assert bool((g <= 0).all()) and bool((g >= -5).all()) and bool((g != 0).all())
        assert bool((x["beta"] > 0).all()) and bool((x["beta"] < 1).all())
        assert torch.allclose(x["q"].norm(dim=-1), torch.ones(1, 64, 2), atol=1e-5)
        if case.params["lengths"]:
            assert x["cu_seqlens_cpu"].tolist() == [0, 40, 64]
            assert x["cu_seqlens"].dtype == torch.int64


def test_argument_mapping():
    import torch

    from kreg.families.kda import kda_prefill

    prod = _small(production=True)
    x = kda.make_inputs(prod.params, torch.device("cpu"), 1)
    kw = kda.kreg_kwargs(prod.params, x)
    inspect.signature(kda_prefill).bind(**kw)
    assert kw["gate_activation"] == "sigmoid_bound" and kw["use_qk_l2norm"]
    assert kw["use_beta_sigmoid"] and kw["initial_state"] is x["initial_state"]
    assert kw["gate_lower_bound"] == -5.0
    with pytest.raises(ValueError):  # sigmoid_bound has no unbounded call
        kda.kreg_kwargs(prod.params, x, bounded=False)
    with pytest.raises(ValueError):
        kda.fla_kwargs(prod.params, x, safe_gate=False)
    f = kda.fla_kwargs(prod.params, x)
    assert f["scale"] == 32**-0.5 and f["output_final_state"] is True
    expect = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=-5.0)  # fmt: skip
    assert {k: f[k] for k in expect} == expect
    assert f["A_log"] is x["A_log"] and f["dt_bias"] is x["dt_bias"]
    plain = _small(lengths=(40, 24))
    xp = kda.make_inputs(plain.params, torch.device("cpu"), 1)
    fp = kda.fla_kwargs(plain.params, xp)
    assert fp["cu_seqlens"] is xp["cu_seqlens"] and fp["cu_seqlens_cpu"] is xp["cu_seqlens_cpu"]
    assert "use_gate_in_kernel" not in fp and fp["initial_state"] is None
    assert fp["safe_gate"] is True and fp["lower_bound"] == -5.0  # the bounded pair's peer
    fd = kda.fla_kwargs(plain.params, xp, safe_gate=False)  # fla's default: no promise
    assert "safe_gate" not in fd and "lower_bound" not in fd
    assert {k: v for k, v in fp.items() if k not in ("safe_gate", "lower_bound")} == fd
    kd = kda.kreg_kwargs(plain.params, xp, bounded=False)
    assert kd["gate_lower_bound"] is None
    assert {k: v for k, v in kda.kreg_kwargs(plain.params, xp).items()
            if k != "gate_lower_bound"} == {k: v for k, v in kd.items() if k != "gate_lower_bound"}  # fmt: skip
    inspect.signature(kda_prefill).bind(**kd)
    try:
        chunk_kda, _ = kda.load_fla()
    except Exception:  # pragma: no cover
        chunk_kda = None
    if chunk_kda is not None:  # the keywords reach chunk_kda's signature (A_log via **kwargs)
        inspect.signature(chunk_kda).bind(**f)
        inspect.signature(chunk_kda).bind(**fp)
        inspect.signature(chunk_kda).bind(**fd)


def test_prepared_impls_agree_under_interpreter():
    """prepare() on CPU under the Triton interpreter: every kreg implementation runs (timed
    path and public call) and agrees with the split selection."""
    script = textwrap.dedent("""
        import torch
        from kreg.bench import Impl, rel_rms
        from kreg.families.kda import bench as kda
        from kreg.registry import get_registry
        target = get_registry().targets["sm90"]
        # long enough for the chunked form (shorter ones are served by kda.recurrent)
        for case in (kda.make_case(1, 128, 1, head_dim=32, dtype="fp32"),
                     kda.make_case(1, 128, 1, head_dim=32, dtype="fp32", production=True,
                                   lengths=(57, 71))):
            p = kda.prepare(case, target, torch.device("cpu"))
            impls = [i for i in p.impls if isinstance(i, Impl) and not i.name.startswith("fla")]
            names = [i.name for i in impls]
            want = ["kreg.split.bounded", "kreg.fused.bounded"]
            if not case.params["production"]:
                want.insert(0, "kreg.split")
            assert names[:len(want)] == want, names
            peers = {i.name: i.peer for i in impls}
            assert all(v == "fla.safe_gate" for k, v in peers.items() if k != "kreg.split")
            assert peers.get("kreg.split", "fla") == "fla"
            assert [(x.impl, x.peer) for x in p.pairs][-1] == ("kreg.split.bounded",
                                                              "fla.safe_gate")
            assert p.references == (p.pairs[0].impl, p.pairs[0].peer)
            bounds = {i.name: i.info["gate_lower_bound"] for i in impls}
            assert bounds.pop("kreg.split", None) is None and set(bounds.values()) == {-5.0}
            ref = p.outputs(impls[0].run())
            for i in impls:
                for ret in (i.run(), i.call()):
                    out = p.outputs(ret)
                    for key in ("o", "state"):
                        err = rel_rms(out[key], ref[key])
                        assert err < 1e-4, (case.name, i.name, key, err)
            print("ok", case.name, len(impls))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=_env(TRITON_INTERPRET="1"), timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("ok ") == 2


# --- the runner's ratios (device parts faked) ---------------------------------------------------


def test_run_case_ratios_within_pairs(monkeypatch):
    """Each row's × peer is taken against its own pair's peer, the peers get none, and the case
    records its pairs and references for the renderer."""
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(bench, "_release", lambda torch: None)
    monkeypatch.setattr(bench, "peak_extra_bytes", lambda torch, fn: 0)
    monkeypatch.setattr(bench, "host_overhead_us", lambda torch, fn, n, s: {"us": 1.0, "calls": 1})
    times = {"kreg.split": 2.0, "fla": 3.0, "kreg.split.bounded": 1.0, "fla.safe_gate": 2.5,
             "kreg.fused.bounded": 5.0}  # fmt: skip

    class Timer:
        def time(self, impl, **_):
            return {"ms": times[impl.name], "method": "cuda_graph", "reps": 1, "ms_min": None}

    out = torch.ones(4)
    peers = {"kreg.split": "fla", "kreg.split.bounded": "fla.safe_gate",
             "kreg.fused.bounded": "fla.safe_gate"}  # fmt: skip
    impls = [bench.Impl(n, run=lambda: (out, out), peer=peers.get(n)) for n in times]
    pairs = (bench.Pair("default", "kreg.split", "fla", "d"),
             bench.Pair("bounded", "kreg.split.bounded", "fla.safe_gate", "b"))  # fmt: skip

    def prepare(case, target, device):
        return bench.Prepared(impls=impls, outputs=lambda r: {"o": r[0]}, peer="fla",
                              references=("kreg.split", "fla"), pairs=pairs)  # fmt: skip

    case = bench.BenchCase("c", {}, flops=1e9, bytes=1e6, tokens=8, heads=1, bh=1)
    res = bench._run_case(case, prepare, None, "cpu", Timer(), bench.QUICK_BUDGET, None, 4000.0,
                          bench._NoBar(), lambda s: None)  # fmt: skip
    rows = {r["impl"]: r for r in res["rows"]}
    assert rows["kreg.split"]["vs_peer"] == pytest.approx(1.5)  # fla / kreg default
    assert rows["kreg.split.bounded"]["vs_peer"] == pytest.approx(2.5)  # safe_gate / bounded
    assert rows["kreg.fused.bounded"]["vs_peer"] == pytest.approx(0.5)
    assert rows["kreg.fused.bounded"]["peer"] == "fla.safe_gate"
    assert rows["fla"]["vs_peer"] is None and rows["fla.safe_gate"]["vs_peer"] is None
    assert res["pairs"] == [attrs.asdict(p) for p in pairs]
    assert res["references"] == ["kreg.split", "fla"]
    md = bench.markdown({"cases": [res]})
    assert "| c | default | kreg.split | 2.000 | fla | 3.000 | 1.50 (fla / kreg.split) |" in md


# --- rendering ------------------------------------------------------------------------------------


def _synthetic(paired: bool = False) -> dict:
    """A results file as the runner writes it: with ``paired``, cases time the like-with-like
    pairs and record them; without, as before the pairing (one peer per case)."""

    def row(impl, ms, **kw):
        r = {"impl": impl, "info": {"spec": f"spec of {impl}"}, "ms": ms, "method": "cuda_graph",
             "host_us": 50.0, "peak_extra_bytes": 3 * 2**20, "rel_err": {}, "flagged": False}  # fmt: skip
        r.update(kw)
        return r

    cases = []
    for b, h in ((1, 4), (1, 32), (4, 32)):
        case = kda.make_case(b, 8192, h, tags=("sweep",))
        rows = [
            row("kreg.split", 0.1 * b * h / 4),
            row("kreg.fused", 0.2 * b * h / 4,
                rel_err={"kreg.split": {"o": 2e-3, "state": 1e-3}, "fla": {"o": 0.02}},
                flagged=True),
            row("fla", 0.3 * b * h / 4, rel_err={"kreg.split": {"o": 4e-3, "state": 3e-3}}),
        ]  # fmt: skip
        peer_of = {r["impl"]: "fla" for r in rows}
        extra = {}
        if paired:
            rows[1]["impl"] = "kreg.fused.bounded"
            rows += [row("kreg.split.bounded", 0.05 * b * h / 4),
                     row("fla.safe_gate", 0.2 * b * h / 4)]  # fmt: skip
            peer_of = {"kreg.split": "fla", "kreg.split.bounded": "fla.safe_gate",
                       "kreg.fused.bounded": "fla.safe_gate"}  # fmt: skip
            extra = {"references": ["kreg.split", "fla"],
                     "pairs": [attrs.asdict(p) for p in kda.pairs_of(case.params)]}  # fmt: skip
        ms = {r["impl"]: r["ms"] for r in rows}
        for r in rows:
            r.update(bench.row_metrics(case, r["ms"], 4000.0))
            peer = peer_of.get(r["impl"])
            if paired:
                r["peer"] = peer
            r["vs_peer"] = ms[peer] / r["ms"] if peer else None
        cases.append({"name": case.name, "params": dict(case.params), "flops": case.flops,
                      "bytes": case.bytes, "tokens": case.tokens, "heads": case.heads,
                      "bh": case.bh, "tags": list(case.tags), "rows": rows, "skipped": [],
                      "notes": [], "peer": "fla", **extra})  # fmt: skip
    cases.append({"name": "varlen6-t8192-h32", "params": {}, "flops": 1.0, "bytes": 1.0,
                  "tokens": 8192, "heads": 32, "bh": 192, "tags": ["varlen"], "peer": "fla",
                  "rows": [{"impl": "kreg.split", "error": "RuntimeError: boom", "info": {}}],
                  "skipped": [{"impl": "fla", "reason": "fla-core not importable"}],
                  "notes": []})  # fmt: skip
    return {"scenario": "kda", "key": {"target": "sm90", "device": "NVIDIA H200", "torch": "2.11",
            "triton": "3.6.0", "cuda": "13.0", "date": "2026-12-02T10:00:00Z"}, "quick": False,
            "copy_gbs": 4000.0, "flag_rel_err": 1e-2, "doc": kda.HARNESS_DOC,
            "meta": {"versions": {"fla-core": "0.6.0"}}, "cases": cases,
            "elapsed_s": 300.0}  # fmt: skip


def test_render_markdown_and_plot(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_synthetic()))
    out = tmp_path / "docs"
    rc = main(["bench", "--render", str(path), "--out", str(out)])
    assert rc == 0
    md = (out / "RESULTS.md").read_text()
    assert md.startswith("# KDA prefill: benchmark results")
    assert "kreg bench kda --out" in md and "kreg bench --render" in md
    assert "6·K·V" in md and "(10d + 2)" in md
    assert "on NVIDIA H200 (target sm90)" in md and "fla-core 0.6.0" in md
    assert "| b1-t8192-h4 | kreg.split | 0.100 |" in md
    assert "kreg.fused ⚠" in md and "o 2.0e-02 ⚠" in md
    assert "failed: RuntimeError: boom" in md
    assert "fla skipped: fla-core not importable (varlen6-t8192-h32)" in md
    assert "![time per token·head against B·H](bh_sweep.png)" in md
    png = (out / "bh_sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    series = bench.sweep_series(_synthetic())
    assert [x for x, _ in series["kreg.split"]] == [4, 32, 128]
    # ns per token·head = ms * 1e6 / (B*T*H): 0.1 ms over 8192 tokens x 4 heads
    assert series["kreg.split"][0][1] == pytest.approx(0.1e6 / (8192 * 4))
    text = bench.summary(_synthetic())
    assert "b1-t8192-h4" in text and "(3.00x)" in text and "failed" in text


def test_render_pairs_like_with_like(tmp_path):
    results = _synthetic(paired=True)
    md = bench.markdown(results)
    assert "Measured before the like-with-like pairing" not in md
    assert "### Like with like" in md
    # both pairs, each ratio named by the rows it divides
    assert (
        "| b1-t8192-h4 | default | kreg.split | 0.100 | fla | 0.300 | 3.00 (fla / kreg.split) |"
        in md
    )
    assert ("|  | bounded | kreg.split.bounded | 0.050 | fla.safe_gate | 0.200 | "
            "4.00 (fla.safe_gate / kreg.split.bounded) |") in md  # fmt: skip
    assert (
        "**default**: `kreg.split` against `fla`: `kda_prefill(...)` (`gate_lower_bound=None`" in md
    )
    assert "**bounded**: `kreg.split.bounded` against `fla.safe_gate`" in md
    assert "safe_gate=True, lower_bound=-5.0" in md
    # every row says which peer its ratio is against; the peers have none
    assert "| kreg.fused.bounded ⚠ | 0.200 |" in md and "| 1.00 | fla.safe_gate |" in md
    assert "| fla | 0.300 |" in md
    fla_row = next(line for line in md.splitlines() if line.startswith("|  | fla | 0.300"))
    assert fla_row.split(" | ")[8:10] == ["–", "–"]
    assert "ref 1 = kreg.split, ref 2 = fla" in md
    text = bench.summary(results)
    assert (
        "default: kreg.split vs fla" in text
        and "bounded: kreg.split.bounded vs fla.safe_gate" in text
    )
    assert "(4.00x)" in text
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert main(["bench", "--render", str(path), "--out", str(tmp_path / "docs")]) == 0


def test_render_production_pair_only():
    results = _synthetic(paired=True)
    case = kda.make_case(1, 8192, 32, production=True, tags=("production",))
    results["cases"] = [{
        "name": case.name, "tags": [], "rows": [
            {"impl": "kreg.split.bounded", "ms": 1.0, "peer": "fla.safe_gate", "vs_peer": 1.5},
            {"impl": "fla.safe_gate", "ms": 1.5, "peer": None, "vs_peer": None}],
        "references": ["kreg.split.bounded", "fla.safe_gate"],
        "pairs": [attrs.asdict(p) for p in kda.pairs_of(case.params)], "peer": "fla.safe_gate",
    }]  # fmt: skip
    md = bench.markdown(results)
    assert "| prod-b1-t8192-h32 | bounded | kreg.split.bounded | 1.000 | fla.safe_gate |" in md
    assert "| default | kreg.split |" not in md and "bounded by construction" in md
    assert bench.pair_rows(results) == [["prod-b1-t8192-h32", "bounded", "kreg.split.bounded",
                                         "1.000", "fla.safe_gate", "1.500",
                                         "1.50 (fla.safe_gate / kreg.split.bounded)"]]  # fmt: skip
    assert "ref 1 = kreg.split.bounded, ref 2 = fla.safe_gate" in md


def test_render_old_results_say_so(tmp_path):
    md = bench.markdown(_synthetic())
    assert "measured before the like-with-like pairing (2026-12-03 audit)" in md.lower()
    assert "### Like with like" not in md
    # the committed results are from the old pairing: they still render, with the note
    out = tmp_path / "docs"
    assert main(["bench", "--render", str(ROOT / "docs/kda/results.json"), "--out", str(out)]) == 0
    text = (out / "RESULTS.md").read_text()
    assert "Measured before the like-with-like pairing (2026-12-03 audit)" in text
    assert "before the like-with-like pairing" in bench.summary(_synthetic())


def test_render_without_results():
    md = bench.markdown({"doc": kda.HARNESS_DOC, "cases": []})
    assert "## Results" in md and "No results recorded yet" in md


# --- CLI --------------------------------------------------------------------------------------------


def test_bench_list_cli():
    r = subprocess.run([sys.executable, "-m", "kreg", "bench", "--list"], capture_output=True,
                       text=True, env=_env(), timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "kda (family kda)" in r.stdout
    for case in kda.cases():
        assert case.name in r.stdout
    flat = " ".join(r.stdout.split())  # the implementations column wraps at 100 columns
    assert "kreg.split, fla, kreg.split.bounded, fla.safe_gate, kreg.fused.bounded, " in flat
    assert "kreg.split.bounded, fla.safe_gate, kreg.fused.bounded, split.bounded[" in flat


def test_bench_without_gpu_is_one_line(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = main(["bench", "kda", "--cases", "b1-t2048", "--quick"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("kreg: error: kreg bench kda needs a GPU")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench"], "name a scenario"),
        (["bench", "nope"], "unknown scenario 'nope'"),
        (["bench", "kda", "--cases", "zzz"], "no case of scenario 'kda' matches"),
        (["bench", "--render", "/nonexistent/results.json"], "no such file"),
        (["bench", "--json"], "--json goes with --list"),
    ],
)
def test_bench_cli_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize(
    "content, message",
    [
        ("[]", "expected a JSON object, got list"),
        ('{"cases": 5}', "'cases' must be a list, got int"),
        ('{"cases": [5]}', "cases[0] must be an object"),
        ('{"cases": [{"name": "c"}]}', "cases[0] lacks 'rows'"),
        ('{"cases": [{"name": "c", "rows": [{"ms": 1}]}]}', "rows[0] must be an object with"),
        ('{"cases": [{"name": "c", "rows": [], "pairs": [{"label": 1}]}]}', "pairs[0] needs"),
        ('{"cases": [{"name": "c", "rows": [], "skipped": ["x"]}]}', "skipped[0] needs"),
        ('{"cases": [], "key": []}', "'key' must be an object"),
        ("{not json", "not JSON"),
    ],
)
def test_render_rejects_non_results(tmp_path, capsys, content, message):
    path = tmp_path / "results.json"
    path.write_text(content)
    assert main(["bench", "--render", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kreg: error: --render: ")
    assert "is not a kreg bench results file" in err[0] and message in err[0]
    assert not (tmp_path / "out" / "RESULTS.md").exists()


class _FakeRegistry:
    def __init__(self, scenarios):
        self.scenarios = {s.name: s for s in scenarios}


def _fake_scenarios():
    from kreg.registry.model import Scenario

    one = bench.BenchCase("c1", {"T": 8}, flops=1.0, bytes=2.0, tokens=8, heads=1, bh=1,
                          tags=("main",), impls=("a", "b"))  # fmt: skip
    none = Scenario(name="empty", family="f", description="no cases", cases=lambda: (),
                    run=lambda *a, **k: {})  # fmt: skip
    some = Scenario(name="some", family="f", description="one case", cases=lambda: (one,),
                    run=lambda *a, **k: {})  # fmt: skip
    return [none, some]


def test_bench_list_zero_cases(monkeypatch, capsys):
    from kreg.cli import bench_cmd

    monkeypatch.setattr(bench_cmd, "registry", lambda: _FakeRegistry(_fake_scenarios()))
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert "empty (family f): no cases\n  (no cases)" in out and "c1" in out
    assert main(["bench", "--list", "empty"]) == 0
    assert "(no cases)" in capsys.readouterr().out
    assert main(["bench", "--list", "--cases", "zzz"]) == 0  # all scenarios: none match here
    assert "(no cases match 'zzz')" in capsys.readouterr().out
    assert main(["bench", "--list", "some", "--cases", "zzz"]) == 2  # a named one must match
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no case of scenario 'some' matches 'zzz'" in err[0]
    assert main(["bench", "empty"]) == 2  # running a scenario without cases: one line
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scenario 'empty' has no cases" in err[0]


def test_bench_list_json(monkeypatch, capsys):
    from kreg.cli import bench_cmd

    monkeypatch.setattr(bench_cmd, "registry", lambda: _FakeRegistry(_fake_scenarios()))
    assert main(["bench", "--list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in data] == ["empty", "some"]
    assert data[0]["cases"] == []
    (case,) = data[1]["cases"]
    assert case["name"] == "c1" and case["impls"] == ["a", "b"] and case["tags"] == ["main"]
    assert case["params"] == {"T": 8} and case["bh"] == 1 and case["bytes"] == 2.0
    monkeypatch.setattr(bench_cmd, "registry", lambda: _FakeRegistry([]))
    assert main(["bench", "--list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_bench_list_json_kda(capsys):
    assert main(["bench", "--list", "kda", "--json", "--cases", "prod-"]) == 0
    (scenario,) = json.loads(capsys.readouterr().out)
    assert scenario["name"] == "kda" and scenario["family"] == "kda"
    names = [c["name"] for c in scenario["cases"]]
    assert names == ["prod-b1-t8192-h32", "prod-varlen6-t8192-h32"]
    assert all(c["impls"][:2] == ["kreg.split.bounded", "fla.safe_gate"]
               for c in scenario["cases"])  # fmt: skip


# --- GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_smoke(tmp_path):
    case = kda.make_case(1, 512, 2, tags=("sweep",))
    results = kda.run(
        [case], impls=["kreg.split", "kreg.fused"], quick=True, progress=False, workers=1
    )
    rows = {r["impl"]: r for r in results["cases"][0]["rows"]}
    # --impls matches by substring: both kreg.split rows (default, bounded) and the fused one
    assert set(rows) == {"kreg.split", "kreg.split.bounded", "kreg.fused.bounded"}
    assert rows["kreg.split"]["info"]["gate_lower_bound"] is None
    assert rows["kreg.split.bounded"]["rel_err"]["kreg.split"]["o"] < 1e-2
    for r in rows.values():
        assert "error" not in r, r
        assert r["ms"] > 0 and r["host_us"] > 0 and r["peak_extra_bytes"] >= 0
        assert r["method"] in ("cuda_graph", "do_bench")
    assert rows["kreg.fused.bounded"]["rel_err"]["kreg.split"]["o"] < 1e-2
    assert not rows["kreg.fused.bounded"]["flagged"]
    assert results["copy_gbs"] > 100
    written = bench.write_results(results, tmp_path)
    assert (tmp_path / "results.json").is_file() and written["md"].is_file()
