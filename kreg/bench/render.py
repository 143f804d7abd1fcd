"""Results for reading: ``RESULTS.md``, the sweep plot and the summary line, from the results
JSON alone."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .cases import (
    FLAG_REL_ERR,
    ResultsError,
)
from .results import _references, _refs_by, validate_results, write_json

PLOT_NAME = "bh_sweep.png"


def write_results(results: dict, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write results.json, RESULTS.md and the sweep plot (when matplotlib is present)."""
    out = Path(out_dir)
    path = write_json(results, out)
    written = {"json": path}
    written.update(render(path, out))
    return written


def render(json_path: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> dict:
    """Regenerate RESULTS.md (and the plot) from a results JSON."""
    json_path = Path(json_path)
    try:
        results = json.loads(json_path.read_text())
    except json.JSONDecodeError as e:
        raise ResultsError(f"not JSON ({e})") from e
    validate_results(results)
    out = Path(out_dir) if out_dir is not None else json_path.parent
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    plot = out / PLOT_NAME
    plot_ok = plot_sweep(results, plot)
    if plot_ok:
        written["png"] = plot
    md = out / "RESULTS.md"
    md.write_text(markdown(results, plot.name if plot_ok else None))
    written["md"] = md
    return written


def _fmt(x, spec: str, empty: str = "–") -> str:
    if x is None:
        return empty
    if isinstance(x, str):
        return x
    if isinstance(x, float) and not math.isfinite(x):
        return "inf"
    return format(x, spec)


def _err_text(row: dict, ref: str) -> str:
    errs = row.get("rel_err", {}).get(ref)
    if not errs:
        return "–"
    parts = []
    for key, v in errs.items():
        v = float(v) if isinstance(v, str) else v
        mark = " ⚠" if not (v <= FLAG_REL_ERR) else ""
        parts.append(f"{key} {_fmt(v, '.1e')}{mark}")
    return ", ".join(parts)


LEGACY_NOTE = (
    "**Measured before the like-with-like pairing (2026-12-03 audit).** Each case here has one "
    'peer row and every "× peer" is taken against it, whatever promise about the gates each '
    "row made: for `kda`, kreg's rows ran bounded (`gate_lower_bound=-5.0`, the block anchor) "
    "while the `fla` row of the plain cases is fla-core's unbounded default `chunk_kda(...)` "
    "(only the production cases pair bounded with bounded: `safe_gate=True, "
    "lower_bound=-5.0`). Those ratios are not like with like; a rerun of the scenario times "
    "kreg default against fla default and kreg bounded against fla `safe_gate` side by side."
)


TABLE_HEADER = [
    "case", "impl", "ms", "TFLOP/s", "GB/s", "% copy BW", "host µs", "extra MiB",
    "× peer", "peer", "rel err vs ref 1", "rel err vs ref 2", "timing",
]  # fmt: skip


PAIR_HEADER = ["case", "pair", "kreg row", "kreg ms", "peer row", "peer ms", "× peer"]


REGIME = "regime"  # a case param (the gates it fed): a column of the pair table where present


def is_paired(results: dict) -> bool:
    """Whether the results come from the like-with-like runner (cases record their pairs)."""
    cases = results.get("cases") or []
    return any("pairs" in c for c in cases)


def _row_peer(case: dict, row: dict) -> str | None:
    return row["peer"] if "peer" in row else case.get("peer")


def table_rows(results: dict) -> list[list[str]]:
    rows = []
    for case in results.get("cases", []):
        refs = _references(case) + [None, None]
        first = True
        for r in case["rows"]:
            name = case["name"] if first else ""
            first = False
            if "error" in r and "ms" not in r:
                rows.append([name, r["impl"], "failed: " + r["error"]]
                            + [""] * (len(TABLE_HEADER) - 3))  # fmt: skip
                continue
            frac = r.get("bw_fraction")
            ratio = r.get("vs_peer")
            peer = _row_peer(case, r)
            rows.append([
                name, r["impl"] + (" ⚠" if r.get("flagged") else ""), _fmt(r.get("ms"), ".3f"),
                _fmt(r.get("tflops"), ".1f"), _fmt(r.get("gbs"), ".0f"),
                _fmt(None if frac is None else 100 * frac, ".1f"),
                _fmt(r.get("host_us"), ".0f"),
                _fmt(None if r.get("peak_extra_bytes") is None
                     else r["peak_extra_bytes"] / 2**20, ".0f"),
                _fmt(ratio, ".2f"), peer if ratio is not None and peer else "–",
                _err_text(r, refs[0]) if refs[0] else "–",
                _err_text(r, refs[1]) if refs[1] else "–",
                r.get("method", "–"),
            ])  # fmt: skip
    return rows


def _pair_ms(row: dict) -> str:
    """A pair row's ms, marked where it is not a CUDA-graph median (capture failed: events
    around eager calls, host work included; the row's note says why)."""
    ms = _fmt(row.get("ms"), ".3f", "not timed")
    return ms + (" (events)" if row.get("ms") and row.get("method") == "do_bench" else "")


def pair_header(results: dict) -> list[str]:
    return PAIR_HEADER[:1] + [REGIME] * _has_regimes(results) + PAIR_HEADER[1:]


def _has_regimes(results: dict) -> bool:
    return any(REGIME in (c.get("params") or {}) for c in results.get("cases", []))


def pair_rows(results: dict) -> list[list[str]]:
    """One row per case and like-with-like pair: both rows' ms and the ratio within the pair
    (and the case's gate regime, where the cases record one)."""
    regimes = _has_regimes(results)
    rows = []
    for case in results.get("cases", []):
        by = {r["impl"]: r for r in case["rows"]}
        first = True
        for p in case.get("pairs", []):
            a, b = by.get(p["impl"], {}), by.get(p["peer"], {})
            ms_a, ms_b = a.get("ms"), b.get("ms")
            ratio = ms_b / ms_a if ms_a and ms_b else None
            rows.append([
                case["name"] if first else "",
                *([(case.get("params") or {}).get(REGIME, "–") if first else ""] * regimes),
                p["label"],
                p["impl"] + (" ⚠" if a.get("flagged") else ""), _pair_ms(a),
                p["peer"] + (" ⚠" if b.get("flagged") else ""), _pair_ms(b),
                _fmt(ratio, ".2f") + (f" ({p['peer']} / {p['impl']})" if ratio else ""),
            ])  # fmt: skip
            first = False
    return rows


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return out


def markdown(results: dict, plot_name: str | None = None) -> str:
    key = results.get("key", {})
    lines = [results.get("doc", "").rstrip(), ""] if results.get("doc") else []
    lines.append("## Results")
    lines.append("")
    if not results.get("cases"):
        lines += [
            "No results recorded yet: run the command above on a GPU and render its JSON.",
            "",
        ]
        return "\n".join(lines)
    paired = is_paired(results)
    if not paired:
        lines += [LEGACY_NOTE, ""]
    lines.append(
        f"Measured {key.get('date', '?')} on {key.get('device', '?')} (target "
        f"{key.get('target', '?')}), torch {key.get('torch', '?')}, Triton "
        f"{key.get('triton', '?')}, CUDA {key.get('cuda', '?')}"
        + "".join(f", {k} {v}" for k, v in results.get("meta", {}).get("versions", {}).items())
        + (", **quick mode** (fewer repetitions)" if results.get("quick") else "")
        + f". Device-to-device copy bandwidth in this run: "
        f"{_fmt(results.get('copy_gbs'), '.0f')} GB/s (read + write). Whole run: "
        f"{_fmt(results.get('elapsed_s'), '.0f')} s"
        + _precompile_text(results.get("precompile"))
        + "."
    )
    lines.append("")
    if len(results.get("parts", ())) > 1:  # merge_results: runs of one machine kind and software
        lines += ["**Runs merged**: " + ", ".join(
            f"{p.get('date', '?')} ({p.get('cases', '?')} cases)" for p in results["parts"]
        ) + "; each case's rows come from one run (the first part's date heads the page).",
                  ""]  # fmt: skip
    if results.get("not_measured"):
        lines += [f"**Deadline reached**: {len(results['not_measured'])} cases not measured "
                  f"({', '.join(results['not_measured'])}).", ""]  # fmt: skip
    if results.get("superseded"):
        lines += ["**Re-measured** (a later run replaced these cases' rows): " + ", ".join(
            f"{s['case']} ({s['measured']} → {s['replaced_by']})" for s in results["superseded"]
        ) + ".", ""]  # fmt: skip
    cases = results["cases"]
    prs = pair_rows(results)
    if prs:
        lines += ["### Like with like", "",
                  "Every ratio is taken within one pair, on the same inputs: the peer row's ms "
                  "over the kreg row's ms (above 1: kreg is faster). The pairs:", ""]  # fmt: skip
        described = [(c["name"], f"**{p['label']}**: `{p['impl']}` against `{p['peer']}`"
                      + (f": {p['text']}" if p.get("text") else ""))
                     for c in cases for p in c.get("pairs", [])]  # fmt: skip
        lines += _grouped(described, len(cases))
        unpaired = [c["name"] for c in cases if not c.get("pairs")]
        if unpaired:
            lines.append(f"- no pair timed: {', '.join(unpaired)}")
        lines.append("")
        lines += _md_table(pair_header(results), prs)
        lines += ["", "### Every row", ""]
    lines += _md_table(TABLE_HEADER, table_rows(results))
    lines.append("")
    lines.append(
        "× peer: the \"peer\" column's ms over the row's ms"
        + (" (the peer of the row's pair; peer rows have none)" if paired else "")
        + ". rel err vs ref 1 / ref 2: against the case's references, "
        + "; ".join(
            f"{', '.join(refs)}" + (f" ({', '.join(names)})" if len(names) < len(cases) else "")
            for refs, names in _refs_by(cases).items()
        )  # fmt: skip
        + "."
    )
    lines.append("")
    lines.append(f"⚠: a relative RMS error above {results.get('flag_rel_err', FLAG_REL_ERR):g} "
                 "against a reference (or a non-finite output).")  # fmt: skip
    lines += _notes(results)
    if plot_name:
        lines += ["", "### Time per token·head against batch × heads", "",
                  f"![time per token·head against B·H]({plot_name})"]  # fmt: skip
    lines.append("")
    return "\n".join(lines)


def _precompile_text(pre) -> str:
    if not pre or not pre.get("workers"):
        return ""
    return (
        f" (of which {_fmt(pre.get('seconds'), '.0f')} s compiling in {pre['workers']} processes)"
    )


def _grouped(pairs, n_cases: int) -> list[str]:
    """Lines "- text (cases)", one per distinct text, naming the cases unless it is all."""
    by: dict[str, list[str]] = {}
    for case, text in pairs:
        by.setdefault(text, [])
        if case not in by[text]:
            by[text].append(case)
    return [f"- {text}" + ("" if len(cases) == n_cases else f" ({', '.join(cases)})")
            for text, cases in by.items()]  # fmt: skip


def _notes(results: dict) -> list[str]:
    cases = results["cases"]
    pairs = []
    for case in cases:
        for s in case.get("skipped", []):
            pairs.append((case["name"], f"{s['impl']} skipped: {s['reason']}"))
        for n in case.get("notes", []):
            pairs.append((case["name"], n))
        for r in case["rows"]:
            if r.get("note"):
                pairs.append((case["name"], f"{r['impl']}: {r['note']}"))
    specs = []
    for case in cases:
        for r in case["rows"]:
            spec = r.get("info", {}).get("spec")
            if spec:
                specs.append((case["name"], f"{r['impl']}: {spec}"))
    out = ["", "### Notes", ""] + _grouped(pairs, len(cases)) if pairs else []
    if specs:
        out += ["", "### Specs timed", ""] + _grouped(specs, len(cases))
    return out


def sweep_series(results: dict) -> dict[str, list[tuple[int, float]]]:
    """impl -> [(B·H, ns per token·head)] over the cases tagged "sweep", sorted by B·H."""
    series: dict[str, list[tuple[int, float]]] = {}
    for case in results.get("cases", []):
        if "sweep" not in case.get("tags", []):
            continue
        for r in case["rows"]:
            if r.get("ms") is None:
                continue
            ns = r["ms"] * 1e6 / (case["tokens"] * case["heads"])
            series.setdefault(r["impl"], []).append((case["bh"], ns))
    return {k: sorted(v) for k, v in series.items()}


def plot_sweep(results: dict, path: Path) -> bool:
    series = sweep_series(results)
    if not series:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    peers = {c.get("peer") for c in results.get("cases", [])}
    peers |= {p["peer"] for c in results.get("cases", []) for p in c.get("pairs", [])}
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for name, pts in series.items():
        xs, ys = zip(*pts, strict=True)
        style = "--" if name in peers else "-"
        ax.plot(xs, ys, style, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({x for pts in series.values() for x, _ in pts})
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("batch × heads")
    ax.set_ylabel("ns per token·head")
    key = results.get("key", {})
    ax.set_title(
        f"{results.get('scenario', '')}: {key.get('device', '')} ({key.get('date', '')[:10]})"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def summary(results: dict) -> str:
    """A short text table: ms per case and implementation, and the ratio to the peer."""
    from kreg.text import table

    names: list[str] = []
    for case in results.get("cases", []):
        for r in case["rows"]:
            if r["impl"] not in names:
                names.append(r["impl"])
    rows = []
    for case in results.get("cases", []):
        by = {r["impl"]: r for r in case["rows"]}
        cells = [case["name"]]
        for n in names:
            r = by.get(n)
            if r is None:
                cells.append("")
            elif r.get("ms") is None:
                cells.append("failed")
            else:
                peer = _row_peer(case, r)
                ratio = f" ({r['vs_peer']:.2f}x)" if r.get("vs_peer") and n != peer else ""
                cells.append(f"{r['ms']:.3f}{ratio}{' !' if r.get('flagged') else ''}")
        rows.append(cells)
    head = "ms per call (x = peer ms / impl ms; ! = rel err > "
    head += f"{results.get('flag_rel_err', FLAG_REL_ERR):g})"
    pairs = {(p["label"], p["impl"], p["peer"]) for c in results.get("cases", [])
             for p in c.get("pairs", [])}  # fmt: skip
    if pairs:
        head += "\nratios within like-with-like pairs: " + "; ".join(
            f"{label}: {impl} vs {peer}" for label, impl, peer in sorted(pairs)
        )
    elif results.get("cases"):
        head += "\nmeasured before the like-with-like pairing (2026-12-03 audit): one peer per case"
    return head + "\n" + table(rows, ["case", *names])
