"""Golden IR: the committed hashes hold, and the check fails loudly on every way they can drift.

``test_golden_check_passes`` compiles every golden case for every target it covers (about a
minute on two cores): it is the point of the golden file, so it runs in the CPU lane.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

from kreg import golden
from kreg.families.kda import builders
from kreg.families.kda.specs import KdaTileSpec
from kreg.registry import GoldenCase, load_registry
from kreg.registry.compile import normalise_ir

ROOT = Path(__file__).resolve().parents[1]
SMALL = "split_fp16"  # head dim 32: valid, and cheap to compile, on every target


@pytest.fixture(scope="module")
def reg():
    return load_registry("none")


@pytest.fixture(scope="module")
def stored():
    return golden.load(ROOT / golden.GOLDEN_FILE)


@pytest.fixture(scope="module")
def small_current(reg):
    """Freshly built entries of the SMALL case (in-process; the builders cache them)."""
    the_plan = golden.plan(reg, [reg.golden_cases[SMALL]])
    return golden.compute(reg, the_plan, jobs=1)


def _sub(stored: dict) -> dict:
    """The installed Triton's sub-document; a Triton the file does not pin skips (fails in CI)."""
    version = golden.triton_version()
    if version not in stored["triton"]:
        why = (f"golden/ir_sha256.json pins Triton {', '.join(sorted(stored['triton']))}, the "
               f"installed one is {version}: its hashes cannot be checked here")  # fmt: skip
        if golden.strict():
            pytest.fail(why)
        pytest.skip(why)
    return stored["triton"][version]


def _only(doc: dict, stem: str) -> dict:
    return {k: v for k, v in doc.items() if k.startswith(stem + "/")}


@pytest.mark.slow
def test_golden_check_passes(reg):
    """Every case x target x kernel x stage matches golden/ir_sha256.json (`kreg golden check`)."""
    outcome = golden.check(reg, ROOT / golden.GOLDEN_FILE, jobs=2, plugins="none",
                           progress=lambda m: print(m, file=sys.stderr))  # fmt: skip
    assert outcome.ok, "\n".join(outcome.messages)
    if outcome.skipped:
        pytest.skip(outcome.messages[0])


def test_golden_file_is_deterministic_json(stored):
    path = ROOT / golden.GOLDEN_FILE
    assert path.read_text() == golden.dumps(stored)
    assert _sub(stored)


def test_kda_cases_cover_off_by_default_fields(reg, stored):
    """The cases turn on every spec field that is off by default, and each is pinned somewhere."""
    sub = _sub(stored)
    kda = {n: c for n, c in reg.golden_cases.items() if c.candidate.startswith("kda.")}
    assert 10 <= len(kda) <= 16
    seen = set()
    for case in kda.values():
        parts = [getattr(case.spec, n) for n in ("tile", "scan") if hasattr(case.spec, n)]
        for part in parts or [case.spec]:  # the recurrent spec is one flat spec
            for f in attrs.fields(type(part)):
                value = getattr(part, f.name)
                if value != f.default and isinstance(value, (bool, str)):
                    seen.add((f.name, value))
        compiled = [k for k, v in _only(sub, f"kda/{case.name}").items() if "skipped" not in v]
        assert compiled, f"golden case {case.name} is compiled on no target"
    for want in [
        ("gate_activation", "sigmoid_bound"), ("gate_activation", "softplus"),
        ("qk_l2norm", True), ("beta_sigmoid", True), ("varlen", True), ("initial_state", True),
        ("output_final_state", True), ("output_chunk_states", True), ("state_layout", "vk"),
        ("dtype", "fp16"), ("state_dtype", "bf16"), ("state_pool", True), ("chunk_states_dtype", "bf16"),
    ]:  # fmt: skip
        assert want in seen, want
    assert any(getattr(getattr(c.spec, "scan", None), "segment_chunks", 0) for c in kda.values())
    for key, value in sub.items():
        if "skipped" in value:
            assert value["skipped"], key  # skipped on a target: recorded with the reasons
        else:
            assert value["shared_bytes"] >= 0
            stages = set(value) - {"shared_bytes"}
            assert stages in ({"ttir", "ttgir", "llir", "ptx"}, {"ttir", "ttgir", "llir", "amdgcn"})


