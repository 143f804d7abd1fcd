"""The kreg CLI, through ``python -m kreg`` subprocesses (and in-process for error cases)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kreg.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def kreg(testfam, plugin_env):
    def run(*argv: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "kreg", *argv],
            capture_output=True,
            text=True,
            env=plugin_env.env(**env),
            timeout=120,
        )

    return run


def test_list(kreg, plugin_env):
    plugin_env.install("broken", "kreg_t_cli_broken", "raise RuntimeError('nope')\n")
    r = kreg("list")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    assert ["testfam", "VecProblem", "3", "2", "testfam"] in rows
    assert "\nOpt-in candidates\n" in r.stdout
    assert "\n  testfam.fast: experimental, numerics unverified\n" in r.stdout
    assert ["sm90", "cuda", "90", "H100,", "H200", "gpu", "builtin:kreg.registry.builtin"] in rows
    assert (
        "Broken plugins (skipped)\n  broken (kreg-plugin-broken 0.1): RuntimeError: nope"
        in r.stdout
    )
    assert ["testfam", "kreg-plugin-testfam", "0.1", "kreg_testfam.plugin"] in rows


def test_list_json_coverage(kreg):
    r = kreg("list", "--json", KREG_PLUGINS="testfam")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    cands = {c["name"]: c for c in data["candidates"]}
    cov = cands["testfam.simple"]["coverage"]["sm90"]
    assert (cov["enumerated"], cov["valid"], cov["rejected"]) == (16, 11, 5)
    assert cov["reasons"]["block 32 < 64 threads"] == 1
    assert cands["testfam.fast"]["coverage"]["gfx942"] == {"supported": False}
    assert cands["testfam.fast"]["origin"] == "testfam"
    assert data["broken"] == []


def test_explain_is_deterministic(kreg):
    args = ("explain", "testfam", "--target", "sm90", "n=2048", "--json")
    first, second = kreg(*args), kreg(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    data = json.loads(first.stdout)
    assert data["selected"] == {
        "candidate": "testfam.simple",
        "spec_type": "VecSpec",
        "spec": {"tile": {"block": 32, "warps": 1}, "dtype": "fp32"},
        "decided_by": "priority",
    }
    assert data["problem"] == {"type": "VecProblem", "fields": {"n": 2048, "dtype": "fp32"}}
    assert {
        "candidate": "testfam.fast",
        "stage": "ranked",
        "ok": False,
        "reason": "opt-in: experimental, numerics unverified",
    } in data["trace"]


def test_explain_text(kreg):
    """A sentence first (which candidate, how its spec was chosen, why not the others), then
    the table; the ranking detail and the trace with --verbose."""
    args = ("explain", "testfam", "dtype=fp32", "--target", "gfx950", "--allow-opt-in")
    r = kreg(*args)
    assert r.returncode == 0, r.stderr
    first, table = r.stdout.split("\n\n")[:2]
    assert first == (
        "testfam.fast serves this problem on gfx950. No tuning entry or cost model covers this case "
        "on\ngfx950, so a rough estimate (not a timing) ranks its spec the cheapest of the 7 valid "
        "ones.\ntestfam.simple could serve it too, at a lower priority."
    )
    assert "selected   testfam.fast" in table.splitlines()
    assert "decided by" not in r.stdout and "Trace" not in r.stdout
    r = kreg(*args, "--verbose")
    assert r.stdout.startswith(first + "\n\n")
    assert "\ndecided by  heuristic cost " in r.stdout
    assert "candidate       stage    ok  reason" in r.stdout
    assert "testfam.simple  ranked   no  outranked by testfam.fast (priority 0 < 10)" in r.stdout


@pytest.mark.parametrize(
    "argv, words",
    [
        ([], r"Its spec is the tuning table's entry for this shape class, chosen from GPU timings"),
        (
            ["B=2", "T=4096", "H=16"],
            r"A cost model fitted to GPU timings \(.+, \d{4}-\d\d-\d\d\) predicts its spec to be "
            r"the fastest of the \d+ it models \([\d.]+ ms\)",
        ),
        (["--target", "gfx950"], r"No tuning entry or cost model covers this case on gfx950, so a "
                                 r"rough estimate \(not a timing\) ranks its spec the cheapest of "
                                 r"the \d+ valid ones"),
        (["--target", "gfx942", "K=256"], r"^kda.recurrent serves this problem on gfx942\. .*"
                                          r"kda.split cannot serve it \(--verbose says why\)"),
    ],
)  # fmt: skip
def test_explain_says_how_kda_was_chosen_in_words(capsys, argv, words):
    """Each way the ranker chooses a spec (tuning table, cost model, heuristic) reads as a
    sentence: the wording follows kreg/dispatch/ranker.py's decided_by texts."""
    import re

    if "--target" not in argv:
        argv = ["--target", "sm90", *argv]
    assert main(["explain", "kda", *argv, "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["summary"]
    assert re.search(words, text, re.S), text
    assert "chosen by:" not in text  # the fallback for a decided_by it does not know


@pytest.mark.parametrize("command", ["explain", "build"])
def test_help_lists_the_problem_options(testfam, capsys, monkeypatch, command):
    """`kreg explain --help` names every family's problem options with their short forms and
    defaults; key=value is optional in the usage line."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    usage = text.split("\n\n")[0]
    assert " [key=value ...]" in usage
    rows = [
        line.split(None, 2) for line in text.split("problem options, key=value")[1].splitlines()
    ]
    for row in (
        ["batch", "B", "1"],
        ["seq_len", "T", "2048"],
        ["heads_qk", "H", "32"],
        ["heads_v", "HV", "same as heads_qk"],
        ["head_dim_k", "K", "128"],
        ["head_dim_v", "V", "same as head_dim_k"],
        ["gate_lower_bound", "lower_bound", "none"],
        ["n", "4096"],  # testfam's: no short forms, its own defaults
    ):
        assert row in rows, row
    assert ["dtype", "bf16"] in rows and ["dtype", "fp32"] in rows
    assert "  kda (LinearAttentionProblem)" in text and "  testfam (VecProblem)" in text


def test_build_resources(kreg):
    for target in ("sm90", "gfx950"):
        r = kreg("build", "testfam", "--target", target)
        assert r.returncode == 0, r.stderr
        assert " ".join(r.stdout.split("\n\n")[0].split()) == (
            f"Compiled testfam.simple's kernels for {target} with the spec kreg selects for the "
            "family's default problem (below). Its spec is the first valid one: the family ranks "
            "its specs by no cost."
        )
        assert "spills:" not in r.stdout  # none spill: nothing to explain
        assert "candidate  testfam.simple" in r.stdout
        assert "kernel  function  shared_bytes  registers  spills  num_warps" in r.stdout
        assert r.stdout.splitlines()[-1].split()[0] == "scale2"
    r = kreg("build", "testfam.fast", "--target", "gfx950", "--spec", "tile.warps=4", "--json")
    data = json.loads(r.stdout)
    assert data["spec"] == {"tile": {"block": 1024, "warps": 4}, "dtype": "fp32"}
    [kernel] = data["kernels"]
    assert kernel["num_warps"] == 4 and kernel["registers"] > 0 and kernel["spills"] == 0


@pytest.mark.parametrize(
    "target, decided_by, unit, verdict",
    [
        ("sm90", "tuning table entry {...}", "bytes", "chosen from GPU timings, spills included"),
        ("sm90", "cost model m.json (...)", "bytes", "chosen from GPU timings, spills included"),
        ("gfx950", "heuristic cost 3", "registers", "No timing on gfx950 chose this spec"),
        ("sm90", None, "bytes", "No timing on sm90 chose this spec"),  # --spec, or no problem
    ],
)
def test_build_says_whether_its_spills_matter(target, decided_by, unit, verdict):
    """A spill count comes with what it is, in the backend's unit, the build's own numbers, and
    whether the spec's choice was timed with them."""
    from kreg.cli import _util, build_cmd

    note = build_cmd.spill_note([("a", 12), ("b", 3)], _util.get_target(target), decided_by)
    assert note.startswith(f"spills: {unit} per thread spilled to local memory")
    assert "(a 12, b 3)" in note and "small counts elsewhere are harmless" in note
    assert verdict in note


def test_build_stage(kreg):
    r = kreg("build", "testfam.simple", "--target", "sm90", "--stage", "ttir", "--kernel", "scale2")
    assert r.returncode == 0, r.stderr
    assert "tt.func public @scale2" in r.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["explain", "nofam", "--target", "sm90"], "unknown family 'nofam'"),
        (["explain", "testfam", "--target", "sm100"], "unknown target 'sm100'"),
        (["explain", "testfam", "--target", "sm90", "n"], "bad problem option 'n'"),
        (["explain", "testfam", "--target", "sm90", "n=x"], "bad problem options for testfam"),
        (["explain", "testfam", "--target", "sm90", "k=1"], "unknown option(s) ['k']"),
        (["explain", "testfam", "--target", "sm90", "n=0"], "no candidate serves"),
        (["explain", "testfam", "--target", "sm90", "--algorithm", "x"], "unknown algorithm 'x'"),
        (["explain", "testfam"], "the following arguments are required: --target"),
        # key=value is optional: only the family is missing
        (["explain", "--target", "sm90"], "the following arguments are required: family\n"),
        # the known options name their short forms
        (["explain", "kda", "--target", "sm90", "L=1"], "known: batch (B), beta_sigmoid, "),
        (["build", "kda", "--target", "sm90", "L=1"], "heads_v (HV), initial_state"),
        (["explain", "testfam", "--target", "sm90", "--nope"], "unrecognized arguments: --nope"),
        (["build", "nope", "--target", "sm90"], "unknown candidate or family 'nope'"),
        (["build", "testfam.fast", "--target", "gfx942"], "does not support gfx942"),
        (["build", "testfam.simple", "--target", "sm90", "--spec", "blk=1"], "unknown spec field"),
        (["build", "testfam.simple", "--target", "sm90", "--spec", "tile=1"], "set tile.<field>"),
        (
            ["build", "testfam.simple", "--target", "sm90", "--spec", "tile.block=x"],
            "bad value 'x'",
        ),
        (["build", "testfam.simple", "--target", "sm90", "--spec", "tile.block=16"], "not valid"),
        (["build", "testfam.simple", "--target", "sm90", "--kernel", "k"], "unknown kernel 'k'"),
        (["build", "testfam.simple", "--target", "gfx950", "--stage", "ptx"], "stage ptx not"),
        (["build", "testfam", "--target", "sm90", "--stage", "sass"], "invalid choice: 'sass'"),
        ([], "the following arguments are required: COMMAND"),
        # spec overrides are parsed by the field's type and validated before any compile
        (
            ["build", "kda.split", "--target", "sm90", "--spec", "tile.chunk=none"],
            "bad value 'none' for spec field 'tile.chunk': takes int, not None",
        ),
        (
            ["build", "kda.split", "--target", "sm90", "--spec", "scan.segment_chunks=none"],
            "bad value 'none' for spec field 'scan.segment_chunks'",
        ),
        (
            ["build", "kda.split", "--target", "sm90", "--spec", "tile.solve_block=0"],
            "validity rules fail on these values (ZeroDivisionError",
        ),
        (
            ["build", "kda.split", "--target", "sm90", "--spec", "scan.segment_chunks=-1"],
            "segment_chunks=-1 must be >= 0",
        ),
        (["build", "kda", "--target", "sm90", "--spec", "tile.chunk=17"], "chunk=17 not in"),
        # problem options a named candidate cannot serve: never a silent other build
        (["build", "kda.split", "--target", "sm90", "K=512"], "kda.split cannot serve"),
        (["build", "kda.recurrent", "--target", "sm90", "gate=scalar"], "cannot serve"),
        (
            ["build", "kda", "--target", "sm90", "--spec", "tile.chunk=16", "T=64"],
            "problem options key=value go before --spec",
        ),
        (["explain", "kda", "--target", "sm90", "B=2", "batch=3"], "batch given twice"),
        (["explain", "kda", "--target", "sm90", "T=64", "T=128"], "'T' given twice"),
        # paths: missing, a directory, not a checkout's
        (["matrix", "--check", "--root", "/nonexistent"], "--root /nonexistent: no such dir"),
        (["docs", "--write", "--root", "/nonexistent"], "--root /nonexistent: no such dir"),
        (["matrix", "--write", "--file", "/nonexistent/x.md"], "No such file or directory"),
        (["matrix", "--check", "--file", "/"], "Is a directory"),
        (["golden", "check", "--file", "/nonexistent/g.json"], "no golden file there"),
        (["matrix", "--json", "--markdown"], "not allowed with argument --json"),
    ],
)
def test_user_errors_one_line_exit_2(testfam, capsys, argv, message):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("kreg: error: ") and err.count("\n") == 1
    assert message in err


