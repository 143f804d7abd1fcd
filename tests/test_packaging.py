"""Packaging: kreg installs beside any Triton >= 3.1 (no exact pin, so an engine's torch decides),
declares Python 3.11-3.13, and the lane's pinned Triton is one the golden file holds hashes for."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from kreg import golden

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirement(name: str) -> str:
    (req,) = [d for d in _project()["dependencies"] if re.match(rf"{name}\b", d)]
    return req


def test_triton_is_a_lower_bound_not_a_pin():
    req = _requirement("triton").replace(" ", "")
    assert "==" not in req and "<" not in req, req  # torch 2.12 needs 3.7, 2.14 needs 3.8
    assert req == "triton>=3.1"  # torch 2.5's Triton
    assert _requirement("torch").replace(" ", "") == "torch>=2.5"


def test_python_versions_declared():
    project = _project()
    assert project["requires-python"] == ">=3.11"
    declared = {c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if "Python :: 3." in c}
    assert declared == {"3.11", "3.12", "3.13"}


def test_the_lane_installs_a_triton_the_goldens_pin():
    """scripts/venv.sh installs the Triton CI checks the hashes with; .ci/run makes a missing
    sub-document a failure there."""
    venv = (ROOT / "scripts" / "venv.sh").read_text()
    (pinned,) = re.findall(r"^GOLDEN_TRITON=(\S+)$", venv, re.M)
    assert '"triton==$GOLDEN_TRITON"' in venv
    assert pinned in golden.load(ROOT / golden.GOLDEN_FILE)["triton"]
    assert f"export {golden.STRICT_ENV}=1" in (ROOT / ".ci" / "run").read_text()
