"""Prompt templates (processor/jobs/templates.py): the shape of the cacheable parts, the same template
from TOML and JSON, and every mistake refused with the part named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from processor.core.signature import shape_signature
from processor.jobs.templates import RowError, TemplateError, load_template, parse_template
from tests.jobs.helpers import EXAMPLES, QUESTION, SYSTEM, TOOLS, template

# ------------------------------------------------------------------------------------------------
# templates


def test_the_shape_is_the_signature_of_the_cacheable_parts_in_order() -> None:
    t = template(SYSTEM, TOOLS, QUESTION)
    assert t.shape == shape_signature([SYSTEM["text"], TOOLS["text"]])
    assert t.columns == ("question",)
    assert t.render({"question": "why?"}) == 'Be brief.\n{"type": "object", "properties": {}}\nQ: why?\nA:'
    assert template(TOOLS, SYSTEM, QUESTION).shape != t.shape


def test_the_example_template_reads_the_same_as_toml_and_json(tmp_path: Path) -> None:
    toml = load_template(EXAMPLES / "sentiment.toml")
    as_json = tmp_path / "sentiment.json"
    as_json.write_text(
        json.dumps(
            {
                "model": toml.model,
                "output_budget": toml.output_budget,
                "parts": [{"name": p.name, "text": p.text, "cacheable": p.cacheable} for p in toml.parts],
            }
        )
    )
    again = load_template(as_json)
    assert (again.shape, again.columns, again.model, again.output_budget) == (
        toml.shape,
        toml.columns,
        "default",
        8,
    )
    assert again.render({"review": "ok"}) == toml.render({"review": "ok"})


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([QUESTION, SYSTEM], "is cacheable but follows non-cacheable part 'q'"),
        ([{"name": "s", "text": "Hi {name}", "cacheable": True}], "contains {name}"),
        ([{"name": "q", "text": "{n:>5}"}], "format specs and conversions are not supported"),
        ([{"name": "q", "text": "{}"}], "empty placeholder"),
        ([{"name": "q", "text": "a { b"}], "literal braces"),
        ([{"name": "q", "text": "x", "cachable": True}], "unknown key(s) cachable"),
        ([QUESTION, QUESTION], "two parts are named 'q'"),
        ([{"name": "q", "text": "x", "cacheable": "yes"}], "'cacheable' must be true or false"),
        ([], "non-empty list"),
    ],
)
def test_template_mistakes_are_refused_with_the_part_named(parts: list[Any], message: str) -> None:
    with pytest.raises(TemplateError, match=None) as exc:
        parse_template({"parts": parts}, "t.toml")
    assert message in str(exc.value)
    assert str(exc.value).startswith("template t.toml")


def test_template_files_need_a_known_suffix_and_valid_syntax(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("parts: []")
    (tmp_path / "t.toml").write_text("[[parts]\n")
    with pytest.raises(TemplateError, match=r"name it \.toml or \.json"):
        load_template(tmp_path / "t.yaml")
    with pytest.raises(TemplateError, match="not valid TOML"):
        load_template(tmp_path / "t.toml")
    with pytest.raises(TemplateError, match="No such file"):
        load_template(tmp_path / "missing.toml")


def test_rendering_refuses_missing_and_null_columns_and_writes_other_values_plainly() -> None:
    t = template(SYSTEM, {"name": "q", "text": "{a}|{b}|{c}|{{literal}}"})
    assert (
        t.render({"a": 3, "b": 1.5, "c": {"k": [True, None]}})
        == 'Be brief.\n3|1.5|{"k": [true, null]}|{literal}'
    )
    with pytest.raises(RowError, match="missing column 'b'"):
        t.render({"a": 1, "c": 2})
    with pytest.raises(RowError, match="column 'a' is null"):
        t.render({"a": None, "b": 1, "c": 2})
