"""``kreg bench``: the KDA scenario's cases and formulas, the renderer, the CLI (CPU); one GPU
smoke run under ``@pytest.mark.gpu``."""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

from kreg import bench
from kreg.bench import runner
from kreg.cli import main
from kreg.families.kda.bench import gate_regimes
from kreg.families.kda.bench import scenario as kda

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
    by = {(kda.shape_name(c.params["B"], c.params["T"], c.params["H"],
                          lengths=c.params["lengths"], production=c.params["production"],
                          K=c.params["K"]), c.params["regime"]): c for c in cases}  # fmt: skip
    assert len(by) == len(cases)
    for c in cases:
        p = c.params
        assert (p["dtype"], p["lower_bound"], p["HV"], p["K"]) == ("bf16", -5.0, p["H"], p["V"])
        assert c.name.endswith("-" + p["regime"])
    for B, T, H in kda.MAIN_SHAPES:
        for r in ("softplus", "softplus_pre", "bounded", "legacy"):
            assert (f"b{B}-t{T}-h{H}", r) in by
    for shape in ("b1-t8192-h32", "b4-t8192-h32", "varlen6-t8192-h32"):
        assert {r for s, r in by if s == shape} == set(gate_regimes.BY_NAME), shape
    sweep = [c for c in cases if "sweep" in c.tags]
    assert sorted(c.bh for c in sweep) == [4, 8, 16, 32, 64, 128, 256, 512]
    assert {c.params["regime"] for c in sweep} == {"softplus"}  # one series per row in the plot
    assert all(c.params["T"] == 8192 for c in sweep)
    for c in cases:
        if c.params["lengths"]:
            assert c.params["lengths"] == [1300, 547, 2048, 963, 271, 3063]
            assert c.params["B"] == 1 and c.params["T"] == 8192 and c.params["H"] == 32
    prod = {(s, r) for s, r in by if s.startswith("prod-")}
    assert prod == {(s, r) for s in ("prod-b1-t8192-h32", "prod-varlen6-t8192-h32")
                    for r in ("bounded", "softplus")}  # fmt: skip
    dims = {c.params["K"] for c in cases}
    assert {96, 128, 192, 256} == dims
    # extras (fused, spec variants) on the legacy gates only, where both pairs run
    for c in cases:
        variants = [i for i in c.impls if i.startswith("split.bounded[")]
        if c.params["regime"] == "legacy" and not c.params["production"]:
            assert 2 <= len(variants) <= 3 and "kreg.fused.bounded" in c.impls
        else:
            assert not variants and "kreg.fused.bounded" not in c.impls


def test_pairs_follow_the_regime():
    for c in kda.cases():
        p = c.params
        regime = p["regime"]
        pairs = {x.label: x for x in kda.pairs_of(p)}
        if regime == "bounded" or (regime == "legacy" and p["production"]):
            assert set(pairs) == {"bounded"}  # a sigmoid bound in the kernel needs its bound
            with pytest.raises(ValueError, match="has no default pair"):
                kda.problem_of(p, bounded=False)
        elif regime == "legacy":
            assert set(pairs) == {"default", "bounded"}
        else:  # gates below -5 (or -inf): no bound to promise
            assert set(pairs) == {"default"}
            with pytest.raises(ValueError, match="has no bounded pair"):
                kda.problem_of(p, bounded=True)
        if "bounded" in pairs:
            b = pairs["bounded"]
            assert (b.impl, b.peer) == ("kreg.split.bounded", "fla.safe_gate")
            assert "safe_gate=True, lower_bound=-5.0" in b.text
            assert kda.problem_of(p, bounded=True).gate_lower_bound == -5.0
        if "default" in pairs:
            d = pairs["default"]
            assert (d.impl, d.peer) == ("kreg.split", "fla") and "safe_gate" not in d.text
            assert kda.problem_of(p, bounded=False).gate_lower_bound is None
        for x in pairs.values():
            assert "kreg.compat.fla.chunk_kda(**kw)" in x.text and f"`{regime}` gates" in x.text
            assert ("use_gate_in_kernel=True" in x.text) == (
                regime in ("bounded", "softplus", "heavy") or (regime == "legacy"
                                                              and p["production"]))  # fmt: skip
            assert ("cu_seqlens (device only)" in x.text) == bool(p["lengths"])
            assert "cu_seqlens_cpu" not in x.text
        # a varlen case adds one host-offsets kreg row per pair, against the pair's peer
        cpu = [i for i in c.impls if i.endswith(kda.CPU_OFFSETS)]
        assert cpu == ([x.impl + kda.CPU_OFFSETS for x in pairs.values()]
                       if p["lengths"] else [])  # fmt: skip


