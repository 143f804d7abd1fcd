"""benchmarks/kda_host_python.py (the Python share of a planned call's host time, on a CPU):
it runs, and each of its engine-shaped calls (prefill fixed and varlen with device offsets,
decode, decode on a pool with int32 slots) is planned: none falls back to the normal path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_engine_shaped_call_is_planned():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "kda_host_python.py"), "--calls", "3",
         "--reps", "1"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env, check=True,
    ).stdout  # fmt: skip
    rows = re.findall(r"^(.+?)\s+([\d.]+) us per call \((\d+) launches\)$", out, re.M)
    assert [name.strip() for name, _, _ in rows] == [
        "prefill 1x96", "prefill varlen 3", "decode N4", "decode pool N4"
    ], out  # fmt: skip
    assert all(float(us) > 0 for _, us, _ in rows)
    assert [int(n) for _, _, n in rows][2:] == [1, 1]  # a decode step is one launch
