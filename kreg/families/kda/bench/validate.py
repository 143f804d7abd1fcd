"""Fit the KDA cost model on a sweep's fit shapes and validate it on the holdout shapes (CPU).

``fit_section(sweep)`` is the ``kreg/families/kda/kda_model.json`` section; ``evaluate(sweep,
payload)`` gives, per shape, the spec the model selects (among its pool, as the ranker would),
its measured time, the best measured spec's, their ratio, the dispatcher's choice without a
model, and fla's time with the same promise; ``stats`` and ``render`` make docs/kda/GRID.md and
its plot. Only shapes labelled "fit" ever reach the fitter (``samples(sweep, "fit")``).
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
from pathlib import Path

from .. import model
from .gate_regimes import regime_of
from .sweep import SWEEP_KIND, SWEEP_VERSION, spec_label

GOALS = {"holdout_median": 1.10, "holdout_worst": 1.25, "fla_floor": 1.0, "fla_geomean": 1.5}
PLOT_NAME = "grid.png"


class SweepError(ValueError):
    """Not a sweep file of this version."""


def load_sweep(path) -> dict:
    data = json.loads(Path(path).read_text())
    if data.get("kind") != SWEEP_KIND or data.get("version") != SWEEP_VERSION:
        raise SweepError(f"{path}: not a {SWEEP_KIND} v{SWEEP_VERSION} file")
    return data


def problem_of(entry: dict):
    from .scenario import problem_of as bench_problem

    params = entry["params"]
    return bench_problem(params, bounded=params["gate"] == "bounded")


def _ok(row: dict) -> bool:
    ms = row.get("ms")
    return ms is not None and math.isfinite(ms) and ms > 0 and not row.get("flagged") \
        and "error" not in row  # fmt: skip


def spec_times(entry: dict) -> dict[str, float]:
    """label -> measured ms of the shape's spec rows that ran and agree with the reference."""
    return {r["impl"]: r["ms"] for r in entry["specs"] if _ok(r)}


def role_times(entry: dict, pool=()) -> dict[str, float]:
    """role -> measured ms (a spec several roles name counts for each). ``pool``: the shape's
    (role, spec) pairs now, whose spec counts for its role when measured under another label
    (the dispatcher's choice, or a role the pool lacked when the sweep ran)."""
    out = {}
    for r in entry["specs"]:
        if _ok(r):
            for role in r.get("roles", ()):
                out[role] = r["ms"]
    times = spec_times(entry)
    for role, spec in pool:
        if role not in out and spec_label(spec) in times:
            out[role] = times[spec_label(spec)]
    return out


def samples(sweep: dict, split: str = "fit") -> list[model.Sample]:
    """The shapes labelled ``split`` as the fitter sees them: per measured pool role, its
    features and time; the shape's best measured time."""
    target = _target(sweep["key"]["target"])
    out = []
    for e in sweep["shapes"]:
        if e["params"]["split"] != split:
            continue
        problem, best = problem_of(e), spec_times(e)
        pool = model.pool(problem, target)
        times = role_times(e, pool)
        pairs = {role: (model.pair_features(problem, spec), times[role])
                 for role, spec in pool if role in times}  # fmt: skip
        if pairs:
            out.append(model.Sample(pairs, min(best.values())))
    return out


def fit_payload(sweep: dict) -> dict:
    return model.fit(samples(sweep, "fit"))


def fit_section(sweep: dict, source: str = "") -> dict:
    """The kda_model.json section fitted on the sweep's fit shapes."""
    from ..selection import ABI_VERSION

    key = sweep["key"]
    payload = fit_payload(sweep)
    n_fit = sum(e["params"]["split"] == "fit" for e in sweep["shapes"])
    return {
        "header": {
            "target": key["target"], "triton": key["triton"], "abi": {"kda": ABI_VERSION},
            "candidate": "kda.split", "device": key["device"], "date": key["date"][:10],
            "kind": f"least squares of log2 ms pooled over roles (role offsets, "
                    f"{len(model.FEATURES)} shared shape and role features), ridge "
                    f"{payload['ridge']} by leave-one-out CV, {n_fit} fit shapes of the kda grid",
            "source": source or "benchmarks/kda_grid.py fit", "sweep_complete": sweep["complete"],
        },
        "model": payload,
    }  # fmt: skip


