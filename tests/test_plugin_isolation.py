"""Hostile third-party plugins, installed through real entry points: none of them may take down
``kreg list``, the registry or ``kda_prefill``, and none may take over another family."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from kreg.cli import main

GOOD = """
from kreg.registry import hookimpl
from kreg_testfam.family import FAMILY

@hookimpl
def kreg_register_families(register):
    register(FAMILY)
"""

# A well-formed family serving LinearAttentionProblem, at a priority above kda's: accepts
# everything, one spec valid everywhere, a builder that is never called here.
FOREIGN = """
import attrs
from kreg.problems import LinearAttentionProblem
from kreg.registry import ACCEPT, Candidate, Family, hookimpl

@attrs.frozen
class EvilSpec:
    chunk: int = 64

def build(spec, target):
    raise AssertionError("never compiled")

FAST = Candidate(
    name="evil.split", family="evil", problem_type=LinearAttentionProblem,
    spec_types=(EvilSpec,), enumerate_specs=lambda target: [EvilSpec()],
    is_valid=lambda spec, target, problem=None: ACCEPT, builders={"k": build},
    priority=10**6, description="takes over everything",
)

@hookimpl
def kreg_register_families(register):
    register(Family(name="evil", problem_type=LinearAttentionProblem, candidates=(FAST,)))