def test_tampered_golden_fails_naming_the_case(reg, stored, small_current, tmp_path):
    version = golden.triton_version()
    sub = _only(_sub(stored), f"kda/{SMALL}")
    assert sub == small_current  # the committed entries of this case hold
    key = f"kda/{SMALL}/gfx942/prep"
    sub[key]["ttgir"]["sha256"] = "0" * 64
    sub[f"kda/{SMALL}/sm90/scan"]["shared_bytes"] += 16
    path = tmp_path / "golden.json"
    golden.save(path, {"format": 1, "triton": {version: sub}})
    outcome = golden.check(reg, path, cases=[reg.golden_cases[SMALL]], jobs=1)
    text = "\n".join(outcome.messages)
    assert not outcome.ok
    assert f"{key} [ttgir]: sha256 000000000000 ->" in text
    assert f"kda/{SMALL}/sm90/scan: shared_bytes" in text
    assert "`kreg golden update`" in text


def _env(**set_):
    """os.environ without the CI switches, plus ``set_``."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", golden.STRICT_ENV)}
    return {**env, "KREG_PLUGINS": "none", **set_}


@pytest.mark.parametrize(
    "env,strict",
    [(dict(), False), (dict(CI="true"), True), (dict(KREG_GOLDEN_STRICT="1"), True),
     (dict(CI="0"), False), (dict(KREG_GOLDEN_STRICT="no"), False)],
    ids=["plain", "ci", "strict", "ci_off", "strict_off"],
)  # fmt: skip
def test_an_unpinned_triton_skips_outside_ci_and_fails_in_it(tmp_path, env, strict):
    """Goldens are keyed by Triton version: a file pinning only other versions makes
    ``kreg golden check`` skip (exit 0) with a message naming them, and fail in CI (exit 1)."""
    path = tmp_path / "golden.json"
    golden.save(path, {"format": 1, "triton": {"0.0.1": {}, "3.1.0": {}}})
    r = subprocess.run(
        [sys.executable, "-m", "kreg", "golden", "check", "--file", str(path)],
        capture_output=True, text=True, env=_env(**env), timeout=120,
    )  # fmt: skip
    version = golden.triton_version()
    assert r.returncode == (1 if strict else 0), r.stdout + r.stderr
    err = " ".join(r.stderr.split())  # the CLI wraps messages at 100 columns
    assert f"no golden IR for the installed Triton {version} (it pins: 0.0.1, 3.1.0)" in err
    assert "pip install triton==3.1.0" in err and "`kreg golden update`" in err
    assert ("skipped" in err) != strict
    assert r.stdout == ""  # no "ok" line: nothing was checked


def test_skip_is_a_distinct_outcome(reg, tmp_path, monkeypatch):
    """In process: ok and skipped (nothing compiled) outside CI, a failure in CI; the installed
    version's own sub-document is checked as before."""
    path = tmp_path / "golden.json"
    golden.save(path, {"format": 1, "triton": {"0.0.1": {}}})
    for name in ("CI", golden.STRICT_ENV):
        monkeypatch.delenv(name, raising=False)
    compiled = []
    monkeypatch.setattr(golden, "compute", lambda *a, **k: compiled.append(1) or {})
    out = golden.check(reg, path, cases=[reg.golden_cases[SMALL]], jobs=1)
    assert out.ok and out.skipped and not compiled
    monkeypatch.setenv("CI", "1")
    out = golden.check(reg, path, cases=[reg.golden_cases[SMALL]], jobs=1)
    assert not out.ok and not out.skipped and not compiled


