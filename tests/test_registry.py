"""The plugin host: entry-point discovery, isolation of broken plugins, validation."""

from __future__ import annotations

import pytest

from kreg.registry import RegistrationError, load_registry
from kreg.registry import manager as manager_mod

# Prelude of generated plugin modules: ``fam(name, ...)`` is a one-candidate family derived
# from the test family, with candidate fields overridden by keyword.
PRELUDE = """
import attrs
from kreg.registry import hookimpl
from kreg.registry.targets import SM90
from kreg_testfam.family import FAMILY, SIMPLE

def fam(name, cname=None, **fields):
    c = attrs.evolve(SIMPLE, name=cname or name + ".simple", family=name, **fields)
    return attrs.evolve(FAMILY, name=name, candidates=(c,))
"""


def families_plugin(*families: str, targets: str = "") -> str:
    src = PRELUDE + "\n@hookimpl\ndef kreg_register_families(register):\n"
    src += "".join(f"    register({f})\n" for f in families)
    if targets:
        src += f"\n@hookimpl\ndef kreg_register_targets(register):\n    register({targets})\n"
    return src


def test_entry_point_family_registered_with_origin(testfam):
    reg = testfam
    assert set(reg.targets) >= {"sm90", "gfx950", "gfx942"}
    assert reg.origin["sm90"] == "builtin:kreg.registry.builtin"
    assert reg.families["testfam"].abi_version == 3
    assert {"testfam.simple", "testfam.fast"} <= set(reg.candidates)
    for name in (
        "testfam",
        "testfam.simple",
        "testfam.fast",
        "testfam_simple_b256",
        "testfam.sweep",
    ):
        assert reg.origin[name] == "testfam"
    assert reg.family_of("testfam.fast").name == "testfam"
    assert reg.broken == []


def test_test_family_not_in_default_registry():
    from kreg.registry import get_registry, reset_registry

    reset_registry()
    assert "testfam" not in get_registry().families


def test_import_error_isolated(testfam, plugin_env):
    plugin_env.install("badimport", "kreg_t_badimport", "import kreg_no_such_module_xyz\n")
    reg = plugin_env.registry()
    assert "testfam" in reg.families  # the good plugin still loads
    [(name, error)] = reg.broken
    assert name == "badimport" and "kreg_no_such_module_xyz" in error


def test_exception_in_hook_rolls_back_plugin(plugin_env):
    plugin_env.install("testfam", "kreg_testfam.plugin")
    src = PRELUDE + (
        "\n@hookimpl\ndef kreg_register_targets(register):\n"
        "    register(attrs.evolve(SM90, name='boomtarget'))\n"
        "\n@hookimpl\ndef kreg_register_families(register):\n"
        "    raise RuntimeError('kaboom')\n"
    )
    plugin_env.install("boom", "kreg_t_boom", src)
    reg = plugin_env.registry()
    assert "boomtarget" not in reg.targets and "boomtarget" not in reg.origin
    assert reg.broken == [("boom", "kreg_register_families raised RuntimeError: kaboom")]
    assert "testfam" in reg.families


@pytest.mark.parametrize("decorated", [True, False])
def test_misspelled_hook_rejected(plugin_env, decorated):
    marker = "@hookimpl\n" if decorated else ""
    src = PRELUDE + f"\n{marker}def kreg_register_familes(register):\n    register(fam('typo'))\n"
    plugin_env.install("typo", "kreg_t_typo", src)
    reg = plugin_env.registry()
    assert "typo" not in reg.families
    [(name, error)] = reg.broken
    assert name == "typo" and "kreg_register_familes" in error


def test_duplicate_names_rejected_naming_plugin(testfam, plugin_env):
    plugin_env.install("zdup", "kreg_t_zdup", families_plugin("fam('zfam')", "FAMILY"))
    plugin_env.install("ztarget", "kreg_t_ztarget", families_plugin("fam('zt')", targets="SM90"))
    reg = plugin_env.registry()
    broken = dict(reg.broken)
    assert "duplicate family 'testfam' (already registered by 'testfam')" in broken["zdup"]
    assert "duplicate target 'sm90'" in broken["ztarget"]
    assert "builtin:kreg.registry.builtin" in broken["ztarget"]
    assert "zfam" not in reg.families and "zt" not in reg.families  # rolled back whole
    assert reg.origin["testfam"] == "testfam"


def test_duplicate_candidate_rejected(testfam, plugin_env):
    plugin_env.install(
        "zcand", "kreg_t_zcand", families_plugin("fam('zc', cname='testfam.simple')")
    )
    reg = plugin_env.registry()
    assert "testfam.simple" in dict(reg.broken)["zcand"]


@pytest.mark.parametrize(
    "family, message",
    [
        ("fam('f1', targets=('sm100',))", "candidate 'f1.simple' names unknown targets ['sm100']"),
        ("fam('f2', cname='other.x')", "candidate 'other.x' must be named 'f2.<name>'"),
        ("fam('f3', cname='f3')", "must be named 'f3.<name>'"),
        ("attrs.evolve(fam('f4'), candidates=(SIMPLE,))", "must be named 'f4.<name>'"),
        ("fam('f5', builders={})", "candidate 'f5.simple' has no builders"),
        ("fam('f6', is_valid=None)", "candidate 'f6.simple' has no callable is_valid"),
        ("fam('f7', spec_types=())", "spec type without an enumeration"),
        ("fam('f8', enumerate_specs=None)", "spec type without an enumeration"),
        ("SM90", "registered Target"),
    ],
)
def test_invalid_candidates_rejected(plugin_env, family, message):
    plugin_env.install("bad", "kreg_t_bad", families_plugin(family))
    reg = plugin_env.registry()
    [(name, error)] = reg.broken
    assert name == "bad" and message in error
    assert not set(reg.families) & {"f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8"}


