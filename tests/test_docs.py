"""Generated docs: docs/index.md's families table and every family's page are fresh, and the
check catches a stale or missing block while keeping the hand-written prose."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kreg import docsgen
from kreg.cli.docs_cmd import explain_output

ROOT = Path(__file__).resolve().parents[1]
# the index and every built-in family's page (a copy of them is what the stale checks read)
PAGES = (docsgen.INDEX, *sorted(p.relative_to(ROOT) for p in (ROOT / "docs/families").glob("*.md")))


@pytest.fixture(scope="module")
def reg(builtin_registry):
    return builtin_registry


@pytest.fixture
def copy(tmp_path):
    for page in PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    return tmp_path


def test_docs_are_fresh(reg):
    assert docsgen.stale(reg, explain_output, ROOT) == []


def test_family_page_content(reg):
    text = (ROOT / "docs/families/kda.md").read_text()
    for want in [
        "`gate_lower_bound` | `float \\| None` | `None` |",  # problem fields with defaults
        "`KdaTileSpec`", "`KdaScanSpec`", "`KdaChunkFusedSpec`", "`min_occupancy`",
        "fits the hardware but leaves the latency-bound scan one program per unit",  # a rule
        "KDA gates are per-channel",  # a problem rule
        "The evidence, `kreg explain kda --target sm90 --verbose`:",
        "kda_prefill(", "../kda/ALGORITHM.md", "../kda/CASE_STUDY.md", "../kda/RESULTS.md",
    ]:  # fmt: skip
        assert want in text, want
    index = (ROOT / docsgen.INDEX).read_text()
    assert (
        "| kda | `LinearAttentionProblem` | `kda.recurrent`, `kda.split`, `kda.fused` (opt-in) |"
        in index
    )
    assert "[docs/families/kda.md](families/kda.md)" in index


def test_stale_block_detected_and_rewritten_keeping_prose(reg, copy):
    page = copy / "docs/families/kda.md"
    original = page.read_text()
    edited = original.replace("| `chunk` | `int` | `64` |", "| `chunk` | `int` | `32` |", 1)
    edited = edited.replace("## Example", "## Example\n\nA hand-written note.", 1)
    assert edited != original
    page.write_text(edited)
    assert docsgen.stale(reg, explain_output, copy) == [
        "docs/families/kda.md: generated block(s) ['candidates'] are stale"
    ]
    assert docsgen.write(reg, explain_output, copy) == [page]
    assert docsgen.stale(reg, explain_output, copy) == []
    assert page.read_text() == original.replace("## Example", "## Example\n\nA hand-written note.")


def test_missing_block_and_page_detected(reg, copy):
    index = copy / docsgen.INDEX
    text = index.read_text()
    start, end = text.index("<!-- generated: families -->"), text.index(docsgen.END)
    index.write_text(text[:start] + "| hand-made table |" + text[end + len(docsgen.END) :])
    (copy / "docs/families/kda.md").unlink()
    assert docsgen.stale(reg, explain_output, copy) == [
        "docs/index.md lacks the generated block(s) ['families']",
        "docs/families/kda.md does not exist",
    ]
    docsgen.write(reg, explain_output, copy)
    assert docsgen.stale(reg, explain_output, copy) == []
    assert "| hand-made table |" in index.read_text()  # prose kept, block appended
    assert "## Dispatch default (generated)" in (copy / "docs/families/kda.md").read_text()


def test_cli_check_fails_when_stale(reg, copy):
    env = {**os.environ, "KREG_PLUGINS": "none"}
    argv = [sys.executable, "-m", "kreg", "docs", "--check", "--root", str(copy)]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "docs are up to date" in r.stdout
    index = copy / docsgen.INDEX
    index.write_text(index.read_text().replace("| kda |", "| kda2 |"))
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1
    assert "docs/index.md: generated block(s) ['families'] are stale" in r.stderr
    assert "run `kreg docs --write`" in r.stderr
