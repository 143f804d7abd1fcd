"""scripts/venv.sh chooses torch as the README says, on a machine without this one's local
wheels too: its pip commands printed (KREG_DRY_RUN=1), never run, in a venv without torch."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


@pytest.fixture(scope="module")
def venv_sh(tmp_path_factory):
    """Run scripts/venv.sh for one throwaway venv under a pip configuration of nothing but the
    given environment (no config file, no find-links of this machine)."""
    venv = tmp_path_factory.mktemp("venv") / "v"

    def run(**env: str) -> subprocess.CompletedProcess:
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("PIP_", "KREG_", "PYTHONPATH", "VIRTUAL_ENV"))}  # fmt: skip
        base.update(PIP_CONFIG_FILE=os.devnull, KREG_VENV=str(venv), KREG_DRY_RUN="1",
                    PYTHON=sys.executable, **env)  # fmt: skip
        return subprocess.run(["bash", str(ROOT / "scripts/venv.sh")], capture_output=True,
                              text=True, env=base, timeout=300)  # fmt: skip

    return run


def _pip_lines(r: subprocess.CompletedProcess) -> list[str]:
    assert r.returncode == 0, r.stderr
    return [line[3:] for line in r.stderr.splitlines() if line.startswith("== pip install ")]


def test_an_ordinary_machine_gets_the_cpu_build_from_pytorchs_index(venv_sh):
    r = venv_sh()
    first, kreg = _pip_lines(r)
    assert first == f"pip install torch {CPU_INDEX}"
    assert "about 190 MB" in r.stderr
    assert kreg == f"pip install -e {ROOT}[test] triton==3.6.0"


def test_the_default_build_says_its_size(venv_sh):
    r = venv_sh(KREG_TORCH="default")
    assert _pip_lines(r)[0] == "pip install torch"
    assert "the CUDA build with its nvidia-* libraries and its own Triton, about 3 GB" in r.stderr


def test_a_local_wheel_folder_is_used_without_download(venv_sh, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "torch-9.9.9+local-py3-none-any.whl", "w") as whl:
        info = "torch-9.9.9+local.dist-info"
        whl.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9+local\n"
        )
        whl.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(f"{info}/RECORD", "")
    r = venv_sh(PIP_FIND_LINKS=str(wheels))
    assert _pip_lines(r)[0] == "pip install torch==9.9.9+local"
    assert "torch 9.9.9+local from a local wheel folder" in r.stderr
    # asked for the CPU build by name, the local folder is not looked at
    assert _pip_lines(venv_sh(PIP_FIND_LINKS=str(wheels), KREG_TORCH="cpu"))[0].endswith(CPU_INDEX)


def test_an_installed_torch_is_used_as_it_is(venv_sh, tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('__version__ = "9.9.9+mine"\n')
    for choice in ("cpu", "default"):
        r = venv_sh(PYTHONPATH=str(tmp_path), KREG_TORCH=choice)
        [kreg] = _pip_lines(r)  # no torch install at all
        assert kreg.endswith(" torch==9.9.9+mine")  # pip may not replace it
        assert "torch 9.9.9+mine, already installed: used as it is" in r.stderr


def test_an_unknown_choice_is_refused(venv_sh):
    r = venv_sh(KREG_TORCH="gpu")
    assert r.returncode == 2
    assert "KREG_TORCH=gpu: expected auto, cpu, default or system" in r.stderr