def test_quick_set_covers_every_regime_on_few_fla_classes():
    """The affordable device run: every new regime, the engines' head dims and varlen, on at
    most 10 fla autotuning classes (fla tunes per class in the measuring process)."""
    quick = [c for c in kda.cases() if kda.QUICK in c.tags]
    assert bench.filter_cases(kda.cases(), ["quick"]) == quick
    assert 10 <= len(quick) <= 20
    assert {c.params["regime"] for c in quick} == set(kda.NEW_REGIMES)
    assert any(c.params["lengths"] for c in quick) and any(c.params["K"] == 256 for c in quick)
    assert any(c.params["T"] == 2048 for c in quick) and any(c.params["H"] == 4 for c in quick)
    classes = {kda.fla_class(c.params, pair) for c in quick for pair in kda.pair_names(c.params)}
    assert len(classes) <= 10, sorted(classes)
    pairs = {pair for c in quick for pair in kda.pair_names(c.params)}
    assert pairs == {"default", "bounded"}
    # the compile plan warms each fla class once (fla autotunes per class), every row's kreg
    # kernels, and a legacy case's extra rows

    jobs = kda.bench_warm_jobs(quick)
    fla = [kda.fla_class(case.params, "bounded" if n == "fla.safe_gate" else "default")
           for case, names in jobs for n in names if n.startswith("fla")]  # fmt: skip
    assert sorted(fla) == sorted(classes)
    legacy = next(c for c in kda.cases() if c.name == "b1-t8192-h32-legacy")
    warmed = {n for case, names in kda.bench_warm_jobs([legacy]) for n in names}
    assert warmed == {n for n in legacy.impls if not n.endswith(kda.CPU_OFFSETS)}


# --- formulas -----------------------------------------------------------------------------------


def test_flop_formula_by_hand():
    # K = V = 128, C = 64: 6*128*128 + 2*64*(3*128 + 2*128) + 64*64/3
    per = 98304 + 81920 + 4096 / 3
    assert kda.kda_flops(1, 1) == pytest.approx(per)
    assert per == pytest.approx(181589.333, abs=1e-3)
    case = next(c for c in kda.cases() if c.name == "b1-t2048-h32-softplus")
    assert case.flops == pytest.approx(2048 * 32 * per)


def test_byte_formula_by_hand():
    assert kda.kda_bytes(1, 1, 1, final_state=False) == 10 * 128 + 2 == 1282
    plain = next(c for c in kda.cases() if c.name == "b1-t2048-h32-legacy")
    # q, k, v, g, o in bf16 + beta, then the fp32 final state of 32 heads
    assert plain.bytes == 2048 * 32 * 1282 + 32 * 128 * 128 * 4 == 86_114_304
    # the raw gate in bf16 + A_log [32] and dt_bias [32*128] fp32
    gate = (32 + 32 * 128) * 4
    assert next(c for c in kda.cases() if c.name == "b1-t2048-h32-softplus").bytes == (
        plain.bytes + gate
    )
    # a precomputed fp32 g: 2 more bytes per element
    pre = next(c for c in kda.cases() if c.name == "b1-t2048-h32-softplus_pre")
    assert pre.bytes == plain.bytes + 2048 * 32 * 128 * 2
    prod = next(c for c in kda.cases() if c.name == "prod-varlen6-t8192-h32-bounded")
    # + fp32 initial state of 6 sequences
    assert prod.bytes == 8192 * 32 * 1282 + 6 * 32 * 128 * 128 * 8 + gate


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


