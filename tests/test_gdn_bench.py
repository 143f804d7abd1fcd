"""GDN's benchmark scenarios (``kreg bench gdn``, ``kreg bench gdn-decode``) on the CPU: they
register, their cases and selections, the inputs and the keywords each row gets, the compile
plan, and a dry run of the runner and the renderer with the device parts faked; the kreg rows
against the float64 oracle under the Triton interpreter; one GPU smoke run (``@pytest.mark.gpu``)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from kreg import bench
from kreg.bench import runner
from kreg.cli import main
from kreg.families.gdn.bench import decode as gdn_decode
from kreg.families.gdn.bench import scenario as gdn
from kreg.families.kda.bench import gate_regimes

ROOT = Path(__file__).resolve().parents[1]
SM90 = "sm90"


def _small(regime="softplus_pre", lengths=None, B=1):
    """A CPU-sized case: T = 64 (or the lengths' sum), H = 2, HV = 4, K = V = 32, fp32."""
    T = sum(lengths) if lengths else 64
    return gdn.make_case(B, T, 2, 4, lengths=lengths, regime=regime, K=32, dtype="fp32")


def _small_decode(N=3):
    _, params = gdn.case_params(N, 1, 2, 4, regime=gdn_decode.REGIME, K=32, dtype="fp32")
    return bench.BenchCase(f"n{N}", params, flops=1.0, bytes=1.0, tokens=N, heads=4, bh=4 * N)


def _inputs(case):
    import torch

    return gdn.make_inputs(case.params, torch.device("cpu"), gdn.kda_bench.seed_of(case))


# --- registration and cases ---------------------------------------------------------------------


def test_scenarios_register_under_gdn():
    from kreg.registry import get_registry

    scenarios = get_registry().scenarios
    for name, module in (("gdn", gdn), ("gdn-decode", gdn_decode)):
        s = scenarios[name]
        assert s.family == "gdn" and s.cases is module.cases and s.run is module.run
    assert "kda" in scenarios and "kda-decode" in scenarios  # KDA's stay as they were


def test_prefill_cases():
    cases = gdn.cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names)) and len(cases) <= 12
    shapes = {(c.params["B"], c.params["T"], c.params["H"], c.params["HV"],
               tuple(c.params["lengths"] or ())) for c in cases}  # fmt: skip
    lengths, engine = gdn.VARLEN_LENGTHS, gdn.ENGINE_LENGTHS
    assert shapes == {(1, 4096, 16, 32, ()), (1, 8192, 16, 32, ()), (4, 8192, 16, 32, ()),
                      (1, 8192, 16, 32, lengths), (1, 8192, 32, 32, ()),
                      (1, 2048, 16, 32, ()), (1, 32768, 16, 32, ()), (1, 8192, 4, 8, ()),
                      (1, sum(engine), 16, 32, engine)}  # fmt: skip
    assert len(lengths) == 7 and sum(lengths) == 8192 and len(set(lengths)) == 7
    assert any(n % 64 for n in lengths)  # sequences that end inside a chunk
    assert {c.params["regime"] for c in cases} == set(gdn.REGIMES)
    assert {c.params["regime"] for c in cases if c.name.startswith("b1-t8192-h16x32")} == {
        "softplus", "softplus_pre", "heavy", "resets"}  # fmt: skip
    for c in cases:
        p = c.params
        assert (p["dtype"], p["K"], p["V"]) == ("bf16", 128, 128)
        assert c.name.endswith("-" + p["regime"]) and c.heads == p["HV"]
        varlen = bool(p["lengths"])
        assert c.impls == ("kreg.split", "fla",
                           "kreg.split+cu_seqlens_cpu" if varlen else "flashinfer")  # fmt: skip
        assert c.bh == (len(p["lengths"]) if varlen else p["B"]) * p["HV"]
    # every regime of a shape draws the same raw inputs
    seeds = {c.name.rsplit("-", 1)[0]: c.params["seed"] for c in cases}
    assert all(c.params["seed"] == seeds[c.name.rsplit("-", 1)[0]] for c in cases)
    # fla autotunes per class in the measuring process: few of them keep the run short
    assert len({gdn.fla_class(c.params) for c in cases}) <= 5
    heldout = bench.filter_cases(cases, ["heldout"])
    assert {(c.params["T"], c.params["H"], c.params["HV"]) for c in heldout} >= {
        (2048, 16, 32), (32768, 16, 32), (8192, 4, 8)}  # fmt: skip
    assert any(c.params["lengths"] and 1 in c.params["lengths"] for c in heldout)
    assert bench.filter_cases(cases, ["anchor"]) == [c for c in cases if c.params["H"] == 32]


