"""The context parallel benchmark (``kreg.families.kda.bench.cp``): its arguments and plan on
CPU; the run itself on a multi-GPU host (``gpu``, skipped with fewer than two GPUs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kreg.families.kda.bench import cp as bench_cp

ROOT = Path(__file__).resolve().parent.parent


def test_default_case_is_the_issue_shape():
    args = bench_cp.parse_args([])
    assert (args.tokens, args.heads, args.dim) == (1 << 20, 8, 128)
    plan = bench_cp.plan_run(args, 8)
    assert plan["offsets"] == [r << 17 for r in range(9)]
    assert plan["rows"] == ["kreg.single", "kreg.cp", "fla.single", "fla.cp"]
    assert plan["fla_cp_skip"] is None
    assert plan["owned"] == [[]] * 7 + [[0]]  # the last rank returns the final state
    assert plan["exchange_bytes"] == 8 * 8 * 128 * 256 * 4  # one [HV, K, K + V] map per rank


def test_ragged_slices_and_varlen_plan():
    args = bench_cp.parse_args(["--tokens", "100", "--lengths", "30,0,70", "--offsets",
                                "0,0,45,100", "--no-fla"])  # fmt: skip
    plan = bench_cp.plan_run(args, 3)
    assert plan["rows"] == ["kreg.single", "kreg.cp"]
    assert plan["pieces"] == [[], [0, 1, 2], [2]]
    assert plan["fla_cp_skip"]  # fla's CP takes equal slices only


@pytest.mark.parametrize("argv,world,match", [
    (["--tokens", "10", "--offsets", "0,5"], 2, "--offsets"),
    (["--tokens", "10", "--offsets", "0,6,5,10"], 3, "--offsets"),
    (["--tokens", "10", "--lengths", "4,4"], 2, "--lengths"),
])  # fmt: skip
def test_bad_plans_are_refused(argv, world, match):
    with pytest.raises(ValueError, match=match):
        bench_cp.plan_run(bench_cp.parse_args(argv), world)


def test_dry_run_writes_the_plan(tmp_path):
    out = tmp_path / "plan.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "kreg.families.kda.bench.cp", "--dry-run", "--world", "2",
         "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["offsets"] == [0, 1 << 19, 1 << 20]


@pytest.mark.gpu
def test_torchrun_two_gpus(tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    out = tmp_path / "cp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
           "kreg.families.kda.bench.cp", "--tokens", "65536", "--reps", "3", "--warmup", "1",
           "--out", str(out)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert rows["kreg.cp"]["rel_rms_o_vs_kreg_single"] < 1e-2