def _small(regime="legacy", **kw):
    return kda.make_case(1, 64, 2, head_dim=32, dtype="fp32", regime=regime, **kw)


def _inputs(case, seed=1):
    import torch

    return kda.make_inputs(case.params, torch.device("cpu"), seed)


def test_regime_table():
    """One frozen table; names unique; every regime's pairs, formula and parameters stated; the
    GATES.md block is its render."""
    names = [r.name for r in gate_regimes.REGIMES]
    assert len(set(names)) == len(names) and set(kda.NEW_REGIMES) < set(names)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        gate_regimes.REGIMES[0].mean = 0.0  # type: ignore[misc]
    for r in gate_regimes.REGIMES:
        assert r.activation in gate_regimes.FORMULAS and r.source and r.pairs
        assert set(r.pairs) <= {"default", "bounded"}
        if "bounded" in r.pairs:  # values that keep the promise g >= -5
            assert r.activation == "sigmoid_bound" and not r.resets
    with pytest.raises(ValueError, match="unknown gate regime 'nope'"):
        gate_regimes.regime_of({"regime": "nope"})
    assert gate_regimes.regime_of({}).name == "legacy"  # results and benches before the regimes
    text = (ROOT / gate_regimes.GATES_MD).read_text()
    assert gate_regimes.rendered(text) == text, (
        "docs/kda/GATES.md's regime table is stale: python -m kreg.families.kda.bench.gate_regimes"
    )
    assert "## Gate regimes the benchmark feeds" in text
    for r in gate_regimes.REGIMES:
        assert f"| `{r.name}` |" in text


@pytest.mark.parametrize("regime", [r.name for r in gate_regimes.REGIMES])
def test_inputs_per_regime(regime):
    """Each regime's gate statistics (per token and channel, ~250k values) and how it is passed."""
    import torch
    import torch.nn.functional as F

    case = kda.make_case(1, 512, 32, head_dim=128, regime=regime)  # bf16 as the scenario
    x = _inputs(case)
    r = gate_regimes.BY_NAME[regime]
    g = x["g"]
    if r.in_kernel:  # the raw gate in bf16, activated by the kernel from A_log and dt_bias
        assert g.dtype == torch.bfloat16 and x["A_log"].shape == (32,)
        assert x["dt_bias"].shape == (32 * 128,) and x["A_log"].dtype == torch.float32
        g = gate_regimes.activate(r.activation, g, x["A_log"], x["dt_bias"])
    else:
        assert x["A_log"] is None and x["dt_bias"] is None
        assert g.dtype == (torch.float32 if r.g_fp32 else torch.bfloat16)
    g = g.float()
    finite = g[torch.isfinite(g)]
    assert bool((g <= 0).all())
    assert finite.mean().item() == pytest.approx(r.mean, rel=0.15)
    if "bounded" in r.pairs:
        assert finite.min().item() >= -5.0
    if regime == "heavy":
        assert finite.mean().item() <= -5 and finite.min().item() < -40
    if regime == "softplus":
        assert finite.min().item() < -10  # an unbounded tail
        # the formula with its own A_log and dt_bias, and softplus_pre is that, precomputed
        want = -x["A_log"].exp().view(32, 1) * F.softplus(
            x["g"].float() + x["dt_bias"].view(32, 128)
        )
        torch.testing.assert_close(g, want)
        pre = _inputs(kda.make_case(1, 512, 32, regime="softplus_pre"))
        assert torch.equal(pre["g"], want) and pre["g"].dtype == torch.float32
        for k in ("q", "k", "v", "beta"):  # one seed per shape: the same tensors
            assert torch.equal(pre[k], x[k])
    if regime == "resets":
        rows = (~torch.isfinite(g)).all(dim=(-2, -1))  # whole token rows: every head, channel
        assert 1 <= int(rows.sum()) <= gate_regimes.RESET_ROWS
        assert bool((g[~rows] > -math.inf).all())
        assert g[torch.isinf(g)].eq(-math.inf).all()
    else:
        assert bool(torch.isfinite(g).all())