def test_decode_cases():
    cases = gdn_decode.cases()
    assert [c.params["B"] for c in cases] == [1, 16, 64, 256]
    for c in cases:
        p = c.params
        assert (p["T"], p["H"], p["HV"], p["K"], p["regime"]) == (1, 16, 32, 128, "softplus")
        assert c.impls == ("kreg.recurrent", "fla.fused_recurrent", "kreg.recurrent.pool")
        assert c.tokens == p["B"] and c.bh == p["B"] * 32


def test_case_arguments_refused():
    with pytest.raises(ValueError, match="GDN's cases feed"):
        gdn.make_case(1, 64, 2, regime="bounded")  # fla's GDN has no bounded gate to pair
    with pytest.raises(ValueError, match="varlen"):
        gdn.make_case(2, 64, 2, lengths=(32, 32))


def test_every_case_selects_a_gdn_candidate_on_sm90():
    for c in gdn.cases():
        for host in (False, True) if c.params["lengths"] else (False,):
            problem = gdn.problem_of(c.params, host_offsets=host)
            assert problem.gate == "scalar" and problem.qk_l2norm and problem.initial_state
            assert problem.gate_activation == ("softplus" if gdn.gate_in_kernel(c.params)
                                               else "none")  # fmt: skip
            assert problem.max_seqlen == (max(c.params["lengths"]) if host else None)
            sel = gdn.select(c.params, SM90, host_offsets=host)
            assert sel.candidate.name == "gdn.split", c.name
    for c in gdn_decode.cases():
        for pool in (False, True):
            sel = gdn.select(c.params, SM90, pool=pool)
            assert sel.candidate.name == "gdn.recurrent", (c.name, pool)
            assert gdn.problem_of(c.params, pool=pool).state_pool == pool


def test_formulas_by_hand():
    # per token: q, k (16 heads x 128) + v, o (32 x 128) in bf16, beta (32 x bf16), g (32 x fp32)
    per_token = 2 * 16 * 128 * 2 + 2 * 32 * 128 * 2 + 32 * 2
    state = 32 * 128 * 128 * 8  # fp32 initial state read and final state written
    by = {c.name: c for c in gdn.cases()}
    pre = by["b1-t8192-h16x32-softplus_pre"]
    assert pre.bytes == 8192 * (per_token + 32 * 4) + state == 207_093_760
    # in the kernel: the raw gate in bf16, A_log and dt_bias [32] fp32
    assert by["b1-t8192-h16x32-softplus"].bytes == 8192 * (per_token + 32 * 2) + state + 256
    assert by["varlen7-t8192-h16x32-softplus_pre"].bytes == 8192 * (per_token + 128) + 7 * state
    assert pre.flops == pytest.approx(8192 * 32 * (6 * 128**2 + 2 * 64 * 5 * 128 + 64**2 / 3))
    dec = {c.params["B"]: c for c in gdn_decode.cases()}[16]
    assert dec.flops == 7 * 16 * 32 * 128 * 128
    assert dec.bytes == 16 * (per_token + 32 * 2) + 16 * state + 256


# --- inputs and keywords (CPU) --------------------------------------------------------------------


@pytest.mark.parametrize("regime", gdn.REGIMES)
def test_inputs_on_cpu(regime):
    import torch

    case = _small(regime, B=2)
    x = _inputs(case)
    B, T, H, HV, K = 2, 64, 2, 4, 32
    assert x["q"].shape == x["k"].shape == (B, T, H, K) and x["v"].shape == (B, T, HV, K)
    assert x["g"].shape == x["beta"].shape == (B, T, HV) and x["g"].is_contiguous()
    assert x["initial_state"].shape == (B, HV, K, K) and x["initial_state"].dtype == torch.float32
    assert bool(((x["beta"] > 0) & (x["beta"] < 1)).all()) and x["cu_seqlens"] is None
    in_kernel = regime in ("softplus", "heavy")
    assert gdn.gate_in_kernel(case.params) == in_kernel
    if in_kernel:  # the raw gate, with the parameters fla and kreg activate it with
        assert x["A_log"].shape == x["dt_bias"].shape == (HV,)
    else:
        assert x["A_log"] is None and x["dt_bias"] is None and x["g"].dtype == torch.float32
    g = gdn.activated_gate(case.params, x)
    assert g.shape == (B, T, HV) and bool((g <= 0).all())
    if regime == "resets":  # whole token rows of -inf, RESET_ROWS per batch row (at most)
        rows = torch.isinf(g).all(-1)
        assert bool((torch.isinf(g).any(-1) == rows).all())
        assert 1 <= int(rows.sum(-1).min()) and int(rows.sum(-1).max()) <= gate_regimes.RESET_ROWS
    else:
        assert bool(torch.isfinite(g).all())


