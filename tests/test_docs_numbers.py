"""The figures the KDA docs quote from a benchmark run agree with that run's results JSON.

RESULTS.md is generated from ``docs/kda/results.json`` (``kreg bench --render``), so it must
equal the render. SPEED.md's goals table and summary, CASE_STUDY.md's and the fused candidate's
opt-in reason's fused/split range quote the same run: each figure is recomputed here from the
JSON and looked up in the text, so a new run committed without its prose (or prose edited
without a run) fails. CASE_STUDY.md's section 1 quotes the earlier 2026-12-02 run, read from git
(skipped where the history is not there).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from kreg import bench
from kreg.families.kda.plugin import FUSED_OPT_IN_REASON

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "kda"
RUN_OF_12_02 = "9400fea^:docs/kda/results.json"  # CASE_STUDY.md section 1


def _rows(results: dict) -> dict[str, dict[str, dict]]:
    return {c["name"]: {r["impl"]: r for r in c["rows"]} for c in results["cases"]}


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads((DOCS / "results.json").read_text())


@pytest.fixture(scope="module")
def speed() -> str:
    return " ".join((DOCS / "SPEED.md").read_text().split())  # prose wraps anywhere


def test_results_md_is_the_render_of_results_json(results):
    assert (DOCS / "RESULTS.md").read_text() == bench.markdown(results, bench.PLOT_NAME)


def test_speed_goal_table(results, speed):
    rows = _rows(results)
    x = {name: r["kreg.split"]["vs_peer"] for name, r in rows.items()}
    n = len(x)
    geomean = math.exp(sum(map(math.log, x.values())) / n)
    assert f"| {geomean:.2f} ({n} cases) |" in speed
    lo, hi = min(x, key=x.get), max(x, key=x.get)
    assert (lo, hi) == ("prod-varlen6-t8192-h32", "b1-t65536-h4")  # the labels quoted
    assert f"{x[lo]:.2f} (production varlen) to {x[hi]:.2f} (B=1 T=65536 H=4)" in speed
    met = sum(v >= 1.5 for v in x.values())
    assert f"no ({met} of {n} shapes at ≥ 1.5)" in speed
    long = rows["b1-t65536-h4"]
    assert (f"{x['b1-t65536-h4']:.2f} ({long['kreg.split']['ms']:.3f} ms vs "
            f"{long['fla']['ms']:.3f})") in speed  # fmt: skip
    short = rows["b1-t2048-h32"]
    assert f"{short['kreg.split']['ms']:.3f} ms (fla {short['fla']['ms']:.3f})" in speed
    assert (f"{short['kreg.split']['host_us']:.0f} µs (fla "
            f"{short['fla']['host_us']:.0f})") in speed  # fmt: skip


def test_speed_floor_and_memory(results, speed):
    case = next(c for c in results["cases"] if c["name"] == "b16-t8192-h32")
    split = _rows(results)["b16-t8192-h32"]["kreg.split"]
    floor_ms = case["bytes"] / results["copy_gbs"] / 1e6
    assert (f"{split['ms'] / floor_ms:.1f}× ({split['ms']:.2f} ms; floor {floor_ms:.2f} ms at the "
            f"run's {results['copy_gbs']:.0f} GB/s copy)") in speed  # fmt: skip
    p = case["params"]
    qkv_mib = p["B"] * p["T"] * (2 * p["H"] * p["K"] + p["HV"] * p["V"]) * 2 / 2**20  # bf16
    extra_mib = split["peak_extra_bytes"] / 2**20
    assert (
        f"{extra_mib / qkv_mib:.2f}× at B=16 T=8192 H=32 ({extra_mib:.0f} MiB vs {qkv_mib:.0f})"
        in speed
    )


def test_speed_summary_by_batch_x_heads(results, speed):
    """The summary's "1.95× at every fixed-length shape of B·H ≥ 128" and the varlen range."""
    fixed, varlen = [], []
    for c in results["cases"]:
        x = _rows(results)[c["name"]]["kreg.split"]["vs_peer"]
        if c["params"]["lengths"]:
            varlen.append(x)
        elif c["bh"] >= 128:
            fixed.append(x)
    assert len(fixed) == 3 and len(varlen) == 2
    assert f"by {min(fixed):.2f}× at every fixed-length shape of B·H ≥ 128" in speed
    assert round(max(fixed), 2) == round(min(fixed), 2)  # "1.95×", one figure for all three
    assert f"only {min(varlen):.2f}-{max(varlen):.2f}×" in speed
    plain = sum("production" not in c["tags"] for c in results["cases"])
    assert f"in the {plain} plain cases" in speed


