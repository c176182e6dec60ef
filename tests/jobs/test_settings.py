"""Per-row generation settings (processor/jobs/settings.py): the job-wide object, a row's column over
it field by field, one structured-output constraint, extra merged by key, and every mistake named."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from processor.jobs.settings import (
    _PARSERS,
    SETTINGS_KEYS,
    RowSettings,
    SettingsError,
    load_job_settings,
    merge_settings,
    parse_settings,
    row_settings,
    settings_cell,
)
from processor.wire.request import GenerationRequest


def test_every_request_field_and_max_tokens_is_a_setting_with_a_parser() -> None:
    assert {f.name for f in fields(GenerationRequest)} | {"max_tokens"} == SETTINGS_KEYS
    assert set(_PARSERS) == SETTINGS_KEYS


def test_a_full_settings_object_becomes_a_request_and_a_budget() -> None:
    got = row_settings(
        parse_settings(
            {
                "adapter": "tenant-a",
                "priority": 2,
                "temperature": 0,
                "top_p": 0.9,
                "top_k": 40,
                "seed": 2**40,
                "stop": "\n\n",
                "stop_token_ids": [2, 7],
                "logprobs": 3,
                "json_schema": {"type": "object", "properties": {"b": {}, "a": {}}},
                "extra": '{"repetition_penalty": 1.1}',
                "max_tokens": 64,
            }
        )
    )
    assert got == RowSettings(
        GenerationRequest(
            adapter="tenant-a",
            priority=2,
            temperature=0.0,
            top_p=0.9,
            top_k=40,
            seed=2**40,
            stop=("\n\n",),
            stop_token_ids=(2, 7),
            logprobs=3,
            json_schema='{"type":"object","properties":{"b":{},"a":{}}}',  # property order kept
            extra='{"repetition_penalty":1.1}',
        ),
        64,
    )


def test_no_settings_is_no_request_and_max_tokens_alone_is_only_a_budget() -> None:
    assert row_settings({}) == RowSettings(None, None)
    assert row_settings(parse_settings({"max_tokens": 5, "temperature": None})) == RowSettings(None, 5)


def test_a_row_overrides_the_job_field_by_field_with_one_constraint_and_merged_extra() -> None:
    job = parse_settings(
        {"temperature": 0.7, "seed": 1, "json_schema": {"type": "object"}, "extra": {"a": 1, "b": 2}}
    )
    row = parse_settings({"seed": 9, "choices": ["yes", "no"], "extra": {"b": 3}})
    merged = merge_settings(job, row)
    assert merged == {
        "temperature": 0.7,
        "seed": 9,
        "choices": ("yes", "no"),
        "extra": '{"a":1,"b":3}',
    }
    request = row_settings(merged).request
    assert request is not None and request.constraint == ("choices", ("yes", "no"))
    assert merge_settings(job, {}) == job


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"temprature": 0}, "unknown setting(s) temprature"),
        ([1], "settings must be a JSON object, not an array"),
        ({"temperature": "hot"}, "temperature must be a number, not a string"),
        ({"seed": True}, "seed must be an integer, not a boolean"),
        ({"top_k": 2**31}, "top_k 2147483648 is out of range"),
        ({"max_tokens": -1}, "max_tokens -1 is out of range"),
        ({"stop": [1]}, "stop must be an array of strings"),
        ({"stop_token_ids": [-1]}, "stop_token_ids -1 is out of range"),
        ({"json_schema": "[1]"}, "json_schema must be a JSON object, not an array"),
        ({"json_schema": "{not json"}, "json_schema must be a JSON object or its JSON text"),
        ({"choices": "yes"}, "choices must be an array of strings"),
    ],
)
def test_a_malformed_setting_is_refused_with_its_key(value: Any, message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        parse_settings(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"temperature": -1}, "temperature -1.0 is not a number >= 0"),
        ({"top_p": 0}, "top_p 0.0 is not in"),
        ({"json_schema": {}, "regex": "a+"}, "more than one structured-output constraint"),
        ({"stop": [""]}, "an empty stop string"),
        ({"adapter": "a@b"}, "contains '@'"),
    ],
)
def test_a_request_the_wire_refuses_is_refused_with_request_problem_s_reason(
    value: Any, message: str
) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        row_settings(parse_settings(value))


def test_a_cell_is_an_object_its_json_text_or_empty() -> None:
    assert settings_cell(None) == {} and settings_cell("") == {}
    assert settings_cell('{"seed": 3}') == {"seed": 3} == settings_cell({"seed": 3})
    with pytest.raises(SettingsError, match="request column: not JSON"):
        settings_cell("{seed: 3}")


def test_the_job_wide_object_comes_from_json_or_a_file(tmp_path: Path) -> None:
    f = tmp_path / "settings.json"
    f.write_text(json.dumps({"temperature": 0, "max_tokens": 8}))
    assert load_job_settings(f"@{f}") == load_job_settings('{"temperature": 0, "max_tokens": 8}')
    with pytest.raises(SettingsError, match=r"--request .*settings.json: unknown setting\(s\) x"):
        f.write_text('{"x": 1}')
        load_job_settings(f"@{f}")
    with pytest.raises(SettingsError, match="--request: not JSON"):
        load_job_settings("temperature=0")
    with pytest.raises(SettingsError, match="No such file"):
        load_job_settings(f"@{tmp_path / 'absent.json'}")