def _target(name: str):
    from kreg.registry import get_registry
    from kreg.registry.targets import resolve

    return resolve(get_registry().targets, name)


def evaluate(sweep: dict, payload: dict) -> list[dict]:
    """Per shape: the model's selection, best measured spec, current choice and fla."""
    from .scenario import PEER, SAFE_PEER

    target = _target(sweep["key"]["target"])
    rows = []
    for e in sweep["shapes"]:
        params = e["params"]
        problem = problem_of(e)
        pool = model.pool(problem, target)
        times, roles = spec_times(e), role_times(e, pool)
        pick = model.choose(payload, problem, target)
        pooled = [roles[r] for r, _ in pool if r in roles]
        floor = min(pooled) if pooled else None  # the best any selection over roles can do
        best_label = min(times, key=times.get) if times else None
        best = times.get(best_label)
        chosen = roles.get(pick[0]) if pick else None
        current = times.get(e["current"])
        peer = SAFE_PEER if params["gate"] == "bounded" else PEER
        fla = e.get("fla", {}).get(peer, {})
        fla_ms = fla.get("ms") if "error" not in fla else None

        def x(ms, fla_ms=fla_ms):
            return fla_ms / ms if fla_ms and ms else None

        rows.append({
            "name": e["name"], "split": params["split"], "gate": params["gate"],
            "kind": params["kind"], "H": params["H"], "HV": params["HV"], "K": params["K"],
            "V": params["V"], "production": params["production"],
            "longest": problem.longest_seq, "chains": problem.num_seqs * problem.heads_v,
            "role": pick[0] if pick else None, "predicted_ms": pick[2] if pick else None,
            "ms": chosen, "best": best_label, "best_ms": best,
            "ratio": chosen / best if chosen and best else None,
            "pool_ratio": floor / best if floor and best else None,
            "current": e["current"], "current_ms": current,
            "current_ratio": current / best if current and best else None,
            "peer": peer, "fla_ms": fla_ms, "x_fla": x(chosen), "x_fla_best": x(best),
            "x_fla_current": x(current),
        })  # fmt: skip
    return rows


def _geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _dist(xs) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median": statistics.median(xs), "worst": max(xs),
            "within_10pct": sum(x <= 1.10 for x in xs), "within_25pct": sum(x <= 1.25 for x in xs)}  # fmt: skip


def stats(rows: list[dict]) -> dict:
    hold = [r for r in rows if r["split"] == "holdout"]
    fit = [r for r in rows if r["split"] == "fit"]
    with_fla = [r for r in rows if r["x_fla"]]
    out = {
        "holdout": _dist([r["ratio"] for r in hold]),
        "holdout_pool": _dist([r["pool_ratio"] for r in hold]),
        "holdout_unmeasured": [r["name"] for r in hold if r["ratio"] is None],
        "fit": _dist([r["ratio"] for r in fit]),
        "current_holdout": _dist([r["current_ratio"] for r in hold]),
        "current_all": _dist([r["current_ratio"] for r in rows]),
        "fla_shapes": len(with_fla),
        "fla_floor": min((r["x_fla"] for r in with_fla), default=None),
        "fla_geomean": _geomean([r["x_fla"] for r in with_fla]),
        "fla_below_1": [r["name"] for r in with_fla if r["x_fla"] < 1.0],
        "fla_floor_best": min((r["x_fla_best"] for r in with_fla), default=None),
        "fla_geomean_best": _geomean([r["x_fla_best"] for r in with_fla]),
        "fla_floor_current": min(
            (r["x_fla_current"] for r in rows if r["x_fla_current"]), default=None
        ),  # fmt: skip
    }
    h = out["holdout"]
    out["goals"] = {
        "holdout_median": h.get("median") is not None and h["median"] <= GOALS["holdout_median"],
        "holdout_worst": h.get("worst") is not None and h["worst"] <= GOALS["holdout_worst"],
        "fla_floor": out["fla_floor"] is not None and out["fla_floor"] >= GOALS["fla_floor"],
        "fla_geomean": out["fla_geomean"] is not None
        and out["fla_geomean"] >= GOALS["fla_geomean"],
    }
    return out


