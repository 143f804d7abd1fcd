"""Shared fixtures: the ``gpu`` marker and plugins installed through real entry points.

``plugin_env`` makes a throwaway site directory on ``sys.path`` holding ``*.dist-info`` folders
(METADATA + entry_points.txt in group ``kreg``) and, where given, the plugin modules themselves;
the registry and dispatch caches are reset around each test so loading is really re-done.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PLUGINS = TESTS / "plugins"  # kreg_testfam lives here: never part of the installed package
ROOT = TESTS.parent


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA or ROCm GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU: torch.cuda.is_available() is false")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class PluginEnv:
    def __init__(self, site: Path):
        self.site = site
        self.modules: list[str] = []

    def install(self, name: str, target: str, source: str | None = None) -> None:
        """Install entry point ``name = target`` in group ``kreg`` as its own distribution;
        ``source`` (if given) becomes the module ``target`` names."""
        dist = self.site / f"kreg_plugin_{name}-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: kreg-plugin-{name}\nVersion: 0.1\n"
        )
        (dist / "entry_points.txt").write_text(f"[kreg]\n{name} = {target}\n")
        if source is not None:
            module = target.split(":")[0]
            (self.site / f"{module}.py").write_text(textwrap.dedent(source))
            self.modules.append(module)

    def registry(self):
        from kreg.dispatch import clear_cache
        from kreg.registry import get_registry, reset_registry

        reset_registry()
        clear_cache()
        return get_registry()

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a ``python -m kreg`` subprocess that sees these plugins."""
        env = {k: v for k, v in os.environ.items() if k != "KREG_PLUGINS"}
        path = [str(self.site), str(PLUGINS), str(ROOT), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        env.update(extra)
        return env


@pytest.fixture
def plugin_env(tmp_path, monkeypatch):
    from kreg.dispatch import clear_cache
    from kreg.registry import reset_registry

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("KREG_PLUGINS", raising=False)
    monkeypatch.delenv("KREG_TUNING", raising=False)
    env = PluginEnv(site)
    yield env
    for module in env.modules:
        sys.modules.pop(module, None)
    monkeypatch.undo()
    reset_registry()
    clear_cache()


@pytest.fixture
def testfam(plugin_env):
    """The registry with the test-only family installed through entry point ``testfam``."""
    plugin_env.install("testfam", "kreg_testfam.plugin")
    return plugin_env.registry()


@pytest.fixture(scope="module")
def builtin_registry():
    """The process-wide registry with built-in plugins only (what the committed generated files
    describe), restored afterwards."""
    from kreg.dispatch import clear_cache
    from kreg.registry import get_registry, reset_registry

    old = os.environ.get("KREG_PLUGINS")
    os.environ["KREG_PLUGINS"] = "none"
    reset_registry()
    clear_cache()
    yield get_registry()
    if old is None:
        del os.environ["KREG_PLUGINS"]
    else:
        os.environ["KREG_PLUGINS"] = old
    reset_registry()
    clear_cache()