def test_regimes_of_a_shape_share_their_draws():
    import torch

    raw, pre = _small("softplus"), _small("softplus_pre")
    assert raw.params["seed"] == pre.params["seed"]
    xr, xp = _inputs(raw), _inputs(pre)
    for name in ("q", "k", "v", "beta", "initial_state"):
        assert torch.equal(xr[name], xp[name]), name
    # the precomputed gates are the in-kernel regime's, activated
    torch.testing.assert_close(gdn.activated_gate(raw.params, xr), xp["g"])


def test_varlen_inputs_and_offsets():
    case = _small(lengths=(40, 7, 17))
    x = _inputs(case)
    assert x["cu_seqlens"].tolist() == x["cu_seqlens_cpu"].tolist() == [0, 40, 47, 64]
    assert x["cu_seqlens_cpu"].device.type == "cpu" and x["initial_state"].shape[0] == 3
    kw = gdn.fla_kwargs(case.params, x)
    assert kw["cu_seqlens"] is x["cu_seqlens"] and "cu_seqlens_cpu" not in kw


@pytest.mark.parametrize("regime", gdn.REGIMES)
def test_keywords(regime):
    case = _small(regime, lengths=(40, 24))
    x = _inputs(case)
    kw = gdn.fla_kwargs(case.params, x)
    in_kernel = gdn.gate_in_kernel(case.params)
    expected = {"q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
                "use_qk_l2norm_in_kernel", "cu_seqlens"}  # fmt: skip
    assert set(kw) == expected | (
        {"use_gate_in_kernel", "A_log", "dt_bias"} if in_kernel else set()
    )
    assert kw["use_qk_l2norm_in_kernel"] is True and kw["output_final_state"] is True
    text = gdn.call_text(case.params)
    assert "cu_seqlens (device only)" in text and "cu_seqlens_cpu" not in text
    assert ("use_gate_in_kernel=True" in text) == in_kernel
    fla_gdn, _ = gdn.load_fla_gdn()
    if fla_gdn is not None:  # the keywords reach fla's signatures (A_log via chunk's **kwargs)
        inspect.signature(fla_gdn.chunk_gated_delta_rule).bind(**kw)
        inspect.signature(fla_gdn.fused_recurrent_gated_delta_rule).bind(**kw)


def _fake(calls: dict, side: str):
    """A stand-in for a GDN call that records its keywords and returns (o, final state)."""

    def fn(**kw):
        calls.setdefault(side, []).append(kw)
        return kw["v"].float() * (1.001 if side.startswith("fla") else 1.0), kw["initial_state"]

    return fn


@pytest.fixture
def faked(monkeypatch):
    """Both kreg.compat.fla shims and fla's module faked; returns the calls they record."""
    from kreg.compat import fla as compat_fla

    calls: dict[str, list] = {}
    for shim in (gdn.PREFILL_SHIM, gdn_decode.SHIM):
        monkeypatch.setattr(compat_fla, shim, _fake(calls, "kreg"), raising=False)
    module = types.SimpleNamespace(chunk_gated_delta_rule=_fake(calls, "fla"),
                                   fused_recurrent_gated_delta_rule=_fake(calls, "fla"))  # fmt: skip
    monkeypatch.setattr(gdn, "load_fla_gdn", lambda: (module, "0.6.0"))
    return calls


