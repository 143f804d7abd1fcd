"""Where the generated files live: the kreg checkout this package runs from, if it is one.

``SUPPORT_MATRIX.md``, the docs' generated blocks and ``golden/ir_sha256.json`` belong to the
repository. From an installed wheel the package sits in site-packages: commands that read or
write those files then need ``--root`` (or ``--file``) and refuse to guess.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE_PARENT = Path(__file__).resolve().parents[1]
_PROJECT_NAME = re.compile(r'^name\s*=\s*"kreg"\s*$', re.M)


class NotACheckout(ValueError):
    """kreg is not running from its checkout and no root was given."""


def checkout_root() -> Path | None:
    """The repository root when this kreg is a checkout (its pyproject.toml names the kreg
    project beside the package), None when it is installed."""
    pyproject = PACKAGE_PARENT / "pyproject.toml"
    if pyproject.is_file() and _PROJECT_NAME.search(pyproject.read_text()):
        return PACKAGE_PARENT
    return None


def repo_root(explicit: Path | None = None) -> Path:
    """``explicit`` if given, else the checkout's root; NotACheckout otherwise."""
    if explicit is not None:
        if not explicit.is_dir():
            raise NotACheckout(f"--root {explicit}: no such directory")
        return explicit.resolve()
    root = checkout_root()
    if root is None:
        raise NotACheckout(
            f"kreg runs from {PACKAGE_PARENT / 'kreg'}, not from a kreg checkout: pass --root "
            "DIR (the repository holding SUPPORT_MATRIX.md, docs/ and golden/)"
        )
    return root