def test_user_errors_compile_nothing(testfam, capsys, monkeypatch):
    """Overrides are checked before compiling; a valid override that fails to compile is one
    line too (the compile is faked here)."""
    from kreg.cli import build_cmd

    def compile_all(builders, spec, target, problem=None):
        raise RuntimeError("PassManager::run failed\nsome detail")

    monkeypatch.setattr(build_cmd, "compile_all", compile_all)
    argv = ["build", "testfam.simple", "--target", "sm90", "--spec", "tile.block=64"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "passes its validity rules but does not compile" in err
    assert "RuntimeError: some detail" in err
    with pytest.raises(RuntimeError):  # the dispatcher's own spec failing: a bug, traceback
        main(argv[:4])


def test_user_error_subprocess(kreg):
    r = kreg("explain", "testfam", "--target", "sm90", "n=0")
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        "kreg: error: no candidate serves VecProblem(n=0) on sm90 | "
        "testfam.fast: problem: n must be positive | testfam.simple: problem: n must be positive"
    ]


def test_build_kda_leaves_out_kernels_the_spec_does_not_use(kreg):
    """The README demo's build: kda.split's segment kernels exist only for segmented scans."""
    r = kreg("build", "kda", "--target", "sm90", "--json", KREG_PLUGINS="none")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["candidate"] == "kda.split"
    names = [k["kernel"] for k in data["kernels"]]
    assert data["spec"]["scan"]["segment_chunks"] == 0
    assert names == ["pairs", "prep", "scan"]  # the default problem: no bound, the safe anchor
    assert all(k["shared_bytes"] > 0 and k["registers"] > 0 for k in data["kernels"])
    r = kreg("build", "kda", "--target", "sm90", "--kernel", "segment_map", KREG_PLUGINS="none")
    assert r.returncode == 2
    assert r.stderr.startswith("kreg: error:") and "uses none of the kernels" in r.stderr


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("kreg 0.1.0 (Triton ") and out.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["list"],
        ["list", "--json"],
        ["explain", "kda", "--target", "sm90"],
        ["build", "kda", "--target", "sm90"],
        ["golden", "check"],
        ["golden", "update", "--case", "x"],
    ],
)
def test_ctrl_c_exits_130_in_one_line(capsys, monkeypatch, argv):
    import kreg.registry

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(kreg.registry, "get_registry", interrupted)
    monkeypatch.setattr(kreg.registry.manager, "load_registry", lambda *a, **k: interrupted())
    assert main(argv) == 130
    out, err = capsys.readouterr()
    assert out == "" and err == "kreg: interrupted\n"