def selections(models: str | None = None, target: str = "sm90") -> dict[str, dict[str, str]]:
    """Per ``kda-grid`` case, the spec label the dispatcher runs for each of its pairs
    ("default", "bounded") with the cost models of ``models`` (``$KREG_MODELS``'s syntax; None:
    the packaged ones). Comparing two models' selections says which cases a refit changed, the
    ones to re-measure with the peer."""
    import os

    from kreg.dispatch import clear_cache

    from ..selection import select_kda
    from . import grid
    from .scenario import PAIR_BOUNDED, pair_names
    from .scenario import problem_of as bench_problem

    saved = os.environ.pop("KREG_MODELS", None)
    if models is not None:
        os.environ["KREG_MODELS"] = models
    clear_cache()
    try:
        tgt = _target(target)
        out = {}
        for case in grid.cases():
            out[case.name] = {
                pair: spec_label(select_kda(bench_problem(case.params, pair == PAIR_BOUNDED),
                                            tgt).spec)
                for pair in pair_names(case.params)
            }  # fmt: skip
        return out
    finally:
        os.environ.pop("KREG_MODELS", None)
        if saved is not None:
            os.environ["KREG_MODELS"] = saved
        clear_cache()


# --- the page and the plot -------------------------------------------------------------------


def _f(x, spec=".3f"):
    return "–" if x is None else format(x, spec)


def bench_pairs(bench: dict) -> list[dict]:
    """Per case and like-with-like pair of a ``kreg bench kda-grid`` results file: the ratio."""
    out = []
    for c in bench.get("cases", []):
        by = {r["impl"]: r for r in c["rows"]}
        for p in c.get("pairs", []):
            a, b = by.get(p["impl"], {}), by.get(p["peer"], {})
            ratio = b["ms"] / a["ms"] if a.get("ms") and b.get("ms") else None
            out.append({"name": c["name"], "pair": p["label"], "kreg_ms": a.get("ms"),
                        "fla_ms": b.get("ms"), "x_fla": ratio,
                        "split": (c.get("params") or {}).get("split"),
                        "decided_by": (a.get("info") or {}).get("decided_by", "")})  # fmt: skip
    return out


