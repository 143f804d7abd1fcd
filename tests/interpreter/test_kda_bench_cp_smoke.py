"""The context parallel benchmark script end to end on CPU: ``torchrun`` with two gloo ranks
running the interpreter kernels (``--cpu``), so the script's logic is checked before a
multi-GPU host runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")
ROOT = Path(__file__).resolve().parents[2]


def test_bench_cp_runs_under_torchrun_on_cpu(tmp_path):
    out = tmp_path / "cp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--standalone", "-m", "kreg.families.kda.bench.cp", "--cpu", "--tokens", "80",
           "--lengths", "30,50", "--offsets", "0,45,80", "--heads", "1", "--dim", "32",
           "--reps", "1", "--warmup", "0", "--out", str(out)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert set(result["rows"]) == {"kreg.single", "kreg.cp"}
    assert result["rows"]["kreg.cp"]["rel_rms_o_vs_kreg_single"] < 2e-3
    assert "kreg.single / kreg.cp" in result["speedups"]
