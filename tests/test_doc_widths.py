"""docs/terminal-widths.md shows each table command at 80 and at 120 columns, and no captured line is
wider than the width its heading names (issue 30: every table fits the terminal).

The captures are real outputs pasted in; this test holds the page to its own claim, so a capture
replaced by a wider one (say, after a column is added) fails here until the command folds again.
"""

from __future__ import annotations

import re

from tests.common import ROOT

PAGE = ROOT / "docs" / "terminal-widths.md"
COMMANDS = ("demo", "simulate", "jobs", "status")
WIDTHS = (80, 120)
_HEADING = re.compile(r"^## `(?P<command>[a-z]+)` at (?P<width>\d+) columns$")


def captured_blocks(text: str) -> dict[tuple[str, int], list[str]]:
    """Each heading's ``text`` block, keyed by (command, width); the lines between its fences."""
    blocks: dict[tuple[str, int], list[str]] = {}
    key: tuple[str, int] | None = None
    lines: list[str] | None = None
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading:
            key = (heading["command"], int(heading["width"]))
        elif line == "```text" and key is not None:
            lines = []
        elif line == "```" and lines is not None and key is not None:
            blocks[key] = lines
            key, lines = None, None
        elif lines is not None:
            lines.append(line)
    return blocks


def test_every_command_is_captured_at_both_widths() -> None:
    blocks = captured_blocks(PAGE.read_text(encoding="utf-8"))
    assert set(blocks) == {(c, w) for c in COMMANDS for w in WIDTHS}
    assert all(len(lines) >= 5 for lines in blocks.values())


def test_no_captured_line_is_wider_than_its_width() -> None:
    for (command, width), lines in captured_blocks(PAGE.read_text(encoding="utf-8")).items():
        wide = [line for line in lines if len(line) > width]
        assert not wide, f"{command} at {width} columns: {len(wide)} lines wider, first {wide[0]!r}"


def test_the_check_catches_a_wide_line() -> None:
    page = "## `jobs` at 80 columns\n\n```text\n" + "x" * 81 + "\n```\n"
    ((key, lines),) = captured_blocks(page).items()
    assert key == ("jobs", 80) and len(lines[0]) > 80