def test_candidate_family_mismatch_rejected(plugin_env):
    src = families_plugin(
        "attrs.evolve(fam('g1'), candidates=(attrs.evolve(SIMPLE, name='g1.x'),))"
    )
    plugin_env.install("bad", "kreg_t_bad2", src)
    [(_, error)] = plugin_env.registry().broken
    assert "says family 'testfam' but is listed by 'g1'" in error


def test_golden_case_and_scenario_validated(plugin_env):
    src = PRELUDE + (
        "from kreg.registry import GoldenCase, Scenario\n"
        "@hookimpl\ndef kreg_register_golden_cases(register):\n"
        "    register(GoldenCase(name='gc', candidate='nope.x', spec=None))\n"
    )
    plugin_env.install("gc", "kreg_t_gc", src)
    src = PRELUDE + (
        "from kreg.registry import Scenario\n"
        "@hookimpl\ndef kreg_register_scenarios(register):\n"
        "    register(Scenario(name='sc', family='nope', description='', cases=list, run=list))\n"
    )
    plugin_env.install("sc", "kreg_t_sc", src)
    broken = dict(plugin_env.registry().broken)
    assert "golden case 'gc' names unknown candidate 'nope.x'" in broken["gc"]
    assert "scenario 'sc' names unknown family 'nope'" in broken["sc"]


def test_dropping_a_plugin_drops_what_depends_on_it(plugin_env):
    # 'a' registers target tx and an invalid family; 'b' uses tx: both must go.
    src_a = families_plugin("fam('fa', spec_types=())", targets="attrs.evolve(SM90, name='tx')")
    plugin_env.install("a", "kreg_t_a", src_a)
    plugin_env.install("b", "kreg_t_b", families_plugin("fam('fb', targets=('tx',))"))
    reg = plugin_env.registry()
    broken = dict(reg.broken)
    assert set(broken) == {"a", "b"}
    assert "unknown targets ['tx']" in broken["b"]
    assert "tx" not in reg.targets and "fb" not in reg.families


def test_kreg_plugins_env(testfam, plugin_env, monkeypatch):
    plugin_env.install("other", "kreg_t_other", families_plugin("fam('otherfam')"))
    assert {"testfam", "otherfam"} <= set(plugin_env.registry().families)
    for value in ("none", "", " "):
        monkeypatch.setenv("KREG_PLUGINS", value)
        reg = plugin_env.registry()
        assert not {"testfam", "otherfam"} & set(reg.families) and reg.broken == []
    monkeypatch.setenv("KREG_PLUGINS", "testfam, missing")
    reg = plugin_env.registry()
    assert "testfam" in reg.families and "otherfam" not in reg.families
    assert [name for name, _ in reg.broken] == ["missing"]
    assert set(load_registry("other").families) >= {"otherfam"}  # explicit argument wins


def test_builtin_plugin_errors_raise(plugin_env, monkeypatch):
    src = PRELUDE + "\n@hookimpl\ndef kreg_register_targets(register):\n    register(SM90)\n"
    plugin_env.install("unused", "kreg_t_dupbuiltin", src)
    with pytest.raises(
        RegistrationError, match="builtin:kreg_t_dupbuiltin.*duplicate target 'sm90'"
    ):
        load_registry("none", builtins=("kreg.registry.builtin", "kreg_t_dupbuiltin"))
    with pytest.raises(RegistrationError, match="builtin:kreg_not_here_xyz"):
        load_registry("none", builtins=("kreg.registry.builtin", "kreg_not_here_xyz"))
    plugin_env.install("unused2", "kreg_t_inner", "import kreg_missing_dependency_xyz\n")
    with pytest.raises(RegistrationError, match="kreg_missing_dependency_xyz"):
        load_registry("none", builtins=("kreg_t_inner",))


def test_builtin_families_are_the_family_folders_with_a_plugin(tmp_path, monkeypatch):
    """Every folder of kreg/families/ with a plugin.py is registered, found by listing the
    folder (one mechanism for every built-in family); a folder without one is not a family."""
    from kreg.registry.manager import builtin_plugins

    found = builtin_plugins()
    assert found[0] == "kreg.registry.builtin"
    assert "kreg.families.kda.plugin" in found
    root = tmp_path / "kreg_t_fams"
    for name, files in {"zeta": ["__init__.py", "plugin.py"], "notes": ["__init__.py"]}.items():
        (root / name).mkdir(parents=True)
        for f in files:
            (root / name / f).write_text("")
    (root / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(manager_mod, "FAMILIES_PACKAGE", "kreg_t_fams")
    assert builtin_plugins() == ("kreg.registry.builtin", "kreg_t_fams.zeta.plugin")