def test_bad_files_are_one_line_user_errors(tmp_path, capsys):
    """A golden file that is not one, a results file that is not one, an output path that is a
    file: one line, exit 2, nothing written."""
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "bin.json").write_bytes(bytes(range(256)))
    (tmp_path / "other.json").write_text('{"foo": 1}')
    (tmp_path / "afile").write_text("x")
    for argv, message in (
        (["golden", "check", "--file", str(tmp_path / "list.json")], "not a golden IR file"),
        (["golden", "check", "--file", str(tmp_path / "bad.json")], "not a golden IR file"),
        (["golden", "check", "--file", str(tmp_path / "bin.json")], "not a golden IR file"),
        (["bench", "--render", str(tmp_path / "other.json")], "no 'cases'"),
        (["bench", "--render", str(ROOT / "docs/kda/decode/results.json"), "--out",
          str(tmp_path / "afile")], "File exists"),
        (["docs", "--check", "--root", str(tmp_path / "afile")], "no such directory"),
    ):  # fmt: skip
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert err.startswith("kreg: error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "RESULTS.md").exists()
    assert main(["matrix", "--check", "--file", str(tmp_path / "bin.json")]) == 1  # stale


def test_json_where_a_script_wants_it(capsys):
    for argv, keys in (
        (["matrix", "--json"], None),
        (["matrix", "--check", "--json"], {"file", "ok", "message"}),
        (["docs", "--check", "--json"], {"root", "ok", "stale"}),
    ):
        assert main(argv) == 0, argv
        data = json.loads(capsys.readouterr().out)
        if keys is None:
            assert data and {"candidate", "target", "verification"} <= set(data[0])
        else:
            assert set(data) == keys and data["ok"] is True


def test_golden_check_json(tmp_path, capsys, monkeypatch):
    """A golden file that pins no Triton version: outside CI a skip, reported as JSON."""
    from kreg import golden

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(golden.STRICT_ENV, raising=False)
    path = tmp_path / "g.json"
    path.write_text(golden.dumps({"format": golden.FORMAT, "triton": {}}))
    assert main(["golden", "check", "--file", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["skipped"] and data["file"] == str(path) and data["messages"]
    monkeypatch.setenv("CI", "1")
    assert main(["golden", "check", "--file", str(path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False


def test_build_stage_json(testfam, capsys):
    argv = ["build", "testfam.simple", "--target", "sm90", "--stage", "ttir", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert [k["stage"] for k in data["kernels"]] == ["ttir"] * len(data["kernels"])
    assert any("tt.func public @scale2" in k["text"] for k in data["kernels"])


def test_list_json_docs_path_resolves(capsys):
    assert main(["list", "--json"]) == 0
    fams = json.loads(capsys.readouterr().out)["families"]
    kda = next(f for f in fams if f["name"] == "kda")
    assert Path(kda["docs"]).is_absolute() and Path(kda["docs"]).is_file()
    assert kda["docs"].endswith(kda["docs_repo_path"])


def _raises_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


@pytest.fixture
def sigint_handler(request):
    """SIGINT set to ``request.param`` for the test, whatever this process started with (a
    background job starts with SIGINT ignored), and put back after."""
    import signal

    before = signal.signal(signal.SIGINT, request.param)
    yield request.param
    signal.signal(signal.SIGINT, before)


def _swallowing(args):
    import os
    import signal

    try:
        os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt:
        pass  # what the native code did
    print("finished anyway")
    return 0


@pytest.mark.parametrize(
    "sigint_handler",
    [signal.default_int_handler, _raises_keyboard_interrupt],
    indirect=True,
    ids=["python's", "the caller's"],
)
def test_ctrl_c_swallowed_by_native_code_still_exits_130(capsys, monkeypatch, sigint_handler):
    """Triton's native binder once caught a KeyboardInterrupt that landed in a lazy import (the
    build ran on and exited 0): a Ctrl-C the command never sees still ends in exit 130, and the
    handler installed before the call is back after it."""
    from kreg.cli import list_cmd

    monkeypatch.setattr(list_cmd, "run", _swallowing)
    assert main(["list"]) == 130
    assert capsys.readouterr().err == "kreg: interrupted\n"
    assert signal.getsignal(signal.SIGINT) is sigint_handler  # restored


@pytest.mark.parametrize("sigint_handler", [signal.SIG_IGN], indirect=True, ids=["ignored"])
def test_ctrl_c_ignored_by_the_caller_stays_ignored(capsys, monkeypatch, sigint_handler):
    """Started with SIGINT ignored (``nohup``, ``cmd &`` in a script), the command runs to its
    end through a SIGINT, as the caller asked."""
    from kreg.cli import list_cmd

    monkeypatch.setattr(list_cmd, "run", _swallowing)
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert out == "finished anyway\n" and err == ""
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


_SIGINT_MIDWAY = """
import os, signal, sys
from kreg.cli import list_cmd, main
run = list_cmd.run
def interrupted_run(args):
    os.kill(os.getpid(), signal.SIGINT)
    return run(args)
list_cmd.run = interrupted_run
sys.exit(main(["list"]))
"""


@pytest.mark.parametrize("disposition, code", [("SIG_IGN", 0), ("SIG_DFL", 130)])
def test_the_cli_started_with_sigint_ignored_or_not(plugin_env, tmp_path, disposition, code):
    """The CLI in a process of its own, started as a background job starts it (SIGINT ignored:
    a SIGINT midway changes nothing) or as a terminal does (exit 130, one line), from a
    directory that is not the checkout."""

    def start():
        signal.signal(signal.SIGINT, getattr(signal, disposition))

    r = subprocess.run([sys.executable, "-c", _SIGINT_MIDWAY], capture_output=True, text=True,
                       env=plugin_env.env(KREG_PLUGINS="none"), preexec_fn=start, timeout=120,
                       cwd=tmp_path)  # fmt: skip
    assert r.returncode == code, r.stderr
    if code == 0:
        assert r.stderr == "" and "\nFamilies\n" in "\n" + r.stdout
    else:
        assert r.stderr == "kreg: interrupted\n" and r.stdout == ""


def test_golden_update_of_some_cases_keeps_the_others(testfam, capsys, monkeypatch, tmp_path):
    """`update --case` (and update(cases=...)) replaces those cases' entries, never the file."""
    from kreg import golden

    def compute(registry, the_plan, **options):  # no compile: a fake entry per kernel
        doc = {k: {"skipped": v} for k, v in the_plan.skipped.items()}
        return {**doc, **{k: {"shared_bytes": 7} for k in the_plan.kernel_keys()}}

    monkeypatch.setattr(golden, "compute", compute)
    version = golden.triton_version()
    others = {f"kda/case{i}/sm90/prep": {"shared_bytes": i} for i in range(70)}
    stale = {"testfam/testfam_simple_b256/sm90/scale2": {"shared_bytes": 1}}
    path = tmp_path / "golden.json"
    golden.save(path, {"format": 1, "triton": {version: {**others, **stale}, "0.0.1": {"a": {}}}})

    assert (
        main(["golden", "update", "--file", str(path), "-q", "--case", "testfam_simple_b256"]) == 0
    )
    out = capsys.readouterr().out
    doc = golden.load(path)
    sub = doc["triton"][version]
    assert {k: sub[k] for k in others} == others  # all 70 kept
    assert sub["testfam/testfam_simple_b256/sm90/scale2"] == {"shared_bytes": 7}
    assert set(sub) - set(others) == {
        f"testfam/testfam_simple_b256/{t}/scale2" for t in testfam.targets
    }
    assert doc["triton"]["0.0.1"] == {"a": {}}
    assert "testfam/testfam_simple_b256/sm90/scale2: shared_bytes 1 -> 7" in out
    assert "kda/case" not in out  # the kept cases are no change
    assert path.read_text() == golden.dumps(doc)

    assert main(["golden", "update", "--file", str(path), "--case", "nope"]) == 2
    assert "unknown golden case(s) nope" in capsys.readouterr().err
    # without cases the sub-document is the registered cases' (dropped ones go)
    golden.update(testfam, path, jobs=1)
    assert not any(k.startswith("kda/case") for k in golden.load(path)["triton"][version])


def test_generated_files_need_a_root_outside_a_checkout(tmp_path, monkeypatch, capsys):
    """From an installed kreg (no kreg pyproject.toml beside the package) the commands that
    read or write the repository's generated files refuse to guess, in one line, exit 2; with
    --root they work there."""
    from kreg import checkout

    monkeypatch.setattr(checkout, "PACKAGE_PARENT", tmp_path / "site-packages")
    for argv in (["matrix", "--write"], ["matrix", "--check"], ["docs", "--write"],
                 ["docs", "--check"], ["golden", "check"], ["golden", "update"]):  # fmt: skip
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not from a kreg checkout: pass --root" in err, err
    repo = tmp_path / "repo"
    repo.mkdir()
    assert main(["matrix", "--write", "--root", str(repo)]) == 0
    assert (repo / "SUPPORT_MATRIX.md").is_file()
    assert main(["matrix", "--check", "--root", str(repo)]) == 0


def test_the_checkout_is_recognised():
    from kreg import checkout

    assert checkout.checkout_root() == Path(__file__).resolve().parents[1]


def test_build_takes_the_problem_options_explain_takes(capsys, monkeypatch):
    """`kreg build kda ... B=2 T=4096 H=8` resolves the spec `kreg explain kda ... B=2 T=4096
    H=8` selects, not the default problem's (the compile is faked: only specs are compared)."""
    from kreg.cli import _util, build_cmd

    monkeypatch.setattr(build_cmd, "compile_all", lambda builders, spec, target, problem=None: {})
    opts = ["B=2", "T=65536", "H=2"]
    assert main(["explain", "kda", "--target", "gfx950", "--json", *opts]) == 0
    explained = json.loads(capsys.readouterr().out)["selected"]["spec"]
    assert main(["explain", "kda", "--target", "gfx950", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)["selected"]["spec"]
    assert explained != default  # the options matter for this problem
    target = _util.get_target("gfx950")
    built = build_cmd.resolve("kda", target, dict(o.split("=") for o in opts))[1]
    assert _util.jsonable(built) == explained
    # the command line reaches it: with the faked compile nothing is built, one line, exit 2
    assert main(["build", "kda", "--target", "gfx950", *opts]) == 2
    assert "uses none of the kernels" in capsys.readouterr().err
    assert main(["build", "kda", "--target", "gfx950", "nope=1"]) == 2
    assert "bad problem options" in capsys.readouterr().err


def test_the_readme_demo_runs():
    """scripts/demo.sh's last step (the README's CPU job): a small prefill under the interpreter
    against both oracles, and fused against its bitwise pair. It once failed (the bound its
    gate activation requires was never passed) and no test noticed."""
    r = subprocess.run([sys.executable, "-m", "kreg.families.kda.demo"], capture_output=True,
                       text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("OK") and "bit for bit: True" in r.stdout