def test_legacy_inputs_are_the_earlier_benchmarks():
    """``legacy`` (the default) draws what make_inputs drew before the regimes, on the same seed:
    g = -5 sigmoid(exp(A_log)(x + dt_bias)) in bf16, A_log = log U(0.5, 2), dt_bias ~ 0.5 N."""
    import torch

    case = kda.make_case(1, 64, 2, head_dim=32)
    assert case.params["seed"] == kda._seed("b1-t64-h2-d32")  # the shape's name, as before
    x = _inputs(case, 7)
    gen = torch.Generator().manual_seed(7)
    for _ in range(2):
        torch.randn((1, 64, 2, 32), generator=gen)  # q, k
    torch.randn((1, 64, 2, 32), generator=gen, dtype=torch.bfloat16)  # v
    A_log = torch.empty(2).uniform_(0.5, 2.0, generator=gen).log_()
    dt_bias = 0.5 * torch.randn(64, generator=gen)
    raw = torch.randn((1, 64, 2, 32), generator=gen, dtype=torch.bfloat16)
    z = A_log.exp().view(2, 1) * (raw.float() + dt_bias.view(2, 32))
    assert torch.equal(x["g"], (-5.0 * torch.sigmoid(z)).to(torch.bfloat16))


def test_varlen_offsets_reach_both_sides_on_the_device_only():
    import torch

    for regime in ("softplus", "bounded", "legacy"):
        case = _small(regime, lengths=(40, 24))
        x = _inputs(case)
        assert x["cu_seqlens_cpu"].tolist() == [0, 40, 64] and x["cu_seqlens"].dtype == torch.int64
        for pair in kda.pair_names(case.params):
            kw = kda.fla_kwargs(case.params, x, pair)
            assert kw["cu_seqlens"] is x["cu_seqlens"] and "cu_seqlens_cpu" not in kw


def test_argument_mapping():
    """fla's keywords per regime and pair; kreg's own (kda_prefill) keywords for the launch-path
    rows say the same; both bind to their signatures."""
    from kreg.compat.fla import chunk_kda as compat_chunk_kda
    from kreg.families.kda import kda_prefill

    for regime in gate_regimes.BY_NAME:
        for prod in (False, True):
            case = _small(regime, production=prod)
            x = _inputs(case)
            r = gate_regimes.BY_NAME[regime]
            for pair in kda.pair_names(case.params):
                f = kda.fla_kwargs(case.params, x, pair)
                inspect.signature(compat_chunk_kda).bind(**f)
                assert f["scale"] == 32**-0.5 and f["output_final_state"] is True
                assert f["g"] is x["g"] and f["beta"] is x["beta"]
                assert ("initial_state" in f) == prod and ("cu_seqlens" not in f)
                assert f.get("use_qk_l2norm_in_kernel", False) == prod
                assert f.get("use_beta_sigmoid_in_kernel", False) == prod
                in_kernel = r.gate_in_kernel(prod)
                assert f.get("use_gate_in_kernel", False) == in_kernel
                if in_kernel:
                    assert f["A_log"] is x["A_log"] and f["dt_bias"] is x["dt_bias"]
                else:
                    assert "A_log" not in f and "dt_bias" not in f
                bounded = pair == "bounded"
                assert (f.get("safe_gate"), f.get("lower_bound")) == ((True, -5.0) if bounded
                                                                      else (None, None))  # fmt: skip
                kw = kda.kreg_kwargs(case.params, x, bounded=bounded)
                inspect.signature(kda_prefill).bind(**kw)
                assert kw["gate_lower_bound"] == (-5.0 if bounded else None)
                assert kw["gate_activation"] == (r.activation if in_kernel else "none")
                assert kw["use_qk_l2norm"] == kw["use_beta_sigmoid"] == prod
            missing = {"default", "bounded"} - set(kda.pair_names(case.params))
            for pair in missing:
                with pytest.raises(ValueError, match=f"has no {pair} pair"):
                    kda.fla_kwargs(case.params, x, pair)
    try:
        chunk_kda, _ = kda.load_fla()
    except Exception:  # pragma: no cover
        chunk_kda = None
    if chunk_kda is not None:  # the keywords reach fla's signature (A_log via **kwargs)
        for regime in gate_regimes.BY_NAME:
            case = _small(regime, lengths=(40, 24))
            x = _inputs(case)
            for pair in kda.pair_names(case.params):
                inspect.signature(chunk_kda).bind(**kda.fla_kwargs(case.params, x, pair))