def test_fused_range_in_case_study_and_opt_in_reason(results):
    rows = _rows(results)
    ratio = {n: r["kreg.fused"]["ms"] / r["kreg.split"]["ms"] for n, r in rows.items()}
    lo, hi = min(ratio.values()), max(ratio.values())
    by_bh = {c["name"]: c["bh"] for c in results["cases"]}
    low_bh = sorted(by_bh[n] for n, v in ratio.items() if round(v, 1) == round(lo, 1))
    assert max(ratio, key=ratio.get) == "b1-t65536-h4"
    text = " ".join((DOCS / "CASE_STUDY.md").read_text().split())
    bhs = ", ".join(map(str, low_bh))
    assert f"fused is {lo:.1f}× (B·H = {bhs}) to {hi:.0f}× (B=1 T=65536 H=4) slower" in text
    assert f"measured {lo:.1f}-{hi:.0f}x slower than the tuned split" in FUSED_OPT_IN_REASON


def test_case_study_section_1_is_the_run_it_names():
    try:
        old = json.loads(subprocess.run(["git", "-C", str(ROOT), "show", RUN_OF_12_02],
                                        capture_output=True, text=True, check=True).stdout)  # fmt: skip
    except (OSError, subprocess.CalledProcessError, json.JSONDecodeError):
        pytest.skip(f"{RUN_OF_12_02} is not in this clone's history")
    assert old["key"]["date"].startswith("2026-12-02")
    text = (DOCS / "CASE_STUDY.md").read_text()
    assert f"`git show {RUN_OF_12_02}`" in " ".join(text.split())
    table = re.findall(r"^\| (.+?) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", text, re.M)
    assert len(table) == 12
    by_bh_ms = {}
    for c in old["cases"]:
        r = {x["impl"]: x for x in c["rows"]}
        split, fused = r["kreg.split"]["ms"], r["kreg.fused"]["ms"]
        by_bh_ms[(c["bh"], f"{split:.2f}")] = (split, fused)
    for _, bh, split_ms, fused_ms, ratio in table:
        split, fused = by_bh_ms[(int(bh), split_ms)]
        assert f"{fused:.2f}" == fused_ms and f"{fused / split:.1f}" == ratio


def test_speed_quotes_the_grid_run():
    """SPEED.md's whole-grid figures (per pair: shapes, shapes at >= 1.0x, floor, geomean, and
    the shapes below 1.0 with their ratios) are recomputed from docs/kda/grid/results.json."""
    from kreg.families.kda.bench.validate import bench_pairs

    lines = (DOCS / "SPEED.md").read_text().splitlines()
    text = " ".join(" ".join(line.removeprefix(">").split()) for line in lines)  # quotes wrap
    prs = bench_pairs(json.loads((DOCS / "grid" / "results.json").read_text()))
    for label in ("default", "bounded"):
        xs = {p["name"]: p["x_fla"] for p in prs if p["pair"] == label and p["x_fla"]}
        geomean = math.exp(sum(map(math.log, xs.values())) / len(xs))
        at_least_1 = sum(x >= 1.0 for x in xs.values())
        assert (f"{len(xs)} shapes, {at_least_1} at ≥ 1.0×, floor {min(xs.values()):.2f}, "
                f"geomean {geomean:.2f}") in text, label  # fmt: skip
        for name, x in xs.items():
            if x < 1.0:
                assert re.search(rf"{re.escape(name)} \([^)]*\b{x:.2f}\b", text), (label, name)
