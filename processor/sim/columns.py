"""Plain-text tables that fit the terminal: the simulator's report and ``tokenfabric jobs``.

Plain columns, not a drawn table: a pipe, a log or a script gets every cell whole. When the whole
table is wider than the terminal it is printed in parts, each repeating the first column (the row's
name) beside the next columns that fit, parts separated by a blank line; a first column wider than
the terminal makes its lines wider, never cut.
"""

from __future__ import annotations

from collections.abc import Sequence

Row = Sequence[str]


def aligned(rows: Sequence[Row], left: Sequence[int]) -> list[str]:
    """Columns two spaces apart: those in ``left`` flush left, the others (figures) flush right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]


def fitted(rows: Sequence[Row], width: int, left: Sequence[int] = (0,)) -> list[str]:
    """:func:`aligned` in as few parts as fit ``width`` (module docstring)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    parts: list[list[int]] = [[0]]
    for col in range(1, len(widths)):
        used = sum(widths[c] + 2 for c in parts[-1])
        if len(parts[-1]) > 1 and used + widths[col] > width:
            parts.append([0])
        parts[-1].append(col)
    out: list[str] = []
    for part in parts:
        if out:
            out.append("")
        out += aligned([[r[c] for c in part] for r in rows], [part.index(c) for c in part if c in left])
    return out


def folded(text: str, width: int, first: str = "", indent: int = 2) -> str:
    """``first`` and ``text`` folded at word boundaries to ``width`` (at least 40), later lines
    indented ``indent`` spaces: a long line of a command's output fits the terminal, words whole."""
    import textwrap

    return textwrap.fill(
        text,
        max(40, width),
        initial_indent=first,
        subsequent_indent=" " * indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
