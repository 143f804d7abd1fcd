"""``kreg bench``: the KDA scenario's cases and formulas, the renderer, the CLI (CPU); one GPU
smoke run under ``@pytest.mark.gpu``."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

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
        assert c.impls[:2] == ("kreg.split", "kreg.fused") and c.impls[-1] == "fla"
        assert 2 <= len([i for i in c.impls if i.startswith("split[")]) <= 3


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
    try:
        chunk_kda, _ = kda.load_fla()
    except Exception:  # pragma: no cover
        chunk_kda = None
    if chunk_kda is not None:  # the keywords reach chunk_kda's signature (A_log via **kwargs)
        inspect.signature(chunk_kda).bind(**f)
        inspect.signature(chunk_kda).bind(**fp)


def test_prepared_impls_agree_under_interpreter():
    """prepare() on CPU under the Triton interpreter: every kreg implementation runs (timed
    path and public call) and agrees with the split selection."""
    script = textwrap.dedent("""
        import torch
        from kreg.bench import Impl, rel_rms
        from kreg.families.kda import bench as kda
        from kreg.registry import get_registry
        target = get_registry().targets["sm90"]
        for case in (kda.make_case(1, 32, 1, head_dim=32, dtype="fp32"),
                     kda.make_case(1, 48, 1, head_dim=32, dtype="fp32", production=True,
                                   lengths=(17, 31))):
            p = kda.prepare(case, target, torch.device("cpu"))
            impls = [i for i in p.impls if isinstance(i, Impl) and i.name != "fla"]
            assert [i.name for i in impls][:2] == ["kreg.split", "kreg.fused"], impls
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


# --- rendering ------------------------------------------------------------------------------------


def _synthetic() -> dict:
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
        for r in rows:
            r.update(bench.row_metrics(case, r["ms"], 4000.0))
            r["vs_peer"] = rows[-1]["ms"] / r["ms"]
        cases.append({"name": case.name, "params": dict(case.params), "flops": case.flops,
                      "bytes": case.bytes, "tokens": case.tokens, "heads": case.heads,
                      "bh": case.bh, "tags": list(case.tags), "rows": rows, "skipped": [],
                      "notes": [], "peer": "fla"})  # fmt: skip
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
    assert "kreg.split, kreg.fused, split[" in r.stdout and ", fla" in r.stdout


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
    ],
)
def test_bench_cli_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


# --- GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_smoke(tmp_path):
    case = kda.make_case(1, 512, 2, tags=("sweep",))
    results = kda.run(
        [case], impls=["kreg.split", "kreg.fused"], quick=True, progress=False, workers=1
    )
    rows = {r["impl"]: r for r in results["cases"][0]["rows"]}
    assert set(rows) == {"kreg.split", "kreg.fused"}
    for r in rows.values():
        assert "error" not in r, r
        assert r["ms"] > 0 and r["host_us"] > 0 and r["peak_extra_bytes"] >= 0
        assert r["method"] in ("cuda_graph", "do_bench")
    assert rows["kreg.fused"]["rel_err"]["kreg.split"]["o"] < 1e-2
    assert not rows["kreg.fused"]["flagged"]
    assert results["copy_gbs"] > 100
    written = bench.write_results(results, tmp_path)
    assert (tmp_path / "results.json").is_file() and written["md"].is_file()