def markdown(sweep: dict, rows: list[dict], st: dict, bench: dict | None = None,
             plot: str | None = None, payload: dict | None = None) -> str:  # fmt: skip
    payload = payload or {}
    key = sweep["key"]
    g = st["goals"]
    met = {True: "yes", False: "**no**"}
    h = st["holdout"]
    lines = [
        "# KDA on the broad grid: fitted selection, held-out validation, speed against fla",
        "",
        f"Sweep: {key.get('device')} ({key.get('target')}), {key.get('date')}, Triton "
        f"{key.get('triton')}, torch {key.get('torch')}, fla-core {sweep.get('fla')}; "
        f"{len(sweep['shapes'])} grid shapes measured"
        + ("" if sweep.get("complete") else " (**incomplete**: " + str(sweep.get("stopped")) + ")")
        + f", {sweep.get('elapsed_s', 0):.0f} s. Gates fed: "
        + ", ".join(
            f"`{r}`" for r in sorted({regime_of(e["params"]).name for e in sweep["shapes"]})
        )
        + ' (docs/kda/GATES.md, "Gate regimes the benchmark feeds").',
        "",
        "Regenerate: `python benchmarks/kda_grid.py sweep --out DIR/sweep.json` (one H200 call), "
        "`python benchmarks/kda_grid.py fit DIR/sweep.json` (writes "
        "kreg/families/kda/kda_model.json from the fit shapes only), `python benchmarks/kda_grid.py "
        "validate DIR/sweep.json [--bench RESULTS.json]` (this page).",
        "",
        "**Method.** The grid (`kreg/families/kda/bench/grid.py`) labels every fourth shape in design "
        "order `holdout`. The sweep times, per shape, every spec of its pool (the roles of "
        "`kreg/families/kda/model.py` that resolve to a valid spec for it) and the "
        "dispatcher's choice without a model, then fla-core with the same promise (bounded "
        "shapes: kreg's block anchor against `chunk_kda(..., safe_gate=True, lower_bound=-5)`; "
        "unbounded: kreg's default against fla's default). The model is fitted on the fit "
        "shapes only; each shape's selection is the pool role of lowest predicted time, as the "
        "ranker picks it. The model's form (least squares pooled over roles with shared shape "
        "and role features) and its ridge strength were chosen by leave-one-out "
        "cross-validation over the fit shapes only; the holdout rows below were computed once, "
        "for that choice. Leave-one-out figures of the candidates (median / geomean / worst "
        "selected / best, shapes over 1.25, of 71 fit shapes, sweep of 2026-12-03): one ridge "
        "fit per role on the shape features (the previous model, ridge 0.1) 1.00 / 1.058 / "
        "1.64 / 6; the same with the role features added 1.00 / 1.045 / 1.35 / 4; regret "
        "k-nearest-neighbours over the shape features, k = 3, 1.00 / 1.034 / 1.44 / 4; pooled "
        "(this model) 1.00 / 1.026 / 1.44 / 2. One later rule was not chosen blind: the "
        "segmented scan's workspace, counted per the longest sequence instead of the packed "
        "length (2026-12-04), was found by looking at a holdout shape "
        "(one_long21-t41376-h8x8-d128x128, selected / best 1.75 before); it changed no "
        "coefficient, only which roles that shape's pool admits. A role's measured time is its "
        "spec's row, whatever label the sweep gave it. *Ratio* = the selected spec's measured "
        "ms / the best measured spec's ms on that shape (1.00: the model picked the fastest). "
        "× fla = fla ms / kreg ms.",
        "",
        "| goal | target | measured | met |",
        "|---|---|---|---|",
        f"| holdout: selected / best, median | ≤ {GOALS['holdout_median']:.2f} | "
        f"{_f(h.get('median'))} ({h.get('n', 0)} shapes) | {met[g['holdout_median']]} |",
        f"| holdout: selected / best, worst | ≤ {GOALS['holdout_worst']:.2f} | "
        f"{_f(h.get('worst'))} | {met[g['holdout_worst']]} |",
        f"| every shape, × fla (sweep, the sweep's pair) | ≥ {GOALS['fla_floor']:.1f} | "
        f"{_f(st['fla_floor'], '.2f')} ({st['fla_shapes']} shapes) | {met[g['fla_floor']]} |",
        f"| geomean × fla (sweep) | ≥ {GOALS['fla_geomean']:.1f} | "
        f"{_f(st['fla_geomean'], '.2f')} | {met[g['fla_geomean']]} |",
        "",
        f"Best measured spec of each shape against fla (what the pool allows): floor "
        f"{_f(st['fla_floor_best'], '.2f')}, geomean {_f(st['fla_geomean_best'], '.2f')}. "
        f"The dispatcher without the model (tuning table, then the heuristic): holdout "
        f"selected / best median {_f(st['current_holdout'].get('median'))}, worst "
        f"{_f(st['current_holdout'].get('worst'))}; floor × fla "
        f"{_f(st['fla_floor_current'], '.2f')}. In-sample (fit shapes): median "
        f"{_f(st['fit'].get('median'))}, worst {_f(st['fit'].get('worst'))}.",
    ]
    cv = payload.get("cv", {})
    if cv:
        lines += [
            "",
            "**Cross-validation on the fit shapes** (leave-one-out, selected / best):",
            "",
            "| ridge | median | geomean | worst | > 1.25 |",
            "|---|---|---|---|---|",
        ]
        for a, c in cv.items():
            lines.append(f"| {a}{' (chosen)' if float(a) == payload['ridge'] else ''} | "
                         f"{_f(c['median'])} | {_f(c['geomean'])} | {_f(c['worst'])} | "
                         f"{c['over_1_25']} |")  # fmt: skip
    hp = st["holdout_pool"]
    lines += ["", f"Pool floor on the holdout shapes (the best pool role / the best measured "
              f"spec, what a perfect selection over the roles would give): median "
              f"{_f(hp.get('median'))}, worst {_f(hp.get('worst'))}."]  # fmt: skip
    if st["fla_below_1"]:
        lines += ["", "Below fla with the selected spec: " + ", ".join(st["fla_below_1"]) + "."]
    if st["holdout_unmeasured"]:
        lines += ["", "Holdout shapes whose selected role was not measured (not counted): "
                  + ", ".join(st["holdout_unmeasured"]) + "."]  # fmt: skip
    if bench is not None:
        lines += _bench_section(bench)
    lines += ["", "## Every shape", "",
              "| shape | split | gate | selected role | ms | best spec | best ms | ratio | pool floor | "
              "current ms | fla ms | × fla |", "|" + "---|" * 12]  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["split"] != "holdout", r["name"])):
        lines.append(
            f"| {r['name']} | {r['split']} | {r['gate']} | {r['role'] or '–'} | {_f(r['ms'])} | "
            f"{r['best'] or '–'} | {_f(r['best_ms'])} | {_f(r['ratio'], '.2f')} | "
            f"{_f(r['pool_ratio'], '.2f')} | "
            f"{_f(r['current_ms'])} | {_f(r['fla_ms'])} | {_f(r['x_fla'], '.2f')} |"
        )
    if plot:
        lines += ["", f"![speedup over fla across the grid's axes]({plot})"]
    lines.append("")
    return "\n".join(lines)


