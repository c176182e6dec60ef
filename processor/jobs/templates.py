"""Prompt templates: an ordered list of parts, the cacheable ones first, rendered once per dataset row.

A template is a ``.toml`` or ``.json`` file (docs/jobs.md has the format):

* Cacheable parts are sent verbatim (so a JSON tool schema needs no escaping) and must all come
  before the first non-cacheable part: the shape names a shared *prefix*, and its signature is that
  of the cacheable parts' texts in order (docs/signatures.md).
* Only non-cacheable parts take ``{column}`` placeholders (``{{`` and ``}}`` are literal braces
  there); a per-row value in a cacheable part would give every row its own shape, so something that
  looks like a placeholder in a cacheable part is refused.
* The prompt is the parts' texts joined with nothing in between.

Pure: no Kafka, and no file access except :func:`load_template` reading the file.
"""

from __future__ import annotations

import json
import re
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processor.core.signature import shape_signature


class TemplateError(ValueError):
    """The template file cannot be used; the message names the file and the part."""


class RowError(ValueError):
    """One dataset row cannot be rendered; the message is the reason recorded for that row."""


_PLACEHOLDER_LIKE = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
_PART_KEYS = {"name", "text", "cacheable"}
_TOP_KEYS = {"parts", "model", "output_budget"}


@dataclass(frozen=True, slots=True)
class TemplatePart:
    """One part of a prompt. ``segments`` alternates literal text and column names (non-cacheable)."""

    name: str
    text: str
    cacheable: bool
    segments: tuple[tuple[str, str | None], ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c for _, c in self.segments if c is not None)


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed prompt template; :meth:`render` fills one row, :attr:`shape` is the same for all."""

    source: str
    parts: tuple[TemplatePart, ...]
    model: str | None = None
    output_budget: int | None = None

    @property
    def cacheable_texts(self) -> tuple[str, ...]:
        return tuple(p.text for p in self.parts if p.cacheable)

    @property
    def shape(self) -> int:
        """Signature of the cacheable parts' texts, in order (docs/signatures.md)."""
        return shape_signature(self.cacheable_texts)

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column a row must have, in first-use order."""
        seen: dict[str, None] = {}
        for part in self.parts:
            for column in part.columns:
                seen.setdefault(column, None)
        return tuple(seen)

    def render(self, values: Mapping[str, Any]) -> str:
        """The prompt for one row: the parts joined with nothing in between.

        Raises :class:`RowError` when a column is missing or null: a prompt with a hole in it is
        worse than a reported bad row.
        """
        out: list[str] = []
        for part in self.parts:
            if part.cacheable:
                out.append(part.text)
                continue
            for literal, column in part.segments:
                out.append(literal)
                if column is not None:
                    out.append(_value_text(values, column))
        return "".join(out)


def _value_text(values: Mapping[str, Any], column: str) -> str:
    if column not in values:
        raise RowError(f"missing column {column!r}")
    value = values[column]
    if value is None:
        raise RowError(f"column {column!r} is null")
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, ensure_ascii=False, default=str)


def load_template(path: str | Path) -> Template:
    """Read a ``.toml`` or ``.json`` template file (docs/jobs.md has the format)."""
    p = Path(path)
    try:
        raw_text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(f"template {p}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(raw_text)
        elif p.suffix.lower() == ".toml":
            data = tomllib.loads(raw_text)
        else:
            raise TemplateError(f"template {p}: name it .toml or .json (the format is read from the suffix)")
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TemplateError(f"template {p}: not valid {p.suffix[1:].upper()}: {exc}") from None
    return parse_template(data, str(p))


def parse_template(data: Any, source: str = "<template>") -> Template:
    """Check and parse a template's data (the decoded TOML or JSON)."""
    if not isinstance(data, dict):
        raise TemplateError(f"template {source}: expected a table/object with a 'parts' list")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise TemplateError(
            f"template {source}: unknown key(s) {', '.join(unknown)} (known: parts, model, output_budget)"
        )
    raw_parts = data.get("parts")
    if not isinstance(raw_parts, list) or not raw_parts:
        raise TemplateError(f"template {source}: 'parts' must be a non-empty list of parts")
    parts: list[TemplatePart] = []
    names: set[str] = set()
    first_dynamic: str | None = None
    for n, raw in enumerate(raw_parts):
        part = _parse_part(raw, n, source)
        if part.name in names:
            raise TemplateError(f"template {source}: two parts are named {part.name!r}")
        names.add(part.name)
        if part.cacheable and first_dynamic is not None:
            raise TemplateError(
                f"template {source}: part {part.name!r} is cacheable but follows non-cacheable part "
                f"{first_dynamic!r}; the shape names a shared prefix, so put cacheable parts first"
            )
        if not part.cacheable and first_dynamic is None:
            first_dynamic = part.name
        parts.append(part)
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise TemplateError(f"template {source}: 'model' must be a non-empty string")
    budget = data.get("output_budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise TemplateError(f"template {source}: 'output_budget' must be an integer >= 0")
    return Template(source, tuple(parts), model, budget)


def _parse_part(raw: Any, n: int, source: str) -> TemplatePart:
    where = f"template {source}: part {n + 1}"
    if not isinstance(raw, dict):
        raise TemplateError(f"{where}: expected a table/object with name, text and cacheable")
    unknown = sorted(set(raw) - _PART_KEYS)
    if unknown:
        raise TemplateError(f"{where}: unknown key(s) {', '.join(unknown)} (known: name, text, cacheable)")
    name, text, cacheable = raw.get("name"), raw.get("text"), raw.get("cacheable", False)
    if not isinstance(name, str) or not name:
        raise TemplateError(f"{where}: 'name' must be a non-empty string")
    where = f"template {source}: part {name!r}"
    if not isinstance(text, str):
        raise TemplateError(f"{where}: 'text' must be a string")
    if not isinstance(cacheable, bool):
        raise TemplateError(f"{where}: 'cacheable' must be true or false")
    if cacheable:
        found = _PLACEHOLDER_LIKE.search(text)
        if found:
            raise TemplateError(
                f"{where} is cacheable (sent verbatim, the same for every row) but contains "
                f"{found.group(0)}: move per-row values to a non-cacheable part"
            )
        return TemplatePart(name, text, True)
    return TemplatePart(name, text, False, _segments(text, where))


def _segments(text: str, where: str) -> tuple[tuple[str, str | None], ...]:
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise TemplateError(f"{where}: {exc} (write {{{{ and }}}} for literal braces)") from None
    out: list[tuple[str, str | None]] = []
    for literal, column, spec, conversion in parsed:
        if column is None:
            out.append((literal, None))
            continue
        if not column:
            raise TemplateError(f"{where}: empty placeholder {{}}; name the column, as in {{question}}")
        if spec or conversion:
            raise TemplateError(
                f"{where}: {{{column}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}: "
                "format specs and conversions are not supported; a placeholder is just {column}"
            )
        out.append((literal, column))
    return tuple(out)