"""


def test_sys_exit_in_hook_is_isolated(plugin_env):
    plugin_env.install("good", "kreg_t_good", GOOD)
    src = "import sys\nfrom kreg.registry import hookimpl\n\n@hookimpl\n"
    src += "def kreg_register_families(register):\n    sys.exit(3)\n"
    plugin_env.install("exits", "kreg_t_exits", src)
    reg = plugin_env.registry()
    assert "testfam" in reg.families and "good" in reg.plugins
    broken = dict(reg.broken)
    assert set(broken) == {"exits"} and "exits" not in reg.plugins
    assert broken["exits"].startswith("kreg_register_families raised SystemExit(3)")


def test_argparse_at_import_is_isolated(plugin_env, capsys):
    src = """
    import argparse
    parser = argparse.ArgumentParser(prog="evilcli")
    parser.add_argument("--model", required=True)
    parser.parse_args()
    """
    plugin_env.install("argp", "kreg_t_argp", src)
    argv = list(sys.argv)
    reg = plugin_env.registry()
    assert sys.argv == argv
    [(name, error)] = reg.broken
    assert name == "argp" and error.startswith("SystemExit(2)")
    assert "the following arguments are required: --model" in error  # what it printed
    out, err = capsys.readouterr()
    assert out == "" and err == ""  # its usage message is quoted, not printed


class Boom(BaseException):
    pass


@pytest.mark.parametrize("where", ["import", "hook"])
def test_base_exception_isolated_keyboard_interrupt_not(plugin_env, where):
    raise_it = "raise {}\n"
    hook = "from kreg.registry import hookimpl\n@hookimpl\ndef kreg_register_targets(register):\n"
    for exc, fatal in (("GeneratorExit('odd')", False), ("KeyboardInterrupt()", True)):
        body = raise_it.format(exc)
        src = body if where == "import" else hook + "    " + body
        module = f"kreg_t_base_{where}_{fatal}"
        plugin_env.install(f"b{where}{fatal}", module, src)
        sys.modules.pop(module, None)
        if fatal:
            with pytest.raises(KeyboardInterrupt):
                plugin_env.registry()
        else:
            [(_, error)] = plugin_env.registry().broken
            assert "GeneratorExit: odd" in error


def test_argv_mutation_and_prints_are_contained(plugin_env, capsys):
    src = GOOD + (
        "import sys\nprint('hello from a plugin')\nsys.argv.append('--evil')\n"
        "@hookimpl\ndef kreg_register_targets(register):\n"
        "    print('registering')\n    sys.argv[:] = ['nope']\n"
    )
    plugin_env.install("noisy", "kreg_t_noisy", src)
    argv = list(sys.argv)
    reg = plugin_env.registry()
    assert sys.argv == argv
    assert reg.broken == [] and "testfam" in reg.families
    assert ("noisy", "import changed sys.argv (restored)") in reg.warnings
    assert ("noisy", "kreg_register_targets changed sys.argv (restored)") in reg.warnings
    out, err = capsys.readouterr()
    assert out == "" and "hello from a plugin" in err  # passed on to stderr, off stdout
    # and `kreg list --json` stays JSON
    plugin_env.registry()  # reloaded (the module stays imported): the hook prints again
    out, err = capsys.readouterr()
    assert out == "" and "registering" in err
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr()[0])
    warning = {"plugin": "noisy", "warning": "kreg_register_targets changed sys.argv (restored)"}
    assert warning in data["warnings"]


def test_unmarked_and_misspelled_hooks_are_reported(plugin_env, capsys):
    unmarked = GOOD.replace("@hookimpl\n", "") + "kreg_register_scenarios = print\n"
    plugin_env.install("unmarked", "kreg_t_unmarked", unmarked)
    typo = "from kreg.registry import hookimpl\n@hookimpl\ndef register_families(register):\n"
    plugin_env.install("typo", "kreg_t_typo2", typo + "    pass\n")
    reg = plugin_env.registry()
    assert "testfam" in reg.families  # called as a hook anyway, as pytest does
    warnings = [w for p, w in reg.warnings if p == "unmarked"]
    assert warnings == [
        "kreg_register_families is not marked @hookimpl (called as a hook anyway)",
        "kreg_register_scenarios looks like a kreg hook but is a builtin_function_or_method, "
        "not a function: ignored",
    ]
    error = dict(reg.broken)["typo"]
    assert "unknown hook 'register_families'" in error
    assert "did you mean 'kreg_register_families'?" in error
    assert main(["list"]) == 0
    out, _ = capsys.readouterr()
    assert "Plugin warnings\n  unmarked: kreg_register_families is not marked" in out
    assert "  typo (kreg-plugin-typo 0.1): PluginValidationError: unknown hook" in out


def test_list_shows_plugin_distributions(plugin_env, capsys):
    plugin_env.install("good", "kreg_t_good2", GOOD)
    plugin_env.install("bad", "kreg_t_bad_import", "raise RuntimeError('nope')\n")
    reg = plugin_env.registry()
    info = reg.plugins["good"]
    assert (info.distribution, info.version, info.value) == (
        "kreg-plugin-good",
        "0.1",
        "kreg_t_good2",
    )
    assert main(["list"]) == 0
    out, _ = capsys.readouterr()
    rows = [line.split() for line in out.splitlines()]
    assert ["good", "kreg-plugin-good", "0.1", "kreg_t_good2"] in rows
    assert "  bad (kreg-plugin-bad 0.1): RuntimeError: nope" in out
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr()[0])
    assert data["plugins"] == [
        {
            "name": "good",
            "distribution": "kreg-plugin-good",
            "version": "0.1",
            "entry_point": "kreg_t_good2",
        }
    ]
    assert data["broken"] == [
        {
            "plugin": "bad",
            "error": "RuntimeError: nope",
            "distribution": "kreg-plugin-bad",
            "version": "0.1",
        }
    ]


def _kda_problem():
    from kreg.problems import LinearAttentionProblem

    return LinearAttentionProblem.from_options({})


def test_foreign_family_never_takes_over_kda_or_gdn(plugin_env, monkeypatch, capsys):
    """A throwaway family on the shared problem type, at a priority above everything, taking
    every problem: kda_prefill and gdn_prefill (and their ``explain``) still run their own."""
    from kreg.dispatch import select
    from kreg.families.gdn import gdn_prefill
    from kreg.families.kda import api

    plugin_env.install("evil", "kreg_t_evil", FOREIGN)
    reg = plugin_env.registry()
    assert "evil.split" in reg.candidates and reg.broken == []
    problem = _kda_problem()
    # without family= every family competes (unchanged behaviour) ...
    assert select(problem, "sm90").candidate.name == "evil.split"
    # ... with it, only kda's candidates do
    assert select(problem, "sm90", family="kda").candidate.name == "kda.split"
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        select(problem, "sm90", family="nope")

    seen = []
    monkeypatch.setattr(api, "run_selection", lambda sel, call, problem, *_: seen.append(sel))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors pass the checks; nothing launches
    B, T, H, D = 1, 64, 2, 64
    q, k, v = (torch.randn(B, T, H, D) for _ in range(3))
    g = -torch.rand(B, T, H, D)
    beta = torch.rand(B, T, H)
    api.kda_prefill(q, k, v, g, beta, target="sm90")
    api.kda_prefill(q, k, v, g, beta, target="sm90", algorithm="split")
    gdn_prefill(q, k, v, g[..., 0], beta, target="sm90")  # a scalar gate [B, T, HV]
    gdn_prefill(q, k, v, g[..., 0], beta, target="sm90", algorithm="split")
    assert [s.candidate.name for s in seen] == ["kda.split"] * 2 + ["gdn.split"] * 2
    monkeypatch.delenv("TRITON_INTERPRET")
    gdn = reg.families["gdn"].problem()
    assert select(gdn, "sm90").candidate.name == "evil.split"  # every family competes ...
    assert select(gdn, "sm90", family="gdn").candidate.name == "gdn.split"  # ... or gdn's only

    assert main(["explain", "kda", "--target", "sm90", "--verbose"]) == 0
    out, _ = capsys.readouterr()
    assert "selected    kda.split" in out.splitlines()
    assert main(["explain", "kda", "--target", "sm90", "--json"]) == 0
    data = json.loads(capsys.readouterr()[0])
    assert data["selected"]["candidate"] == "kda.split"
    assert not any(e["candidate"].startswith("evil.") for e in data["trace"])
    assert main(["explain", "evil", "--target", "sm90", "--verbose"]) == 0
    assert "selected    evil.split" in capsys.readouterr()[0].splitlines()
    assert main(["explain", "gdn", "--target", "sm90", "--verbose"]) == 0
    assert "selected    gdn.split" in capsys.readouterr()[0].splitlines()


def test_foreign_rules_that_raise_neither_break_select_nor_list(plugin_env, capsys):
    src = FOREIGN.replace(
        "enumerate_specs=lambda target: [EvilSpec()]", "enumerate_specs=lambda target: exit(4)"
    )
    plugin_env.install("evil", "kreg_t_evil_raises", src)
    plugin_env.registry()
    sel = select_default()
    assert sel.candidate.name == "kda.split"  # even without family=
    [entry] = [e for e in sel.trace if e.candidate == "evil.split" and e.stage == "spec"]
    assert not entry.ok and "raised SystemExit: 4" in entry.reason
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr()[0])
    [evil] = [c for c in data["candidates"] if c["name"] == "evil.split"]
    assert evil["coverage"]["sm90"] == {"supported": True, "error": "SystemExit: 4"}


def select_default():
    from kreg.dispatch import select

    return select(_kda_problem(), "sm90")


# --- hostile registrations (an audit of 2026-12-04) -----------------------------------------------
# Each attack once passed registration and then took down every selection (kda_prefill's too),
# took kda_prefill over, or ran unisolated; now each is refused at registration, by name.

CHAMELEON = """
class Chameleon(str):  # equal to every string: once matched family="kda" in the selector
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = str.__hash__
"""

HOSTILE = {
    "problem_type_not_a_type": ("problem_type=LinearAttentionProblem,\n    spec_types",
                                'problem_type="LinearAttentionProblem",\n    spec_types',
                                "serves 'LinearAttentionProblem'"),
    "priority_not_an_int": ("priority=10**6", 'priority="high"', "priority must be an int"),
    "family_name_chameleon": ('family="evil"', 'family=Chameleon("evil")', "must be a non-empty str"),
    "spec_types_not_types": ("spec_types=(EvilSpec,)", 'spec_types=("EvilSpec",)',
                             "spec_types must be classes"),
    # a family's data package is read at selection: one that is not there, or is a module and
    # not a package, would fail every selection of its problems
    "data_missing": ("candidates=(FAST,))", 'candidates=(FAST,), data="kreg_t_no_such_pkg")',
                     "data 'kreg_t_no_such_pkg' is not an importable package"),
    "data_a_module": ("candidates=(FAST,))", 'candidates=(FAST,), data="attrs.validators")',
                      "data 'attrs.validators' is not an importable package"),
    "data_chameleon": ("candidates=(FAST,))", 'candidates=(FAST,), data=Chameleon("kreg"))',
                       "data must be a non-empty str"),
}  # fmt: skip


@pytest.mark.parametrize("attack", list(HOSTILE))
def test_hostile_candidate_fields_are_refused_and_kda_is_untouched(plugin_env, attack):
    old, new, message = HOSTILE[attack]
    assert old in FOREIGN
    plugin_env.install("evil", f"kreg_t_{attack}", CHAMELEON + FOREIGN.replace(old, new))
    reg = plugin_env.registry()
    assert "evil.split" not in reg.candidates
    [(name, error)] = reg.broken
    assert name == "evil" and message in error, error
    assert select_default().candidate.name == "kda.split"
    from kreg.dispatch import select

    assert select(_kda_problem(), "sm90", family="kda").candidate.name == "kda.split"


def test_an_entry_point_named_like_a_builtin_is_refused(plugin_env):
    """``builtin:...`` names once ran a plugin's hooks unisolated (a SystemExit in a hook took
    down kreg list, select and kda_prefill)."""
    src = FOREIGN.replace("def kreg_register_families(register):",
                          "def kreg_register_families(register):\n    raise SystemExit('bye')")  # fmt: skip
    plugin_env.install("builtin:evil", "kreg_t_builtin_name", src)
    reg = plugin_env.registry()
    [(name, error)] = reg.broken
    assert name == "builtin:evil" and "reserved" in error
    assert select_default().candidate.name == "kda.split"


def _with_golden_case(name: str) -> str:
    """The testfam plugin, plus one golden case named ``name``."""
    return (
        GOOD
        + f"""
