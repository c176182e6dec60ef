"""docs/architecture.md and the README state the layout; these tests hold them to the tree.

The package map names every package and every module in it, the import order drawn in the docs is the
one ``lint-imports`` enforces (pyproject.toml), and nothing is left at the top of ``processor/``.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "processor"
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")


def subpackages() -> list[str]:
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def package_map() -> dict[str, str]:
    """``package -> its row`` from the architecture page's package map table."""
    rows = re.findall(r"^\| `(\w+)/` \| (.+) \|$", ARCHITECTURE, flags=re.M)
    return dict(rows)


def layers_contract() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    return [" | ".join(p.strip().removeprefix("processor.") for p in layer.split("|")) for layer in layers]


def test_the_package_map_names_every_package_and_every_module_in_it() -> None:
    rows = package_map()
    assert sorted(rows) == subpackages()
    for package, row in rows.items():
        modules = sorted(p.stem for p in (PACKAGE / package).glob("*.py") if p.name != "__init__.py")
        named = set(re.findall(r"`(\w+)`", row))
        assert [m for m in modules if m not in named] == [], f"{package}/ modules missing from the map"


def test_nothing_is_left_at_the_top_of_the_package() -> None:
    top = sorted(p.name for p in PACKAGE.iterdir() if p.is_file() and p.suffix == ".py")
    assert top == ["__init__.py", "__main__.py"]


def test_the_import_order_in_the_docs_is_the_enforced_one() -> None:
    order = " > ".join(layers_contract())
    assert order in ARCHITECTURE
    assert order in README


def test_every_package_says_what_it_holds_and_what_it_may_import() -> None:
    for package in subpackages():
        doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text(encoding="utf-8")))
        assert doc, f"{package}/__init__.py has no docstring"
        assert "import" in doc.lower(), f"{package}/__init__.py does not say what it may import"
        assert "Public face" in doc, f"{package}/__init__.py does not name its public face"