@pytest.mark.parametrize("lengths", [None, (40, 24)])
def test_kreg_rows_receive_exactly_flas_keywords(faked, lengths):
    """prepare() on CPU: the kreg row calls kreg.compat.fla.chunk_gated_delta_rule with the very
    keywords (the same objects) fla's row gives fla; the varlen case's extra kreg row adds
    cu_seqlens_cpu alone; FlashInfer's row is skipped with its reason where it cannot run."""
    import torch

    for regime in gdn.REGIMES:
        case = _small(regime, lengths=lengths)
        p = gdn.prepare(case, SM90, torch.device("cpu"))
        impls = {i.name: i for i in p.impls}
        assert tuple(impls) == case.impls
        kreg, fla = impls["kreg.split"], impls["fla"]
        faked.clear()
        kreg.run(), fla.run()
        (k,), (f,) = faked["kreg"], faked["fla"]
        assert k.keys() == f.keys() and all(k[n] is f[n] for n in f), regime
        assert kreg.call is kreg.run and kreg.peer == "fla"
        assert kreg.info["call"] == "kreg.compat.fla.chunk_gated_delta_rule"
        assert kreg.info["candidate"] == "gdn.split"
        assert p.references == ("kreg.split", "fla") and p.peer == "fla"
        assert [(x.label, x.impl, x.peer) for x in p.pairs] == [("default", "kreg.split", "fla")]
        assert bool(p.notes) == (regime == "resets")
        if lengths:
            faked.clear()
            extra = impls["kreg.split+cu_seqlens_cpu"]
            extra.run()
            (c,) = faked["kreg"]
            assert c.keys() - f.keys() == {"cu_seqlens_cpu"} and all(c[n] is f[n] for n in f)
            assert extra.peer == "fla" and c["cu_seqlens_cpu"].device.type == "cpu"
        else:
            skip = impls["flashinfer"]
            assert isinstance(skip, bench.Skip) and "flashinfer" in skip.reason


def test_decode_rows_receive_exactly_flas_keywords(faked):
    import torch

    case = _small_decode(3)
    p = gdn_decode.prepare(case, SM90, torch.device("cpu"))
    impls = {i.name: i for i in p.impls}
    assert tuple(impls) == ("kreg.recurrent", "fla.fused_recurrent", "kreg.recurrent.pool")
    impls["kreg.recurrent"].run(), impls["fla.fused_recurrent"].run()
    (k,), (f,) = faked["kreg"], faked["fla"]
    assert k.keys() == f.keys() and all(k[n] is f[n] for n in f)
    assert f["use_gate_in_kernel"] is True and f["q"].shape == (3, 1, 2, 32)
    faked.clear()
    assert impls["kreg.recurrent.pool"].run() == (None, None)  # not compared
    (pool,) = faked["kreg"]
    assert pool.keys() - f.keys() == {"initial_state_indices"}
    assert pool["initial_state"].shape == (6, 4, 32, 32)  # 2N slots
    slots = pool["initial_state_indices"]
    assert slots.dtype == torch.int32 and len(set(slots.tolist())) == 3
    assert [(x.impl, x.peer) for x in p.pairs] == [("kreg.recurrent", "fla.fused_recurrent")]
    assert impls["kreg.recurrent.pool"].peer == "fla.fused_recurrent" and p.notes


def test_flashinfer_row(monkeypatch):
    """Skipped with the reason where flashinfer does not import, has no GDN prefill, or the
    device is not SM90/SM100; on such a device its inputs are FlashInfer's layouts of the
    case's values and its outputs fla's layouts."""
    import torch
    import torch.nn.functional as F

    case = _small("softplus", B=2)
    x = _inputs(case)
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import fails
    skip = gdn.flashinfer_impl(case.params, x, "cpu")
    assert isinstance(skip, bench.Skip) and skip.reason.startswith("flashinfer not importable")
    bare = types.ModuleType("flashinfer")
    bare.__version__ = "0.0.1"
    monkeypatch.setitem(sys.modules, "flashinfer", bare)
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", None)
    skip = gdn.flashinfer_impl(case.params, x, "cpu")
    assert "flashinfer 0.0.1 has no gdn_prefill.chunk_gated_delta_rule" in skip.reason
    calls: list = []

    def chunk_gated_delta_rule(**kw):
        calls.append(kw)
        n, hv, v = kw["v"].shape
        return torch.zeros(n, hv, v), kw["initial_state"] + 1

    prefill = types.ModuleType("flashinfer.gdn_prefill")
    prefill.chunk_gated_delta_rule = chunk_gated_delta_rule
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", prefill)
    skip = gdn.flashinfer_impl(case.params, x, "cpu")
    assert isinstance(skip, bench.Skip) and "runs on SM90 and SM100" in skip.reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    impl = gdn.flashinfer_impl(case.params, x, torch.device("cuda"))
    o, state = impl.run()
    (kw,) = calls
    B, T, H, HV, K = 2, 64, 2, 4, 32
    assert kw["q"].shape == (B * T, H, K) and kw["v"].shape == (B * T, HV, K)
    torch.testing.assert_close(kw["q"], F.normalize(x["q"], dim=-1).reshape(B * T, H, K))
    torch.testing.assert_close(kw["g"], gdn.activated_gate(case.params, x).exp().reshape(B * T, HV))
    assert kw["g"].dtype == kw["beta"].dtype == torch.float32
    assert kw["cu_seqlens"].tolist() == [0, T, 2 * T] and kw["output_final_state"] is True
    torch.testing.assert_close(kw["initial_state"], x["initial_state"].transpose(-1, -2))
    assert o.shape == (B, T, HV, K)
    torch.testing.assert_close(state, x["initial_state"] + 1)  # read back as [N, HV, K, V]
    assert impl.info["version"] == "0.0.1" and impl.peer is None


