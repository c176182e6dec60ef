"""docs/library.md holds to the code: its example is examples/library/embed.py and runs as shown, and
the public names it lists are exactly ``processor.core.__all__``."""

from __future__ import annotations

import re
import subprocess
import sys

import processor.core
from tests.common import ROOT

PAGE = (ROOT / "docs" / "library.md").read_text(encoding="utf-8")
EXAMPLE = ROOT / "examples" / "library" / "embed.py"


def _blocks(info: str) -> list[str]:
    """The text of the page's fenced blocks whose opening fence is ```` ```info ````."""
    out: list[str] = []
    block: list[str] | None = None
    opened = ""
    for line in PAGE.split("\n"):
        if block is None and line.startswith("```"):
            block, opened = [], line[3:]
        elif block is not None and line == "```":
            if opened == info:
                out.append("".join(f"{text}\n" for text in block))
            block = None
        elif block is not None:
            block.append(line)
    return out


def test_the_page_shows_the_example_file_whole() -> None:
    assert _blocks("python") == [EXAMPLE.read_text(encoding="utf-8")]


def test_the_example_runs_and_prints_what_the_page_shows() -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    shown = next(b for b in _blocks("") if b.startswith("$ python examples/library/embed.py\n"))
    assert run.stdout == shown.split("\n", 1)[1]


def test_the_page_lists_exactly_the_public_names() -> None:
    listed = re.search(r"<!-- public-names -->(.*?)<!-- /public-names -->", PAGE, flags=re.S)
    assert listed is not None
    assert re.findall(r"`(\w+)`", listed.group(1)) == list(processor.core.__all__)


def test_every_public_name_is_defined_in_the_core() -> None:
    for name in processor.core.__all__:
        value = getattr(processor.core, name)
        assert value.__module__.startswith("processor.core."), name
