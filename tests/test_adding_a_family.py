"""docs/adding-a-family.md, followed as written: its code blocks become a throwaway package,
installed through a real entry point; what the page says the family gets, it gets."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "adding-a-family.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", PAGE.read_text(), re.S)


@pytest.fixture
def axpy(plugin_env):
    """The page's package written from its blocks: each python block names its file on its
    first line, the json block is the tuning table, the toml block the entry point."""
    pkg = plugin_env.site / "kreg_axpy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    files = {}
    for block in _blocks("python"):
        first, _, body = block.partition("\n")
        files[first.removeprefix("# ")] = body
    assert set(files) == {"kreg_axpy/family.py", "kreg_axpy/plugin.py"}
    for path, body in files.items():
        (plugin_env.site / path).write_text(body)
    (tuning,) = _blocks("json")
    (pkg / "tuning.json").write_text(tuning.replace("TRITON_VERSION", triton.__version__))
    (toml,) = _blocks("toml")
    (name, target), *_ = re.findall(r'^(\w+) = "([\w.:]+)"$', toml, re.M)
    plugin_env.install(name, target)
    plugin_env.modules += ["kreg_axpy", "kreg_axpy.family", "kreg_axpy.plugin"]
    yield plugin_env
    for mod in ("kreg_axpy.plugin", "kreg_axpy.family", "kreg_axpy"):
        sys.modules.pop(mod, None)


def test_the_page_family_registers_selects_its_tuned_spec_and_builds(axpy):
    from kreg.dispatch import select
    from kreg.families.kda.plugin import FAMILY as KDA

    reg = axpy.registry()
    assert reg.broken == [] and "axpy" in reg.families and "kda" in reg.families
    family = reg.families["axpy"]
    assert family.data == "kreg_axpy" and "axpy_b1024" in reg.golden_cases
    problem = family.problem({"n": "1048576"})
    tuned = select(problem, "sm90")  # the family's own tuning.json decides on sm90
    assert tuned.decided_by.startswith("tuning table entry {'block': 4096, 'num_warps': 8}")
    assert (tuned.spec.block, tuned.spec.num_warps) == (4096, 8)
    other = select(problem, "gfx950")  # no section for gfx950: the family's cost heuristic
    assert other.decided_by.startswith("heuristic cost")
    small = select(family.problem({"n": "4096", "dtype": "fp16"}), "sm90")  # bucket mismatch
    assert small.decided_by.startswith("heuristic cost") and small.spec.dtype == "fp16"
    for target in ("sm90", "gfx950", "gfx942"):
        sel = select(problem, target)
        art = sel.candidate.builders["axpy"](sel.spec, reg.targets[target], problem)
        assert art.kernel == "axpy_kernel" and art.stages, target
    # KDA is as it was: its family and its selection are the built-in ones
    kda = reg.families["kda"]
    assert kda == KDA and select(kda.problem(), "sm90").candidate.family == "kda"


def test_the_page_commands_explain_and_build(axpy):
    env = axpy.env()
    run = [sys.executable, "-m", "kreg"]
    explain = subprocess.run(run + ["explain", "axpy", "n=4096", "--target", "sm90", "--verbose"],
                             env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert explain.returncode == 0, explain.stderr
    assert "axpy.tiled" in explain.stdout
    built = subprocess.run(run + ["build", "axpy", "--target", "gfx950"], env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "axpy_kernel" in built.stdout
