"""The code in README.md and docs/*.md works, so a page cannot show a module, function or import that is gone.

* Every ```` ```python ```` block runs, in a process of its own, from the repository root (a page may
  open ``schemas/...``), and must exit 0 within ``RUN_TIMEOUT_S``.
* A block that cannot run here opts out with an HTML comment on the line right before its fence,
  naming a mode and saying why (the comment does not show on the rendered page)::

      <!-- doc-snippet: compile-only: produces to a Kafka broker -->

  ``compile-only``: a program that needs a broker or a cluster. It is compiled, every ``processor``
  import in it is made and every attribute it reads off a ``processor`` module or class resolved.
  ``listing``: an API listing, signatures rather than Python. Every dotted ``processor.*`` name in it
  resolves, and under a comment line naming a module (``# processor.wire.items``) every name a
  line declares (``encode_batch(...)``, ``HEADERS, FINGERPRINTS``) is in that module.
  At most ``MAX_OPT_OUTS`` blocks may opt out in all: the others run.
* ``python -c "..."`` commands on a page are compiled and resolved as ``compile-only`` blocks.
* Everywhere on a page, in code or prose, a dotted ``processor.*`` name resolves and a path under
  ``processor/`` exists.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from tests.common import ROOT

RUN_TIMEOUT_S = 30
MAX_OPT_OUTS = 6
"""Opted-out blocks allowed over every page; a block that can run should."""
MODES = ("run", "compile-only", "listing")

_FENCE = re.compile(r"^```python\s*$")
_MARKER = re.compile(r"^<!--\s*doc-snippet:\s*([\w-]+)\s*:\s*(.*?)\s*-->\s*$")
_PYTHON_C = re.compile(r"python3? -c (['\"])(.+?)\1", re.S)
_DOTTED = re.compile(r"(?<![\w/.-])processor(?:\.[A-Za-z_]\w*)+")
_PATH = re.compile(r"(?<![\w/.-])processor/[\w/.-]*\w")
_HEADING = re.compile(r"^#\s*(processor(?:\.\w+)+)\s*(?::.*)?$")


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    code: str
    mode: str
    reason: str = ""
    command: bool = False
    """A ``python -c`` command, not a block: compiled and resolved, never an opt-out."""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def snippets(page: Path) -> list[Snippet]:
    return snippets_of(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT)))


def snippets_of(text: str, name: str) -> list[Snippet]:
    """A page's ```python blocks (``line``: the fence's) and its ``python -c`` commands."""
    lines = text.split("\n")
    out: list[Snippet] = []
    i = 0
    while i < len(lines):
        if not _FENCE.match(lines[i]):
            i += 1
            continue
        start = i
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        code = "\n".join(lines[start + 1 : i])
        mode, reason = (marker.group(1), marker.group(2)) if marker else ("run", "")
        out.append(Snippet(name, start + 1, code, mode, reason))
        i += 1
    for m in _PYTHON_C.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out.append(Snippet(name, line, m.group(2), "compile-only", "a shell command", command=True))
    return out


ALL = [s for page in pages() for s in snippets(page)]


def resolve(dotted: str) -> str | None:
    """None when ``dotted`` names a module or an attribute reachable from one; else what is missing."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for j in range(i, len(parts)):
            found = _attribute(obj, parts[j])
            if found is None:
                return f"{'.'.join(parts[:j])} has no {parts[j]!r}"
            obj = found
        return None
    return f"no module {parts[0]!r}"


def _attribute(obj: object, name: str) -> object | None:
    """``obj.name``, a submodule of a package included; None when there is none."""
    if hasattr(obj, name):
        return getattr(obj, name)
    if isinstance(obj, ModuleType):
        try:
            return importlib.import_module(f"{obj.__name__}.{name}")
        except ModuleNotFoundError:
            return None
    return None


def unresolved_in_code(code: str) -> list[str]:
    """What a program imports from ``processor`` that does not exist, and what it reads off a
    ``processor`` module or class that is not there (attributes of other values are not followed)."""
    tree = ast.parse(code)
    bound: dict[str, object] = {}
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "processor":
                    continue
                missing = resolve(alias.name)
                if missing:
                    problems.append(f"import {alias.name}: {missing}")
                elif alias.asname:
                    bound[alias.asname] = importlib.import_module(alias.name)
                else:
                    bound["processor"] = importlib.import_module("processor")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "processor":
                continue
            missing = resolve(node.module)
            if missing:
                problems.append(f"from {node.module} import ...: {missing}")
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                found = None if alias.name == "*" else _attribute(module, alias.name)
                if found is None and alias.name != "*":
                    problems.append(f"from {node.module} import {alias.name}: no such name")
                elif found is not None:
                    bound[alias.asname or alias.name] = found
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain: list[str] = []
        root: ast.expr = node
        while isinstance(root, ast.Attribute):
            chain.append(root.attr)
            root = root.value
        if not isinstance(root, ast.Name) or root.id not in bound:
            continue
        obj = bound[root.id]
        for attr in reversed(chain):
            if not isinstance(obj, ModuleType | type):
                break
            found = _attribute(obj, attr)
            if found is None:
                problems.append(f"{root.id}...{attr}: {getattr(obj, '__name__', obj)} has no {attr!r}")
                break
            obj = found
    return problems