def test_added_and_dropped_cases_detected(reg, tmp_path):
    cases = list(reg.golden_cases.values())
    extra = attrs.evolve(reg.golden_cases[SMALL], name="split_fp16_again")
    path = ROOT / golden.GOLDEN_FILE
    added = golden.check(reg, path, cases=[*cases, extra], jobs=1)
    assert not added.ok
    assert "golden case 'kda/split_fp16_again' was added without regenerating" in added.messages[0]
    dropped = golden.check(reg, path, cases=[c for c in cases if c.name != SMALL], jobs=1)
    assert not dropped.ok
    assert f"golden case 'kda/{SMALL}' was dropped" in dropped.messages[0]
    assert "`kreg golden update`" in dropped.messages[-1]


def test_colliding_case_names_detected(reg):
    case = reg.golden_cases[SMALL]
    twin = GoldenCase(SMALL, "kda.fused", reg.golden_cases["fused_fp16_softplus"].spec)
    upper = attrs.evolve(case, name=SMALL.upper())
    slash = attrs.evolve(case, name="kda/x")
    outcome = golden.check(reg, ROOT / golden.GOLDEN_FILE, cases=[case, twin, upper, slash])
    text = "\n".join(outcome.messages)
    assert not outcome.ok
    assert f"golden case {SMALL!r} (kda.fused) collides with the same name (kda.split)" in text
    assert (
        f"golden case {SMALL.upper()!r} (kda.split) collides with {SMALL!r} (ignoring case)" in text
    )
    assert "golden case name 'kda/x' is not a key stem" in text


def test_update_writes_only_the_installed_version(reg, small_current, tmp_path):
    path = tmp_path / "golden.json"
    golden.save(path, {"format": 1, "triton": {"0.0.1": {"kda/x/sm90/prep": {"shared_bytes": 0}}}})
    _, changes = golden.update(reg, path, cases=[reg.golden_cases[SMALL]], jobs=1)
    doc = golden.load(path)
    assert doc["triton"]["0.0.1"] == {"kda/x/sm90/prep": {"shared_bytes": 0}}
    assert doc["triton"][golden.triton_version()] == small_current
    assert len(changes) == len(small_current)
    assert path.read_text() == golden.dumps(doc)


def test_normalise_strips_location_dependent_text():
    llir = textwrap.dedent("""\
        define void @k(ptr %0) #0 !dbg !5 {
          %2 = load i32, ptr %0, align 4, !dbg !9
          ret void, !dbg !10
        }
        declare !dbg !4 float @llvm.exp2.f32(float)
        !1 = !DIFile(filename: "kernels.py", directory: "/some/checkout/kreg")
        !5 = distinct !DISubprogram(name: "k", scope: !1, file: !1, line: 339)
        !9 = !DILocation(line: 12, column: 3, scope: !5)
        """)  # fmt: skip
    assert normalise_ir(llir) == textwrap.dedent("""\
        define void @k(ptr %0) #0 {
          %2 = load i32, ptr %0, align 4
          ret void
        }
        declare float @llvm.exp2.f32(float)
        """)  # fmt: skip
    asm = ".Ltmp3:\n\tv_add_f32 v1, v2, v3\n.Ltmp12:\n\ts_branch .LBB0_1\n\t.quad .Ltmp1\n.Ltmp1:\n"
    assert (
        normalise_ir(asm) == "\tv_add_f32 v1, v2, v3\n\ts_branch .LBB0_1\n\t.quad .Ltmp1\n.Ltmp1:\n"
    )
    ptx = "$L__tmp0:\n\tmov.u32 %r1, 0;\n\t.loc 1 12 3\n"
    assert normalise_ir(ptx) == "\tmov.u32 %r1, 0;\n"