def test_kreg_rows_receive_exactly_flas_keywords(monkeypatch):
    """prepare() on CPU with both chunk_kda faked: per pair the kreg row calls
    kreg.compat.fla.chunk_kda with the very keywords (the same objects) the fla row gives fla;
    a varlen case's extra kreg row adds cu_seqlens_cpu and nothing else."""
    import torch

    from kreg.compat import fla as compat_fla

    calls: dict[str, list] = {"kreg": [], "fla": []}

    def fake(side):
        def chunk_kda(**kw):
            calls[side].append(kw)
            return torch.zeros(1), torch.zeros(1)

        return chunk_kda

    monkeypatch.setattr(compat_fla, "chunk_kda", fake("kreg"))
    monkeypatch.setattr(kda, "load_fla", lambda: (fake("fla"), "0.6.0"))
    for regime in gate_regimes.BY_NAME:
        for lengths in (None, (40, 24)):
            case = _small(regime, lengths=lengths, extras=False)
            p = kda.prepare(case, "sm90", torch.device("cpu"))
            impls = {i.name: i for i in p.impls}
            assert tuple(impls) == case.impls
            for pair in p.pairs:
                calls["kreg"].clear(), calls["fla"].clear()
                impls[pair.impl].run()
                impls[pair.peer].run()
                (k,), (f,) = calls["kreg"], calls["fla"]
                assert k.keys() == f.keys() and all(k[n] is f[n] for n in f), (regime, pair)
                assert "cu_seqlens_cpu" not in k and ("cu_seqlens" in k) == bool(lengths)
                assert impls[pair.impl].call is impls[pair.impl].run  # host time: the same call
                assert impls[pair.impl].peer == pair.peer
                if lengths:
                    calls["kreg"].clear()
                    extra = impls[pair.impl + kda.CPU_OFFSETS]
                    extra.run()
                    (c,) = calls["kreg"]
                    assert c.keys() - f.keys() == {"cu_seqlens_cpu"} and extra.peer == pair.peer
                    assert c["cu_seqlens_cpu"].device.type == "cpu"
                    assert all(c[n] is f[n] for n in f)
            assert p.references == (p.pairs[0].impl, p.pairs[0].peer)
            assert bool(p.notes) == (regime == "resets")


