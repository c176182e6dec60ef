"""OpenAI batch input lines (processor/jobs/openai_input.py): each body's prompt and settings in
tokenfabric's terms, and every malformed line refused with its reason."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from processor.jobs.model import JobRecord
from processor.jobs.openai_input import (
    CustomIds,
    custom_id_of,
    endpoint_of,
    is_openai_job,
    job_template_field,
    looks_like_openai_batch,
    parse_line,
)
from processor.jobs.settings import row_settings
from processor.jobs.templates import RowError
from processor.wire.request import GenerationRequest
from tests.jobs.helpers import job_record

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def line(url: str = "/v1/chat/completions", custom_id: Any = "req-1", **body: Any) -> dict[str, Any]:
    if url.endswith("chat/completions"):
        body.setdefault("messages", MESSAGES)
    else:
        body.setdefault("prompt", "Say hi")
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "gpt-x", **body}}


def test_a_chat_line_maps_its_body_to_messages_settings_and_budget() -> None:
    got = parse_line(
        line(
            temperature=0,
            seed=7,
            stop="END",
            max_completion_tokens=32,
            max_tokens=99,  # the newer name wins
            logprobs=True,
            top_logprobs=2,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "a", "strict": True, "schema": {"type": "object"}},
            },
            frequency_penalty=0.5,
            user="u1",
        )
    )
    assert (got.custom_id, got.url, got.model, got.messages, got.prompt) == (
        "req-1",
        "/v1/chat/completions",
        "gpt-x",
        MESSAGES,
        None,
    )
    settings = row_settings(got.settings)
    assert settings.output_budget == 32
    assert settings.request == GenerationRequest(
        temperature=0.0,
        seed=7,
        stop=("END",),
        logprobs=2,
        json_schema='{"type":"object"}',
        extra='{"frequency_penalty":0.5,"user":"u1"}',
    )


def test_a_completions_line_takes_a_prompt_text_or_token_ids_and_vllm_s_guided_keys() -> None:
    text = parse_line(line("/v1/completions", prompt=["one prompt"], logprobs=0, guided_choice=["a", "b"]))
    assert (text.prompt, text.prompt_ids, text.messages) == ("one prompt", None, None)
    assert row_settings(text.settings).request == GenerationRequest(logprobs=0, choices=("a", "b"))
    ids = parse_line(line("/v1/completions", prompt=[1, 2, 3], response_format={"type": "json_object"}))
    assert (ids.prompt, ids.prompt_ids) == (None, (1, 2, 3))
    assert row_settings(ids.settings).request == GenerationRequest(json_schema='{"type":"object"}')
    plain = parse_line(line("/v1/completions", logprobs=None, response_format={"type": "text"}))
    assert plain.settings == {} and row_settings(plain.settings).request is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({**line(), "custom_id": None}, "missing custom_id"),
        (line(custom_id=""), "custom_id must be a non-empty string"),
        (line(custom_id=5), "custom_id must be a non-empty string"),
        ({**line(), "method": "GET"}, "method 'GET': the batch API takes POST"),
        ({**line(), "url": "/v1/images"}, "unsupported url '/v1/images'"),
        (line("/v1/embeddings"), "body.prompt: an embeddings line takes encoding_format, input, model, user"),
        ({**line("/v1/embeddings"), "body": {"input": "x", "encoding_format": "base64"}}, "encoding_format"),
        ({**line("/v1/embeddings"), "body": {"model": "e"}}, "body has no input"),
        ({**line("/v1/embeddings"), "body": {"input": ["a", "b"]}}, "body.input must be a string"),
        ({k: v for k, v in line().items() if k != "body"}, "missing body"),
        ({**line(), "body": "text"}, "body must be a JSON object"),
        (line(model=""), "body.model must be a non-empty string"),
        (line(messages=None), "body has no messages"),
        (line(messages=[]), "messages must be a non-empty list"),
        (line(prompt="x"), "body.prompt belongs to /v1/completions"),
        (line("/v1/completions", messages=MESSAGES), "body.messages belong to /v1/chat/completions"),
        (line("/v1/completions", prompt=None), "body has no prompt"),
        (line("/v1/completions", prompt=["a", "b"]), "body.prompt must be a string or a list of token ids"),
        (line("/v1/completions", prompt=[-1]), "token id outside"),
        (line("/v1/completions", prompt=""), "body.prompt is empty"),
        (line(n=2), "body: n=2: a batch row has one result"),
        (line(stream=True), "body: stream"),
        (line(temperature="hot"), "body: temperature must be a number"),
        (line(response_format={"type": "grammar"}), "response_format type 'grammar'"),
        (line(response_format={"type": "json_schema", "json_schema": {}}), "has no 'schema' object"),
    ],
)
def test_a_malformed_line_is_refused_with_its_reason(value: dict[str, Any], reason: str) -> None:
    with pytest.raises(RowError, match=re.escape(reason)):
        parse_line(value)


def test_an_embeddings_line_is_one_input_of_text_or_token_ids() -> None:
    text = parse_line(
        {**line("/v1/embeddings"), "body": {"model": "e", "input": ["a sentence"], "user": "u"}}
    )
    assert (text.url, text.model, text.prompt, text.settings) == ("/v1/embeddings", "e", "a sentence", {})
    ids = parse_line({**line("/v1/embeddings"), "body": {"input": [101, 7, 102], "encoding_format": "float"}})
    assert (ids.prompt, ids.prompt_ids, ids.model) == (None, (101, 7, 102), None)


def test_the_first_line_with_a_custom_id_keeps_it_and_later_ones_are_duplicates() -> None:
    ids = CustomIds()
    ids.claim("a", 0)
    ids.claim("b", 1)
    ids.claim("a", 0)  # the same row read again (submit reads chat and OpenAI inputs twice)
    with pytest.raises(RowError, match=re.escape("duplicate custom_id 'a' (first at row 0)")):
        ids.claim("a", 2)


def test_the_output_side_finds_the_custom_id_and_endpoint_in_the_input_row(tmp_path: Any) -> None:
    values = json.loads(json.dumps(line()))
    assert custom_id_of(values) == "req-1" and endpoint_of(values) == "/v1/chat/completions"
    assert custom_id_of(None) is None and custom_id_of({"custom_id": 3}) is None
    assert endpoint_of({"url": "/v1/embeddings"}) == "/v1/embeddings"
    assert endpoint_of({"url": "/v1/images"}) is None
    assert looks_like_openai_batch(values) and not looks_like_openai_batch({"custom_id": "x", "prompt": "p"})
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    record: JobRecord = job_record(data, template=job_template_field("/m/tokenizer_config.json"))
    assert is_openai_job(record) and record.template == "openai-batch:/m/tokenizer_config.json"
    assert not is_openai_job(job_record(data))