from kreg.registry import GoldenCase
from kreg_testfam.family import Tile, VecSpec

@hookimpl
def kreg_register_golden_cases(register):
    register(GoldenCase(name={name!r}, candidate="testfam.simple", spec=VecSpec(Tile(256, 4))))
"""
    )


def test_names_cross_kinds_only_within_one_plugin(plugin_env):
    """A golden case named like kda's candidate once rewrote that candidate's origin (which
    decides whether its errors are hidden as a third party's)."""
    plugin_env.install("sly", "kreg_t_sly", _with_golden_case("kda.split"))
    reg = plugin_env.registry()
    [(name, error)] = reg.broken
    assert name == "sly" and "'kda.split': the name is already registered by" in error
    assert reg.origin["kda.split"].startswith("builtin:")


def test_golden_case_names_differing_only_in_case_are_refused(plugin_env):
    plugin_env.install("shouty", "kreg_t_shouty", _with_golden_case("SPLIT_D128_C32"))
    reg = plugin_env.registry()
    [(name, error)] = reg.broken
    assert name == "shouty" and "only in letter case" in error


def test_a_foreign_tie_leaves_kdas_own_ranking_alone(plugin_env):
    """A foreign family at kda's priority once switched off the cost ranking between kda's own
    candidates in a select without family= (kda.recurrent won prefill by name)."""
    src = FOREIGN.replace("priority=10**6", "priority=10").replace('name="evil.split"',
                                                                     'name="zzz.split"')  # fmt: skip
    src = src.replace('family="evil"', 'family="zzz"').replace('name="evil"', 'name="zzz"')
    plugin_env.install("zzz", "kreg_t_zzz", src)
    reg = plugin_env.registry()
    assert "zzz.split" in reg.candidates and reg.broken == []
    sel = select_default()
    assert sel.candidate.name == "kda.split"  # kda's cost ranking, then the families by name
    [entry] = [e for e in sel.trace if e.candidate == "zzz.split" and e.stage == "ranked"]
    assert not entry.ok and "by name" in entry.reason


def test_a_foreign_cost_that_raises_is_isolated_in_the_ranking(plugin_env):
    src = FOREIGN.replace('description="takes over everything"',
                          'description="x", cost=lambda spec, problem, target: exit(5)')  # fmt: skip
    plugin_env.install("evil", "kreg_t_evil_cost", src)
    plugin_env.registry()
    sel = select_default()
    assert sel.candidate.name == "kda.split"
    [entry] = [e for e in sel.trace if e.candidate == "evil.split" and e.stage == "ranked"]
    assert "its ranking of this third-party candidate raised SystemExit: 5" in entry.reason


def test_a_rule_that_prints_keeps_list_json_parseable(plugin_env, capsys):
    src = FOREIGN.replace("enumerate_specs=lambda target: [EvilSpec()]",
                          "enumerate_specs=lambda target: print('hello') or [EvilSpec()]")  # fmt: skip
    plugin_env.install("evil", "kreg_t_evil_prints", src)
    plugin_env.registry()
    assert main(["list", "--json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert any(c["name"] == "evil.split" for c in data["candidates"]) and "hello" in err


# --- a second family on the shared problem type ---------------------------------------------------
# A scalar-gate family serving LinearAttentionProblem (the second family the project expects):
# it states its problems through default_options, and installing it changes none of kreg's files.

SCALAR = FOREIGN.replace('priority=10**6, description="takes over everything"',
                         'accepts=lambda p: Verdict.check((p.gate == "scalar", "scalar gates only")),'
                         ' description="scalar gate"').replace(
    'register(Family(name="evil", problem_type=LinearAttentionProblem, candidates=(FAST,)))',
    'register(Family(name="evil", problem_type=LinearAttentionProblem, candidates=(FAST,),'
    ' default_options={"gate": "scalar"}))').replace(
    "from kreg.registry import ACCEPT,", "from kreg.registry import Verdict, ACCEPT,")  # fmt: skip


def test_a_family_on_a_shared_problem_type_states_its_default_problem(plugin_env, capsys):
    from kreg import matrix

    plugin_env.install("evil", "kreg_t_scalar", SCALAR)
    reg = plugin_env.registry()
    assert reg.broken == [] and reg.families["evil"].problem().gate == "scalar"
    assert main(["explain", "evil", "--target", "sm90", "--verbose"]) == 0  # its default problem
    assert "selected    evil.split" in capsys.readouterr()[0].splitlines()
    assert main(["explain", "evil", "--target", "sm90", "gate=per_channel"]) == 2
    capsys.readouterr()
    rows = [r for r in matrix.build(reg) if r.candidate == "evil.split"]
    assert rows and all(r.cells for r in rows)  # its probes are scalar-gate problems
    assert all(r.verification == matrix.THIRD_PARTY for r in rows)
    assert select_default().candidate.name == "kda.split"  # per-channel: kda's


def test_an_installed_plugin_leaves_kregs_own_files_current(plugin_env, capsys):
    plugin_env.install("evil", "kreg_t_scalar_files", SCALAR)
    assert "evil" in plugin_env.registry().families
    for argv in (["matrix", "--check"], ["docs", "--check"]):
        assert main(argv) == 0, (argv, capsys.readouterr())
    capsys.readouterr()
    from kreg.cli._util import repository_registry

    class Args:
        root = file = None

    reg, plugins = repository_registry(Args())
    assert "evil" not in reg.families and plugins == "none"
