"""``collect --format openai`` (processor/jobs/openai_output.py): the OpenAI batch output and error
files, validated against the format's JSON Schema (tests/jobs/openai_batch.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from processor.jobs.model import RowResult
from processor.jobs.openai_output import (
    batch_line,
    errors_path,
    parse_engine_output,
    request_of_job,
    write_openai,
)
from tests.jobs.helpers import job_record
from tests.jobs.openai_batch import ERROR_LINE, OUTPUT_LINE, validate_files

LOGPROBS = {"content": [{"token": "Hi", "logprob": -0.25, "top_logprobs": []}]}


def _line(custom_id: str, url: str = "/v1/chat/completions", model: str = "small-model") -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": 8}
    if url == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": f"say hi to {custom_id}"}]
    else:
        body["prompt"] = f"say hi to {custom_id}"
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _openai_job(tmp_path: Path) -> tuple[Any, list[dict[str, Any] | None]]:
    lines = [
        _line("chat-plain"),
        _line("chat-logprobs"),
        _line("text-1", "/v1/completions"),
        _line("fails"),
        _line("refused"),
        _line("cancelled"),
        _line("expired"),
        None,  # a line that is not JSON: a bad row without a custom_id
    ]
    data = tmp_path / "batch.jsonl"
    data.write_text("".join((json.dumps(v) if v else "{not json") + "\n" for v in lines))
    job = job_record(data, template="openai-batch:", rows=len(lines), items=len(lines) - 1, model="served")
    return job, lines


def _results() -> list[RowResult]:
    structured = {"text": "Hi there", "finish_reason": "length", "output_tokens": 2, "logprobs": LOGPROBS}
    common: dict[str, Any] = {"input_tokens": 12, "padded_tokens": 16, "completed_ms": 1_767_225_600_123}
    return [
        RowResult(
            row=0, status="ok", output=b"Hello!", output_tokens=3, cached_tokens=8, item_id="job-1:0",
            **common,
        ),
        RowResult(row=1, status="ok", output=json.dumps(structured).encode(), output_tokens=2, **common),
        RowResult(
            row=2, status="ok", output=b"plain text", output_tokens=2, attempt=2, item_id="job-1.r2:2",
            **common,
        ),
        RowResult(row=3, status="failed", reason="engine timed out", **common),
        RowResult(row=4, status="rejected", reason="HTTP 413: prompt too long (not retried)", **common),
        RowResult(row=5, status="cancelled", reason="job cancelled by ops", input_tokens=12),
        RowResult(row=6, status="expired", input_tokens=12),
        RowResult(row=7, status="invalid", reason="not JSON: Expecting property name"),
    ]  # fmt: skip


def test_an_openai_job_gives_valid_output_and_error_files_one_line_per_custom_id(tmp_path: Path) -> None:
    job, lines = _openai_job(tmp_path)
    out, errors = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    rows = list(zip(_results(), lines, strict=True))
    assert write_openai(out, errors, rows, job=job.name, request_of=request_of_job(job)) == (3, 5)
    ok, bad = validate_files(out, errors)
    assert [x["custom_id"] for x in ok] == ["chat-plain", "chat-logprobs", "text-1"]
    assert [x["custom_id"] for x in bad] == ["fails", "refused", "cancelled", "expired", "job-1:7"]

    plain, with_logprobs, text = (x["response"]["body"] for x in ok)
    assert plain["object"] == "chat.completion" and plain["choices"][0]["message"]["content"] == "Hello!"
    assert (plain["choices"][0]["finish_reason"], plain["choices"][0]["logprobs"]) == ("stop", None)
    assert plain["usage"] == {
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    assert (plain["model"], plain["created"]) == ("small-model", 1_767_225_600)  # the line's body.model
    assert with_logprobs["choices"][0]["message"]["content"] == "Hi there"
    assert with_logprobs["choices"][0]["finish_reason"] == "length"
    assert with_logprobs["choices"][0]["logprobs"] == LOGPROBS
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "plain text"
    assert ok[2]["response"]["request_id"] == "job-1.r2:2"  # the attempt that produced it
    assert ok[0]["response"]["request_id"] == "job-1:0" and ok[1]["response"]["request_id"] == "job-1:1"

    by_id = {x["custom_id"]: x for x in bad}
    # no HTTP response: OpenAI's ``error`` ("for requests that failed with a non-HTTP error")
    assert by_id["fails"]["error"] == {"code": "server_error", "message": "engine timed out"}
    assert by_id["fails"]["response"] is None
    # an HTTP error: the response with the server's status and message, and no ``error``
    refused = by_id["refused"]
    assert refused["error"] is None and refused["response"]["status_code"] == 413
    assert refused["response"]["body"]["error"] == {
        "message": "HTTP 413: prompt too long (not retried)",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_request",
    }
    assert by_id["cancelled"]["response"] is None and by_id["cancelled"]["error"]["code"] == "batch_cancelled"
    assert by_id["expired"]["response"] is None and by_id["expired"]["error"]["code"] == "batch_expired"
    assert "window" in by_id["expired"]["error"]["message"]
    assert by_id["job-1:7"]["error"] is None
    assert by_id["job-1:7"]["response"]["body"]["error"]["code"] == "invalid_request"

    # ids are unique and stable: a second write gives the same bytes
    assert len({x["id"] for x in ok + bad}) == 8
    before = out.read_bytes(), errors.read_bytes()
    write_openai(out, errors, rows, job=job.name, request_of=request_of_job(job))
    assert (out.read_bytes(), errors.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.jsonl", "out.errors.jsonl", "out.jsonl"]


def test_a_template_job_uses_item_ids_as_custom_ids_and_the_completions_form(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"review": "fine"}\n')
    job = job_record(data, model="default")
    custom_id, endpoint, model = request_of_job(job)(RowResult(row=0, status="ok"), {"review": "fine"})
    result = RowResult(row=0, status="ok", output=b"positive")
    is_error, line = batch_line(result, custom_id, job=job.name, model=model, endpoint=endpoint)
    assert not is_error and line["custom_id"] == "job-1:0"
    assert request_of_job(job)(RowResult(row=3, status="ok"), {"review": "x"}) == (
        "job-1:3",
        "/v1/completions",
        "default",
    )
    jsonschema.validate(line, OUTPUT_LINE)
    assert line["response"]["body"]["choices"][0]["text"] == "positive"
    assert errors_path(tmp_path / "r.jsonl") == tmp_path / "r.errors.jsonl"


def test_a_duplicate_custom_id_is_written_under_its_item_id_so_each_custom_id_has_one_line(
    tmp_path: Path,
) -> None:
    job, lines = _openai_job(tmp_path)
    results = [
        RowResult(row=0, status="ok", output=b"ran"),
        RowResult(row=1, status="invalid", reason="duplicate custom_id 'chat-plain' (first at row 0)"),
    ]
    values = [lines[0], lines[0]]
    out, errors = tmp_path / "o.jsonl", tmp_path / "e.jsonl"
    write_openai(out, errors, zip(results, values, strict=True), job=job.name, request_of=request_of_job(job))
    ok, bad = validate_files(out, errors)
    assert [x["custom_id"] for x in ok] == ["chat-plain"] and [x["custom_id"] for x in bad] == ["job-1:1"]
    assert "duplicate custom_id 'chat-plain'" in bad[0]["response"]["body"]["error"]["message"]


def test_the_engines_json_form_is_read_only_with_exactly_its_keys() -> None:
    full = {"text": "a", "finish_reason": "stop", "output_tokens": 1, "logprobs": None}
    assert parse_engine_output(json.dumps(full).encode()).text == "a"
    answer = json.dumps({"text": "a", "label": "positive"})  # a model's own JSON answer stays its text
    assert parse_engine_output(answer.encode()).text == answer
    assert parse_engine_output(b"{broken").text == "{broken"
    assert parse_engine_output(b"\xff ok").text == "\ufffd ok"


@pytest.mark.parametrize(
    ("schema", "broken"),
    [
        (
            OUTPUT_LINE,
            {
                "id": "x",
                "custom_id": "c",
                "response": {"status_code": 500, "request_id": "r", "body": {}},
                "error": None,
            },
        ),
        (ERROR_LINE, {"id": "x", "custom_id": "c", "response": None, "error": None}),
        (ERROR_LINE, {"id": "x", "custom_id": "c", "response": None, "error": {"code": "x"}, "extra": 1}),
    ],
)  # fmt: skip
def test_the_schema_refuses_lines_that_are_not_in_the_format(schema: Any, broken: Any) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


@pytest.mark.parametrize(
    ("reason", "status", "error_type"),
    [
        ("HTTP 503: busy (gave up after 3 attempt(s): retries=2 exhausted)", 503, "server_error"),
        ("HTTP 404: The model `x` does not exist. (not retried)", 404, "invalid_request_error"),
    ],
)
def test_a_failed_row_the_server_answered_is_an_http_error_with_its_status(
    reason: str, status: int, error_type: str
) -> None:
    result = RowResult(row=0, status="failed", reason=reason, item_id="j:0")
    is_error, line = batch_line(result, "c", job="j", model="m", endpoint="/v1/completions")
    assert is_error and line["error"] is None
    assert (line["response"]["status_code"], line["response"]["body"]["error"]["type"]) == (
        status,
        error_type,
    )
    assert line["response"]["body"]["error"]["message"] == reason
    jsonschema.validate(line, ERROR_LINE)


def test_an_embeddings_row_is_openais_embeddings_response() -> None:
    vector = [0.6, -0.8, 0.0]
    output = b"".join(struct.pack("<f", x) for x in vector)
    result = RowResult(row=0, status="ok", output=output, input_tokens=5, item_id="e:0")
    is_error, line = batch_line(result, "c", job="e", model="minilm", endpoint="/v1/embeddings")
    assert not is_error
    jsonschema.validate(line, OUTPUT_LINE)
    body = line["response"]["body"]
    assert body["data"] == [{"object": "embedding", "index": 0, "embedding": pytest.approx(vector)}]
    assert (body["model"], body["usage"]) == ("minilm", {"prompt_tokens": 5, "total_tokens": 5})