def test_compile_plan():
    """Each fla class and FlashInfer head configuration is warmed once, on its smallest case,
    before the kreg jobs; the kreg jobs cover every row's kernels."""
    from kreg.families.kda.builders import kernel_keys

    cases = gdn.cases()
    jobs = gdn.bench_warm_jobs(cases, SM90)
    peers = [(case, n) for case, names in jobs for n in names if n in ("fla", "flashinfer")]
    assert sorted(gdn.fla_class(c.params) for c, n in peers if n == "fla") == sorted(
        {gdn.fla_class(c.params) for c in cases})  # fmt: skip
    assert len([1 for _, n in peers if n == "flashinfer"]) == 3  # H = 4, 16 and 32
    first_kreg = next(i for i, (_, names) in enumerate(jobs) if "kreg.split" in names)
    assert all(n in ("fla", "flashinfer") for _, names in jobs[:first_kreg] for n in names)
    warmed = set()
    for case, names in jobs:
        for n in names:
            if n.startswith("kreg"):
                host = n.endswith(gdn.CPU_OFFSETS)
                sel = gdn.select(case.params, SM90, host_offsets=host)
                warmed |= kernel_keys(gdn.problem_of(case.params, host_offsets=host), sel.spec)
    for c in cases:
        for host in (False, True) if c.params["lengths"] else (False,):
            sel = gdn.select(c.params, SM90, host_offsets=host)
            assert kernel_keys(gdn.problem_of(c.params, host_offsets=host), sel.spec) <= warmed


# --- the runner and the renderer without a GPU ----------------------------------------------------


def test_dry_run_renders(faked, monkeypatch, tmp_path):
    """runner._run_case over GDN's prepare() with the device parts faked, then results.json,
    RESULTS.md and the CLI's --render: the pair table, the skipped FlashInfer row, the notes."""
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(runner, "_release", lambda torch: None)
    monkeypatch.setattr(runner, "peak_extra_bytes", lambda torch, fn: 0)
    monkeypatch.setattr(runner, "host_overhead_us", lambda torch, fn, n, s: {"us": 9.0, "calls": 1})

    class Timer:
        def time(self, impl, **_):
            ms = 2.0 if impl.name.startswith("fla") else 1.0
            return {"ms": ms, "method": "cuda_graph", "reps": 1, "ms_min": ms}

    def measured(scenario, module, cases):
        out = [runner._run_case(c, module.prepare, SM90, "cpu", Timer(), bench.QUICK_BUDGET, None,
                                3000.0, runner._NoBar(), lambda s: None) for c in cases]  # fmt: skip
        return {"scenario": scenario, "key": {"target": SM90, "device": "dry run", "date": "x"},
                "quick": True, "copy_gbs": 3000.0, "flag_rel_err": bench.FLAG_REL_ERR,
                "doc": module.HARNESS_DOC, "meta": {"versions": {"fla-core": "0.6.0"}},
                "cases": out, "elapsed_s": 1.0}  # fmt: skip

    results = measured("gdn", gdn, [_small("resets"), _small("softplus", lengths=(40, 24))])
    rows = {r["impl"]: r for r in results["cases"][1]["rows"]}
    assert rows["kreg.split"]["vs_peer"] == pytest.approx(2.0) and rows["fla"]["vs_peer"] is None
    assert rows["kreg.split+cu_seqlens_cpu"]["peer"] == "fla"
    assert rows["kreg.split"]["rel_err"]["fla"]["o"] == pytest.approx(1e-3, rel=1e-3)
    assert not any(r["flagged"] for r in rows.values())
    written = bench.write_results(results, tmp_path / "gdn")
    md = written["md"].read_text()
    assert md.startswith("# GDN prefill: benchmark results") and "### Like with like" in md
    assert "| case | regime | pair |" in md
    assert "| b1-t64-h2x4-d32-resets | resets | default | kreg.split | 1.000 | fla | 2.000 |" in md
    assert "flashinfer skipped: flashinfer" in md and "`resets` feeds g = -inf rows" in md
    assert "kreg.compat.fla.chunk_gated_delta_rule" in md
    assert "2.00x" in bench.summary(results)
    out = tmp_path / "render"
    assert main(["bench", "--render", str(written["json"]), "--out", str(out)]) == 0
    assert (out / "RESULTS.md").read_text() == md
    dec = measured("gdn-decode", gdn_decode, [_small_decode(2)])
    rows = {r["impl"]: r for r in dec["cases"][0]["rows"]}
    assert rows["kreg.recurrent.pool"]["vs_peer"] == pytest.approx(2.0)
    assert rows["kreg.recurrent.pool"]["rel_err"] == {
        "kreg.recurrent": {},
        "fla.fused_recurrent": {},
    }
    md = bench.markdown(dec)
    assert md.startswith("# GDN decode: benchmark results") and "takes no state indices" in md