def _bench_section(bench: dict) -> list[str]:
    prs = bench_pairs(bench)
    key = bench.get("key", {})
    out = ["", "## Confirmed by `kreg bench kda-grid` (the dispatcher with the fitted model)", "",
           f"{key.get('device')}, {key.get('date')}, Triton {key.get('triton')}"
           + (", quick" if bench.get("quick") else "") + "."]  # fmt: skip
    for label in sorted({p["pair"] for p in prs}):
        xs = [p["x_fla"] for p in prs if p["pair"] == label and p["x_fla"]]
        below = [p["name"] for p in prs if p["pair"] == label and p["x_fla"] and p["x_fla"] < 1]
        out.append(f"- pair **{label}**: {len(xs)} shapes, floor {_f(min(xs, default=None), '.2f')}"
                   f", geomean {_f(_geomean(xs), '.2f')}"
                   + (f"; below 1.0: {', '.join(below)}" if below else ""))  # fmt: skip
    if bench.get("not_measured"):
        out.append(f"- not measured (deadline): {len(bench['not_measured'])} cases")
    return out


def plot(rows: list[dict], path: Path, bench: dict | None = None) -> bool:
    """× fla of the selected spec against the longest sequence and the chains (sequences x
    value heads), by head dim and split; and the holdout ratios. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    dims = sorted({(r["K"], r["V"]) for r in rows})
    colors = {d: plt.cm.viridis(i / max(1, len(dims) - 1)) for i, d in enumerate(dims)}
    for ax, xkey, xlabel in ((axes[0], "longest", "longest sequence (tokens)"),
                             (axes[1], "chains", "sequences × value heads")):  # fmt: skip
        for d in dims:
            for split, marker in (("fit", "o"), ("holdout", "^")):
                pts = [(r[xkey], r["x_fla"]) for r in rows
                       if (r["K"], r["V"]) == d and r["split"] == split and r["x_fla"]]  # fmt: skip
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.scatter(xs, ys, color=colors[d], marker=marker, s=28,
                               label=f"K={d[0]} V={d[1]} {split}")  # fmt: skip
        ax.axhline(1.0, color="red", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("× fla (selected spec, sweep)")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=6, ncol=2)
    hold = sorted((r for r in rows if r["split"] == "holdout" and r["ratio"]),
                  key=lambda r: r["ratio"])  # fmt: skip
    axes[2].barh(range(len(hold)), [r["ratio"] for r in hold], color="steelblue")
    axes[2].set_yticks(range(len(hold)))
    axes[2].set_yticklabels([r["name"] for r in hold], fontsize=5)
    axes[2].axvline(1.10, color="orange", lw=1)
    axes[2].axvline(1.25, color="red", lw=1)
    axes[2].set_xlabel("holdout: selected / best measured")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render(sweep: dict, out_dir, bench: dict | None = None) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = fit_payload(sweep)
    rows = evaluate(sweep, payload)
    st = stats(rows)
    written = {}
    png = out / PLOT_NAME
    if plot(rows, png, bench):
        written["png"] = png
    md = out / "GRID.md"
    text = markdown(sweep, rows, st, bench, png.name if "png" in written else None, payload)
    if "png" not in written:
        text += "\n(matplotlib not installed: no plot.)\n"
    md.write_text(text)
    written["md"] = md
    (out / "grid_validation.json").write_text(json.dumps(
        {"generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"), "stats": st,
         "rows": rows}, indent=1, default=str) + "\n")  # fmt: skip
    written["json"] = out / "grid_validation.json"
    return written