def test_prepared_impls_agree_under_interpreter():
    """prepare() on CPU under the Triton interpreter: every kreg implementation runs (the
    compat call and the launch path) and agrees with the pair's kreg row."""
    script = textwrap.dedent("""
        import torch
        from kreg.bench import Impl, rel_rms
        from kreg.families.kda.bench import scenario as kda
        from kreg.registry import get_registry
        target = get_registry().targets["sm90"]
        # long enough for the chunked form (shorter ones are served by kda.recurrent)
        for case in (kda.make_case(1, 128, 1, head_dim=32, dtype="fp32"),
                     kda.make_case(1, 128, 1, head_dim=32, dtype="fp32", regime="heavy",
                                   lengths=(57, 71)),
                     kda.make_case(1, 128, 1, head_dim=32, dtype="fp32", production=True,
                                   regime="bounded", lengths=(57, 71))):
            p = kda.prepare(case, target, torch.device("cpu"))
            impls = [i for i in p.impls if isinstance(i, Impl) and not i.name.startswith("fla")]
            names = [i.name for i in impls]
            assert tuple(n for n in case.impls if not n.startswith("fla")) == tuple(names)
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
    assert r.stdout.count("ok ") == 3


# --- the runner's ratios (device parts faked) ---------------------------------------------------


def test_run_case_ratios_within_pairs(monkeypatch):
    """Each row's × peer is taken against its own pair's peer, the peers get none, and the case
    records its pairs and references for the renderer."""
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(runner, "_release", lambda torch: None)
    monkeypatch.setattr(runner, "peak_extra_bytes", lambda torch, fn: 0)
    monkeypatch.setattr(runner, "host_overhead_us", lambda torch, fn, n, s: {"us": 1.0, "calls": 1})
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
    res = runner._run_case(case, prepare, None, "cpu", Timer(), bench.QUICK_BUDGET, None, 4000.0,
                          runner._NoBar(), lambda s: None)  # fmt: skip
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
    # a row that could not be captured says so in the pair table (and its note says why)
    rows["kreg.split"].update(method="do_bench", note="CUDA graph capture failed (x)")
    md = bench.markdown({"cases": [res]})
    assert "| kreg.split | 2.000 (events) | fla | 3.000 |" in md
    assert "kreg.split: CUDA graph capture failed (x)" in md


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
        # as a run before the gate regimes wrote it (no regime recorded)
        case = kda.make_case(b, 8192, h, tags=("sweep",), name=f"b{b}-t8192-h{h}")
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
        params = {k: v for k, v in case.params.items() if k not in ("regime", "seed")}
        cases.append({"name": case.name, "params": params, "flops": case.flops,
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
    assert "**default**: `kreg.split` against `fla`: `legacy` gates, no promise" in md
    assert "`kreg.compat.fla.chunk_kda(**kw)` against fla-core's `chunk_kda(**kw)`" in md
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
    case = kda.make_case(1, 8192, 32, production=True, tags=("production",), name="prod-b1")
    results["cases"] = [{
        "name": case.name, "params": dict(case.params), "tags": [], "rows": [
            {"impl": "kreg.split.bounded", "ms": 1.0, "peer": "fla.safe_gate", "vs_peer": 1.5},
            {"impl": "fla.safe_gate", "ms": 1.5, "peer": None, "vs_peer": None}],
        "references": ["kreg.split.bounded", "fla.safe_gate"],
        "pairs": [attrs.asdict(p) for p in kda.pairs_of(case.params)], "peer": "fla.safe_gate",
    }]  # fmt: skip
    md = bench.markdown(results)
    # the case records its gate regime: the pair table has a regime column
    assert "| case | regime | pair | kreg row |" in md
    assert "| prod-b1 | legacy | bounded | kreg.split.bounded | 1.000 | fla.safe_gate |" in md
    assert "| default | kreg.split |" not in md and "safe_gate=True, lower_bound=-5.0" in md
    assert bench.pair_rows(results) == [["prod-b1", "legacy", "bounded", "kreg.split.bounded",
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
    assert "| case | pair |" in bench.markdown(_synthetic(paired=True))  # no regimes recorded
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
    assert "kreg.split, fla, kreg.split+cu_seqlens_cpu" in flat.replace("+ ", "+")
    r = subprocess.run([sys.executable, "-m", "kreg", "bench", "--list", "kda", "--cases",
                        "quick"], capture_output=True, text=True, env=_env(), timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    quick = [c.name for c in kda.cases() if "quick" in c.tags]
    listed = [c.name for c in kda.cases() if c.name in r.stdout.split()]
    assert listed == quick


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
    cases = {c["name"]: c for c in scenario["cases"]}
    assert set(cases) == {f"prod-{s}-{r}" for s in ("b1-t8192-h32", "varlen6-t8192-h32")
                          for r in ("bounded", "softplus")}  # fmt: skip
    assert cases["prod-b1-t8192-h32-bounded"]["impls"] == ["kreg.split.bounded", "fla.safe_gate"]
    assert cases["prod-b1-t8192-h32-softplus"]["params"]["regime"] == "softplus"


# --- GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_smoke(tmp_path):
    case = kda.make_case(1, 512, 2, tags=("sweep",))  # legacy gates: both pairs
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