def test_bench_list_and_no_gpu(monkeypatch, capsys):
    import torch

    assert main(["bench", "--list", "gdn"]) == 0
    out = capsys.readouterr().out
    assert "gdn (family gdn)" in out and all(c.name in out for c in gdn.cases())
    assert "kreg.split, fla, flashinfer" in out
    assert main(["bench", "--list", "gdn-decode", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in listed["cases"]] == [c.name for c in gdn_decode.cases()]
    assert listed["cases"][0]["params"]["regime"] == "softplus"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("gdn", "gdn-decode"):
        assert main(["bench", name, "--quick"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"kreg: error: kreg bench {name} needs a GPU")


# --- numerics under the Triton interpreter ----------------------------------------------------------


def test_kreg_rows_match_the_float64_oracle_under_interpreter():
    """The kreg rows as the scenarios prepare them (the shims, host offsets, decode) on CPU under the Triton interpreter, against the token-serial float64
    oracle fed the same values: the keywords mean what fla's mean."""
    script = textwrap.dedent("""
        import torch
        from kreg.bench import BenchCase, Impl, rel_rms
        from kreg.families.gdn.bench import decode as d, scenario as s
        from kreg.families.kda import oracles
        from kreg.registry import get_registry
        target = get_registry().targets["sm90"]

        def oracle(params, x):
            g = s.activated_gate(params, x).double()
            g = g.unsqueeze(-1).expand(*g.shape, params["K"]).numpy()
            cu = x["cu_seqlens_cpu"]
            return oracles.token_serial_oracle(
                oracles.l2norm(x["q"].numpy()), oracles.l2norm(x["k"].numpy()),
                x["v"].double().numpy(), g, x["beta"].double().numpy(),
                scale=params["K"] ** -0.5, initial_state=x["initial_state"].double().numpy(),
                cu_seqlens=None if cu is None else cu.numpy())

        def check(case, prepare):
            p = prepare(case, target, torch.device("cpu"))
            x = s.make_inputs(case.params, "cpu", s.kda_bench.seed_of(case))
            o, h = (torch.from_numpy(t) for t in oracle(case.params, x))
            kreg = [i for i in p.impls if isinstance(i, Impl) and i.name.startswith("kreg")]
            for i in kreg:
                out = p.outputs(i.run())
                if out["o"] is None:  # the pooled row
                    continue
                for key, ref in (("o", o), ("state", h)):
                    err = rel_rms(out[key].double(), ref)
                    assert err < 1e-4, (case.name, i.name, key, err)
            print("ok", case.name, len(kreg))

        def small_decode(n):
            _, params = s.case_params(n, 1, 2, 4, regime=d.REGIME, K=32, dtype="fp32")
            return BenchCase(f"n{n}", params, flops=1.0, bytes=1.0, tokens=n, heads=4, bh=4 * n)

        cases = [s.make_case(1, 128, 2, 4, K=32, dtype="fp32", regime="softplus",
                             lengths=(57, 71)),
                 s.make_case(2, 96, 1, 2, K=32, dtype="fp32", regime="resets")]
        for case in cases:
            check(case, s.prepare)
        check(small_decode(3), d.prepare)
    """)
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("ok ") == 3


# --- GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_smoke(tmp_path):
    """A small case of each scenario measured for real (fla's rows where fla imports)."""
    small = gdn.make_case(1, 512, 2, 4, regime="softplus")
    decode = gdn_decode.make_case(4)
    for module, case in ((gdn, small), (gdn_decode, decode)):
        results = module.run([case], quick=True, progress=False, workers=0)
        rows = {r["impl"]: r for r in results["cases"][0]["rows"]}
        kreg = rows[case.impls[0]]
        assert "error" not in kreg and kreg["ms"] > 0, kreg
        if "error" not in rows.get(case.impls[1], {"error": 1}):
            assert kreg["rel_err"][case.impls[1]]["o"] < 1e-2
        written = bench.write_results(results, tmp_path / module.SCENARIO)
        assert written["md"].is_file()


def test_host_time_benchmark_serves_gdn():
    """benchmarks/kda_host_time.py --family gdn calls GDN's shims and fla's GDN entries (the
    names kreg.compat.fla mirrors), with a scalar gate; it parses on a CPU machine."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    from kreg.compat import fla as kreg_fla

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "kda_host_time.py"
    spec = importlib.util.spec_from_file_location("kda_host_time", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.entries("gdn") == (kreg_fla.chunk_gated_delta_rule,
                                    kreg_fla.fused_recurrent_gated_delta_rule)  # fmt: skip
    assert bench.entries("kda") == (kreg_fla.chunk_kda, kreg_fla.fused_recurrent_kda)
    assert bench.FAMILIES["gdn"][3] == 1 and bench.FAMILIES["kda"][3] == bench.K
    out = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(path.parents[1])})  # fmt: skip
    assert out.returncode == 0 and "--family {gdn,kda}" in out.stdout, out.stderr


@pytest.mark.parametrize("scenario", ["gdn", "kda"])
def test_prefill_kernels_times_the_scenarios_own_rows(scenario, monkeypatch):
    """benchmarks/prefill_kernels.py times the rows a scenario's ``prepare`` makes (its inputs
    and keywords: the engines'), each kreg row with its kernels, the peer only with --fla; the
    timing itself is the GPU's (stubbed here, the rows' plumbing run on the CPU)."""
    import importlib.util
    from pathlib import Path

    import attrs
    import torch

    from kreg.bench import Impl

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "prefill_kernels.py"
    spec = importlib.util.spec_from_file_location("prefill_kernels", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    timed = []
    monkeypatch.setattr(tool, "total_ms", lambda fn: timed.append(fn) or 1.0)
    monkeypatch.setattr(tool, "kernel_ms", lambda fn: {"prep": 0.5})
    module = importlib.import_module(tool.SCENARIOS[scenario])
    names = [c.name for c in module.cases()]
    case = next(
        c for c in module.cases() if sum(c.name in n for n in names) == 1
    )  # --cases: substrings
    prepare = module.prepare

    def with_peer(*a):  # fla-core's row as a GPU machine with it would have it
        p = prepare(*a)
        peer = Impl(p.peer, run=lambda: None)
        return attrs.evolve(p, impls=[i if i.name != p.peer else peer for i in p.impls])

    monkeypatch.setattr(module, "prepare", with_peer)
    prepared = module.prepare(case, "sm90", torch.device("cpu"))
    runnable = [i.name for i in prepared.impls if isinstance(i, Impl)]
    assert prepared.peer in runnable
    for with_fla in (False, True):
        timed.clear()
        rows = list(tool.measure(scenario, [case.name], with_fla, "x", device="cpu"))
        want = [n for n in runnable if with_fla or n != prepared.peer]
        assert [r["impl"] for r in rows] == want and len(timed) == len(want)
        assert all(r["case"] == case.name and r["label"] == "x" for r in rows)
        assert all(("kernels" in r) == (r["impl"] != prepared.peer) for r in rows)
    assert any(r["impl"] != prepared.peer for r in rows)
