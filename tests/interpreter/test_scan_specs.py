"""benchmarks/scan_specs.py on the interpreter: every valid scan variant of a GDN or KDA case gets
a row over the same prep tiles, the dispatcher's own spec is among them, marked once, and every
variant computes the dispatcher's output (the timing itself is the GPU's: stubbed)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from kreg.families.gdn.bench import scenario as gdn
from kreg.families.kda.bench import scenario as kda

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "scan_specs.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("scan_specs", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = {
    "gdn": lambda lengths: gdn.make_case(1, 256, 2, 4, lengths=lengths, dtype="fp16"),
    "kda": lambda lengths: kda.make_case(
        1, 256, 2, lengths=lengths, dtype="fp16", regime="softplus"
    ),
}


@pytest.mark.parametrize("scenario", ["gdn", "kda"])
@pytest.mark.parametrize("lengths", [None, (100, 156)])
def test_every_valid_variant_is_timed_over_one_prep(tool, scenario, lengths, monkeypatch):
    monkeypatch.setattr(tool, "VARIANTS", {"block_v": (32,), "num_stages": (1, 2),
                                           "segment_chunks": (0, 4)})  # fmt: skip
    case = CASES[scenario](lengths)
    timed = []
    rows = list(tool.measure(scenario, [case], device="cpu",
                             timer=lambda fn: timed.append(fn) or 1.0))  # fmt: skip
    variants = [(r["block_v"], r["num_stages"], r["segment_chunks"]) for r in rows]
    assert len(set(variants)) == len(variants) == len(timed)
    assert {(32, s, g) for s in (1, 2) for g in (0, 4)} <= set(variants)
    assert sum(r["chosen"] for r in rows) == 1  # the dispatcher's own values join the axes
    assert all(math.isfinite(r["rel_err"]) and r["rel_err"] < 1e-2 for r in rows), rows