def _declared(line: str) -> list[str]:
    """The names a listing line declares: what starts it, and each name after `` / `` or ``, `` at
    the top level (``encode_contract / decode_contract,``); arguments and results are skipped."""
    depth, top = 0, []
    for ch in line.split("#", 1)[0]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0:
            top.append(ch)
    names = []
    for piece in re.split(r"\s/\s|,", "".join(top)):
        m = re.match(r"\s*(?:class\s+)?([A-Za-z_]\w*)", re.split(r"->|=|:", piece, maxsplit=1)[0])
        if m:
            names.append(m.group(1))
    return names


def unresolved_in_listing(code: str) -> list[str]:
    problems = [f"{name}: {missing}" for name in _DOTTED.findall(code) if (missing := resolve(name))]
    module: ModuleType | None = None
    for line in code.split("\n"):
        heading = _HEADING.match(line.strip())
        if heading:
            missing = resolve(heading.group(1))
            module = None if missing else importlib.import_module(heading.group(1))
            continue
        if module is None or not line.strip() or line[0].isspace() or line.startswith("#"):
            continue
        for name in _declared(line):
            if not hasattr(module, name):
                problems.append(f"{module.__name__} has no {name!r} (listed as {line.strip()[:60]!r})")
    return problems


@pytest.mark.parametrize("snippet", ALL, ids=[s.where for s in ALL])
def test_every_python_block_runs_or_says_why_not(snippet: Snippet, tmp_path: Path) -> None:
    assert snippet.mode in MODES, f"{snippet.where}: unknown doc-snippet mode {snippet.mode!r} ({MODES})"
    if snippet.mode == "listing":
        assert unresolved_in_listing(snippet.code) == [], snippet.where
        return
    compile(snippet.code, snippet.where, "exec")
    assert unresolved_in_code(snippet.code) == [], snippet.where
    if snippet.mode == "compile-only":
        return
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert done.returncode == 0, f"{snippet.where} exited {done.returncode}:\n{done.stderr[-3000:]}"


def test_few_blocks_opt_out_and_each_says_why() -> None:
    opted = [s for s in ALL if s.mode != "run" and not s.command]
    assert all(s.reason for s in opted), [s.where for s in opted if not s.reason]
    assert len(opted) <= MAX_OPT_OUTS, "\n".join(f"{s.where}: {s.mode}: {s.reason}" for s in opted)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_processor_name_and_path_a_page_gives_exists(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = [f"{name}: {why}" for name in sorted(set(_DOTTED.findall(text))) if (why := resolve(name))]
    missing += [path for path in sorted(set(_PATH.findall(text))) if not (ROOT / path).exists()]
    assert missing == []


# -- the checker itself: it must catch what it is for ------------------------------------------------


def test_the_checker_catches_a_gone_module_a_gone_name_and_a_gone_attribute() -> None:
    assert unresolved_in_code("from processor.wire.items import encode_token_item") == []
    assert unresolved_in_code("from processor import codec")  # the module that went (issue 24)
    assert unresolved_in_code("from processor.wire.items import encode_everything")
    assert unresolved_in_code("import processor.wire.schemas as s\nprint(s.NO_SUCH_TABLE)")
    assert unresolved_in_code("from processor.wire import schemas\nschemas.CANONICAL_FORMS['Batch']") == []
    assert unresolved_in_code("from processor.core.item import Item\nItem.no_such_method()")
    assert resolve("processor.core.measures.padding_waste") is None
    assert resolve("processor.core.Lanes")


def test_the_checker_reads_a_listing_under_its_module_headings() -> None:
    good = "# processor.wire.schemas\nschema_of(value) -> str\nHEADERS, FINGERPRINTS, CANONICAL_FORMS\n"
    assert unresolved_in_listing(good) == []
    assert unresolved_in_listing(good + "encode_contract / decode_contract\n")
    assert unresolved_in_listing("x = processor.wire.gone_module.f\n")


def test_a_marker_sets_the_mode_of_the_block_right_after_it_only() -> None:
    page = (
        "<!-- doc-snippet: compile-only: needs a broker -->\n```python\nx = 1\n```\n\n"
        '```python\ny = 2\n```\nor `python -c "import processor"`\n'
    )
    found = [(s.line, s.mode, s.reason) for s in snippets_of(page, "p.md")]
    assert found == [
        (2, "compile-only", "needs a broker"),
        (6, "run", ""),
        (9, "compile-only", "a shell command"),
    ]
