"""The interpreter lane: run ``tests/interpreter`` in its own process under ``TRITON_INTERPRET=1``.

The interpreter has to be chosen before the kernels are imported, and kernels defined under it
cannot be compiled for a target, so the CPU numerics cannot share this (compiling) process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kreg.registry.interpreter import interpreting

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(interpreting(), reason="this process already interprets: tests/interpreter "
                    "is collected directly")  # fmt: skip
def test_interpreter_lane():
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", "tests/interpreter", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=2700)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        print(output)
    assert proc.returncode == 0, f"interpreter lane failed (exit {proc.returncode}):\n{output}"
    assert " passed" in output and "no tests ran" not in output
