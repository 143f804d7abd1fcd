"""Plain text within a width: wrapped paragraphs and tables, for the CLI, the benchmark
summaries and the demo (below the CLI, so those need not import it)."""

from __future__ import annotations

from typing import Any

WIDTH = 100  # columns every table and message of the CLI fits in
_MIN_COLUMN = 12


def wrap(text: str, width: int = WIDTH, indent: str = "") -> str:
    """``text`` wrapped at word boundaries to ``width`` columns, later lines indented."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width, subsequent_indent=indent,
                                    break_on_hyphens=False)) or text  # fmt: skip


def table(rows: list[list[Any]], header: list[str], indent: str = "", width: int = WIDTH) -> str:
    """A plain left-aligned text table within ``width`` columns: while it is wider, the widest
    column narrows by one and its cells wrap onto continuation lines."""
    import textwrap

    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    while len(indent) + sum(widths) + 2 * (len(widths) - 1) > width:
        i = max(range(len(widths)), key=lambda j: (widths[j], j))
        if widths[i] <= _MIN_COLUMN:
            break  # nothing narrower is readable: let it overflow
        widths[i] -= 1
    lines = []
    for r in cells:
        wrapped = [textwrap.wrap(c, w, break_on_hyphens=False) or [""]
                   for c, w in zip(r, widths, strict=True)]  # fmt: skip
        for k in range(max(map(len, wrapped))):
            parts = [(col[k] if k < len(col) else "").ljust(w)
                     for col, w in zip(wrapped, widths, strict=True)]  # fmt: skip
            lines.append((indent + "  ".join(parts)).rstrip())
    return "\n".join(lines)
