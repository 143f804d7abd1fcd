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


def _modules() -> dict[str, Path]:
    out = {}
    for p in KREG.rglob("*.py"):
        parts = list(p.relative_to(KREG.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _edges(name: str, path: Path, modules: dict) -> set[str]:
    """The kreg modules ``name`` imports anywhere in its body (a function's lazy import counts:
    it runs whenever that function does). ``from .pkg import mod`` names the module."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(filter(None, (base, node.module)))
            for a in node.names:
                sub = f"{module}.{a.name}"
                out.add(sub if sub in modules else module)
    return {m for m in out if m in modules and m != name}


def test_no_import_cycle():
    """Not even through a function's lazy import: each floor imports only the floors below it
    (a registration hook importing a family's benchmarks, which import its entry point, which
    imported the registration, was such a cycle)."""
    modules = _modules()
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    assert graph["kreg.families.kda.api"] and graph["kreg.families.kda.plugin"]  # it reads them
    order: dict[str, int] = {}
    cycles = []

    def visit(name: str, stack: list[str]) -> None:
        order[name] = 1  # on the stack
        for dep in sorted(graph[name]):
            if order.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in order:
                visit(dep, stack + [dep])
        order[name] = 2

    for name in sorted(graph):
        if name not in order:
            visit(name, [name])
    assert cycles == []
