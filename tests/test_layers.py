"""The house's floors: nothing below the CLI imports it (the CLI renders what the library
computes, never the other way round). Read from the sources, so a new import fails here."""

from __future__ import annotations

import ast
from pathlib import Path

KREG = Path(__file__).resolve().parents[1] / "kreg"


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_nothing_below_the_cli_imports_it():
    below = [p for p in KREG.rglob("*.py")
             if "cli" not in p.relative_to(KREG).parts[:1] and p.name != "__main__.py"]  # fmt: skip
    assert len(below) > 40  # the walk found the library
    upward = {str(p.relative_to(KREG)): sorted(m for m in _imports(p)
                                              if m == "kreg.cli" or m.startswith("kreg.cli."))
              for p in below}  # fmt: skip
    assert {p: m for p, m in upward.items() if m} == {}