@pytest.mark.slow
def test_hashes_stable_across_checkout_paths_and_line_shifts(small_current, tmp_path):
    """The same case built from a copy of the package elsewhere (with the kernels moved down by
    a few comment lines, fresh Triton cache, new process) hashes identically."""
    tree = tmp_path / "somewhere" / "else" / "checkout"
    shutil.copytree(ROOT / "kreg", tree / "kreg", ignore=shutil.ignore_patterns("__pycache__"))
    kernels = tree / "kreg" / "families" / "kda" / "kernels.py"
    kernels.write_text("# moved\n# down\n# by three lines\n" + kernels.read_text())
    script = textwrap.dedent(f"""\
        import json, kreg
        from kreg import golden
        from kreg.registry import load_registry
        assert kreg.__file__.startswith({str(tree)!r}), kreg.__file__
        reg = load_registry("none")
        plan = golden.plan(reg, [reg.golden_cases[{SMALL!r}]])
        print(json.dumps(golden.compute(reg, plan, jobs=1)))
        """)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree), "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout) == small_current


def test_inert_spec_field_changes_no_hash(reg):
    """A rule-only field (min_occupancy) and a new field left at its default build identical IR,
    and the golden plan (hence the file's keys) does not depend on the spec's repr."""
    gfx950 = reg.targets["gfx950"]
    case = reg.golden_cases[SMALL]
    spec = case.spec
    relaxed = attrs.evolve(spec, scan=attrs.evolve(spec.scan, min_occupancy=1))
    assert relaxed != spec
    a = builders.build_kda_chunk_scan(spec.scan, gfx950)
    b = builders.build_kda_chunk_scan(relaxed.scan, gfx950)
    assert {s: golden.digest(t) for s, t in a.stages.items()} == {
        s: golden.digest(t) for s, t in b.stages.items()
    }

    @attrs.frozen
    class TileSpecWithKnob(KdaTileSpec):
        new_knob: int = 0  # a new field, at its default

    def hashes(tile):
        art = builders.build_kda_chunk_prep.__wrapped__(tile, gfx950)  # bypass the lru cache
        return {s: golden.digest(t) for s, t in art.stages.items()}

    base = hashes(KdaTileSpec())
    assert hashes(KdaTileSpec()) == base  # built twice: identical
    knob = TileSpecWithKnob(**attrs.asdict(KdaTileSpec(), recurse=False))
    assert hashes(knob) == base
    evolved = attrs.evolve(case, spec=attrs.evolve(spec, tile=TileSpecWithKnob(
        **attrs.asdict(spec.tile, recurse=False))))  # fmt: skip
    assert golden.plan(reg, [evolved]).expected_keys() == golden.plan(reg, [case]).expected_keys()


def test_cli_diff_prints_normalised_ir():
    r = subprocess.run(
        [sys.executable, "-m", "kreg", "golden", "diff", SMALL, "--target", "gfx942",
         "--kernel", "scan", "--stage", "ttir"],
        capture_output=True, text=True, env={**os.environ, "KREG_PLUGINS": "none"}, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"// ===== {SMALL} gfx942/scan/ttir =====\n")
    assert "tt.func public @kda_chunk_scan_kernel" in r.stdout
    assert "loc(" not in r.stdout and "#loc" not in r.stdout


@pytest.mark.slow
def test_cli_diff_against_a_revision(tmp_path):
    """``--against REV`` builds the case from the revision's tree (git archive) and diffs it:
    an inert edit (a comment line in the kernels) shows no difference."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "kreg", repo / "kreg", ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
    kernels = repo / "kreg" / "families" / "kda" / "kernels.py"
    kernels.write_text("# an inert comment\n" + kernels.read_text())
    env = {**os.environ, "KREG_PLUGINS": "none", "PYTHONPATH": str(repo)}
    argv = [sys.executable, "-m", "kreg", "golden", "diff", SMALL, "--target", "gfx942",
            "--kernel", "scan", "--stage", "ttgir", "--against", "HEAD"]  # fmt: skip
    r = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "normalised IR identical at HEAD and in the working tree" in r.stdout
    bad = subprocess.run(argv[:-1] + ["no-such-rev"], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and "git archive no-such-rev" in bad.stderr
